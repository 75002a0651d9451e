"""Paired comparisons through the real CPU trainer: algorithms differ in nothing but the algorithm.

Two algorithms whose masks happen to drop nothing must give the same numbers, step for step and bit
for bit: same rollouts (the seeded sampler, docs/reproducibility.md), same objective (one registered
loss), same trainer. A difference in anything but the mask (a second loss code path, an unseeded
sampler, a different trainer branch) fails these tests.

Here: STAPO that silences nothing against the suite's shared GRPO run. The other pair, 20-Entropy
keeping every token against JustRL, is the sweep's own grid (tests/bench/test_sweep_e2e.py), two
seeds of it, compared the same way.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.cpu_runs import Run
from tests.e2e.test_reproducible import rollouts_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

STEPS = 2
# keys that measure the machine, not the algorithm; and the mask's own diagnostics, which only
# one of the two runs has
NOT_COMPARED = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/", "actor/stapo/")


def compared(steps: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """Each step's metrics without the keys in ``NOT_COMPARED``."""
    return {step: {k: v for k, v in m.items() if not k.startswith(NOT_COMPARED)} for step, m in steps.items()}


def algorithm_metrics(run: Run) -> dict[int, dict[str, float]]:
    assert run.returncode == 0, run.log[-6000:]
    assert sorted(run.steps) == list(range(1, STEPS + 1)), run.log[-3000:]
    return compared(run.steps)


def test_stapo_that_silences_nothing_is_grpo(grpo_run, silent_stapo_train_run):
    """algo=stapo with a tau_p no token is below, and grpo's clip and KL, equals algo=grpo exactly: every
    metric at every step and verl's rollout dump of every step (prompts, responses, scores).

    algo=grpo is the suite's shared GRPO run (tests/e2e/shared_runs.py: 2 steps, no checkpoint, a
    rollout dump, the CPU back-end switched on by the driver instead of the preset's runtime env).
    This is also the suite's proof that two launches of one configuration give the same numbers: two
    processes that differ in a mask which removes nothing agree bit for bit (the same config launched
    twice used to be a run of its own in tests/e2e/test_reproducible.py).

    The STAPO run is the shared ``silent_stapo_train_run``, started as a user starts it, through `stapo train` in
    a folder of its own (tests/demo/test_train_command.py reads its console): the command composes, checks and
    passes on the same overrides, and its run writes the same numbers as the recipe's entry run directly.

    The STAPO run also validates after step 1, at verl's val_kwargs and at the paper's second decoding
    (``stapo.val_decodings=[T0.7]``), which the GRPO run does not: the validation passes change no training
    number and no rollout of step 2, and the second pass samples other texts from the same problems (its own
    dump folder), logged under its own names.

    And the STAPO run builds its agent loops as verl does, once a request (verl's own agent-loop manager), and
    scores and routes each request through verl's reward-loop actor and load balancer, where the GRPO run builds
    each once a worker, scores in the worker and sends requests straight to the one server (the recipe's
    stapo/verl_plugin/training/shared_agent_loops.py with the CPU presets' stapo.reward_in_agent_loop and
    stapo.one_server_direct): the same rollouts and rewards, bit for bit."""
    assert grpo_run.overrides[:3] == ["algo=grpo", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1"]
    grpo = grpo_run.run
    stapo_run = silent_stapo_train_run
    assert stapo_run.overrides[1:4] == ["algo=stapo", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1"]
    for setting in ("actor_rollout_ref.actor.policy_loss.tau_p=1e-30", "actor_rollout_ref.actor.clip_ratio_high=0.2",
                    "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
                    "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "trainer.test_freq=1",
                    "stapo.val_decodings=[T0.7]", "actor_rollout_ref.rollout.agent.agent_loop_manager_class=null",
                    "reward.num_workers=1"):  # verl's reward-loop actor, which the CPU presets leave out
        assert setting in stapo_run.overrides, setting
    stapo = stapo_run.run
    validated = {step: {k for k in stapo.steps[step] if k.startswith("val")} for step in stapo.steps}
    for step in (1, 2):
        assert "val/average/acc" in validated[step] and "val@T0.7/average/acc" in validated[step], sorted(validated)
        assert {k for k in validated[step] if "@T0.7" not in k} == {
            k.replace("@T0.7", "", 1) for k in validated[step] if "@T0.7" in k}
    first = validation_dump(stapo_run.validations, 1)
    second = validation_dump(stapo_run.validations / "T0.7", 1)
    assert [prompt for prompt, _ in first] == [prompt for prompt, _ in second] and len(first) == 32
    assert sum(a != b for (_, a), (_, b) in zip(first, second)) > 0
    assert all(stapo.steps[s]["actor/stapo/num_candidates"] == 0 for s in stapo.steps)
    assert all(stapo.steps[s]["actor/stapo/num_spurious"] == 0 for s in stapo.steps)
    expected = algorithm_metrics(grpo)
    got = {step: {k: v for k, v in m.items() if k not in validated[step]}
           for step, m in algorithm_metrics(stapo).items()}
    assert "actor/kl_loss" in got[1] and "actor/pg_loss" in got[1]
    assert len(got[1]) > 40, sorted(got[1])  # the whole metric set, not a parsing accident
    assert grpo.steps[1]["actor/grad_norm"] > 0  # a real update between the steps: step 2 checks it too
    for step in expected:
        assert got[step] == expected[step], metric_diff(expected[step], got[step])
        assert rollouts_of(stapo_run.rollouts, step) == rollouts_of(grpo_run.rollouts, step), step


def validation_dump(folder, step: int) -> list[tuple[str, str]]:
    """verl's validation dump of one step (trainer.validation_data_dir), as (prompt, response) by prompt and sample
    (the uids are fresh each pass; a key ends in _<sample>_<output>)."""
    rows = [json.loads(line) for line in (folder / f"{step}.jsonl").read_text().splitlines()]
    rows.sort(key=lambda row: (row["input"], row["uid"].rsplit("_", 2)[1:]))
    return [(row["input"], row["output"]) for row in rows]


def metric_diff(expected: dict, got: dict) -> str:
    keys = sorted(set(expected) | set(got))
    rows = [f"{k}: {expected.get(k)} != {got.get(k)}" for k in keys if expected.get(k) != got.get(k)]
    return "\n".join(rows[:40])
