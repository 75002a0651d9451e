"""The GPU-preset parity run (tests/e2e/test_gpu_preset_parity.py) stays the GPU user's configuration.

Every key on which the run differs from a GPU preset must be listed, with its reason, in tests/e2e/gpu_parity.py
(``CPU_CHANGES``: changed for the CPU; ``PRESETS_DISAGREE``: the GPU presets set different values among
themselves). A key a GPU preset gains is inherited by the run (it composes the preset) or, if the run's value
differs, fails here until it is listed. Real Hydra composition of the recipe (``stapo.check.compose_run``).
"""

from __future__ import annotations

import functools

import pytest
from omegaconf import OmegaConf

from stapo.check import compose_run
from tests.e2e.gpu_parity import (
    CPU_CHANGES,
    HARNESS_KEYS,
    PRESETS_DISAGREE,
    START,
    gpu_presets,
    leaves,
    override_of,
    parity_overrides,
    preset_keys,
)

pytestmark = pytest.mark.timeout(300)  # five Hydra compositions: about a minute on a loaded 2-core machine
_ABSENT = "<absent>"


@functools.cache
def _composed(overrides: tuple[str, ...]) -> tuple[dict, dict]:
    config = compose_run(list(overrides))
    as_written = dict(leaves(OmegaConf.to_container(config, resolve=False)))
    return dict(leaves(OmegaConf.to_container(config, resolve=True))), as_written


def resolved(overrides: tuple[str, ...]) -> dict:
    """Every leaf of the composed recipe config, interpolations resolved (each config composed once)."""
    return _composed(overrides)[0]


def raw(overrides: tuple[str, ...]) -> dict:
    """Every leaf of the composed recipe config, interpolations as written."""
    return _composed(overrides)[1]


@functools.cache
def parity() -> tuple[str, ...]:
    return tuple(parity_overrides(compose_run([f"model_preset={START}"])))


def test_the_gpu_presets_are_found():
    # the guard below must see every GPU preset; a new one is picked up by trainer.device: cuda
    assert {"qwen3_0p6b_smoke", "qwen3_1p7b", "qwen3_8b", "qwen3_14b"} <= set(gpu_presets())
    assert START in gpu_presets()


def test_every_reason_is_given_once():
    assert not set(CPU_CHANGES) & set(PRESETS_DISAGREE)
    for key, change in CPU_CHANGES.items():
        assert len(change.reason) > 10, key
    assert all(len(reason) > 5 for reason in PRESETS_DISAGREE.values())


def test_the_run_differs_from_its_preset_only_where_listed():
    """Against the preset it composes: every differing leaf is a listed change (or follows one by the same
    interpolation, e.g. verl's rollout.prompt_length from data.max_prompt_length), and every listed change is
    really made."""
    start, run = resolved((f"model_preset={START}",)), resolved(parity())
    start_raw, run_raw = raw((f"model_preset={START}",)), raw(parity())
    unlisted = []
    for key in sorted(set(start) | set(run)):
        if start.get(key, _ABSENT) == run.get(key, _ABSENT) or key in CPU_CHANGES:
            continue
        same_expression = key in start_raw and start_raw[key] == run_raw.get(key) and "${" in str(start_raw[key])
        parent_listed = any(key.startswith(changed + ".") or changed.startswith(key + ".") for changed in CPU_CHANGES)
        if not (same_expression or parent_listed):
            unlisted.append(f"{key}: {start.get(key, _ABSENT)!r} -> {run.get(key, _ABSENT)!r}")
    assert not unlisted, "the parity run differs from the preset on unlisted keys: " + "; ".join(unlisted)
    for key, change in CPU_CHANGES.items():
        assert key in run, key
        if not isinstance(change.value, str) or "${" not in change.value:
            assert run[key] == change.value, (key, run[key], change.value)


def drifted(keys, composed: dict, run: dict, listed) -> list[str]:
    """The keys a preset sets whose value the run does not mirror and that are not listed."""
    found = []
    for key in keys:
        if key in listed or key in HARNESS_KEYS:
            continue
        if composed.get(key, _ABSENT) != run.get(key, _ABSENT):
            found.append(f"{key}: the preset has {composed.get(key, _ABSENT)!r}, the run {run.get(key, _ABSENT)!r}")
    return found


@pytest.mark.parametrize("preset", gpu_presets())
def test_every_key_a_gpu_preset_sets_is_mirrored_or_listed(preset):
    """The drift guard: a key a GPU preset file sets (its own or its defaults') has the preset's value in the
    parity run, or is listed with the reason it differs."""
    found = drifted(preset_keys(preset), resolved((f"model_preset={preset}",)), resolved(parity()),
                    {*CPU_CHANGES, *PRESETS_DISAGREE})
    assert not found, (
        f"{preset}: keys neither mirrored nor listed in tests/e2e/gpu_parity.py (mirror them, or list them in "
        "CPU_CHANGES or PRESETS_DISAGREE with the reason): " + "; ".join(found)
    )


def test_every_listed_key_differs_from_some_gpu_preset():
    """No stale entry: a listed key that every GPU preset sets to the run's value is no difference."""
    run = resolved(parity())
    for key in [*CPU_CHANGES, *PRESETS_DISAGREE]:
        values = {repr(resolved((f"model_preset={p}",)).get(key, _ABSENT)) for p in gpu_presets()}
        assert values != {repr(run.get(key, _ABSENT))}, f"{key} is listed but equals every GPU preset's value"


def test_the_guard_fails_on_a_key_neither_mirrored_nor_listed():
    """A preset key the run changes without listing it is reported (here: one listed change left out), and a
    key the preset gains that the run inherits is not."""
    composed, run = resolved((f"model_preset={START}",)), resolved(parity())
    keys = preset_keys(START)
    listed = {*CPU_CHANGES, *PRESETS_DISAGREE} - {"data.train_batch_size"}
    assert [line.split(":")[0] for line in drifted(keys, composed, run, listed)] == ["data.train_batch_size"]
    gained = {**keys, "actor_rollout_ref.actor.clip_ratio_c": 10.0}  # inherited: same value in both
    assert drifted(gained, composed, run, {*CPU_CHANGES, *PRESETS_DISAGREE}) == []
    assert drifted({"actor_rollout_ref.actor.clip_ratio_c": 3.0}, {"actor_rollout_ref.actor.clip_ratio_c": 3.0},
                   run, set()) != []


def test_overrides_are_spelt_for_hydra():
    assert override_of("a.b", True, False) == "+a.b=true"
    assert override_of("a.b", ["console"], True) == "a.b=[console]"
    assert override_of("a.b", "${x.y}", True) == "a.b='${x.y}'"
    assert override_of("a.b", "1", True) == "a.b='1'" and override_of("a.b", 1, True) == "a.b=1"


def test_the_seeded_rollouts_switch_keeps_verls_agent_loop_and_replay_order():
    """``stapo.seeded_rollouts=false`` (the parity run's one change that is not a CPU limit) leaves verl's loop and
    replay order in place; the default pins them; a value that is not a boolean is refused in one line.
    (Belongs beside tests/unit/test_replay_order.py, which tests the pinning itself.)"""
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME, pin_reproducibility

    def config(**stapo):
        return OmegaConf.create({"stapo": stapo, "actor_rollout_ref": {"rollout": {"agent": {
            "default_agent_loop": "single_turn_agent"}}}, "trainer": {"v1": {"sampler": {"custom_sampler": {}}}}})

    kept = config(seeded_rollouts=False)
    assert pin_reproducibility(kept) == []
    assert kept.actor_rollout_ref.rollout.agent.default_agent_loop == "single_turn_agent"
    assert not kept.trainer.v1.sampler.custom_sampler
    pinned = config(seeded_rollouts=True)
    assert len(pin_reproducibility(pinned)) == 2
    assert pinned.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_LOOP_NAME
    with pytest.raises(STAPOConfigError, match="stapo.seeded_rollouts must be true or false"):
        pin_reproducibility(config(seeded_rollouts="no"))
