"""The token-mask registry against the float64 loop references of tests/reference.py.

Every entry of ``TOKEN_MASK_REGISTRY`` is checked, on fresh random inputs with ties, empty candidate
sets, empty rows and non-finite values: ``build_token_mask`` must give the reference's
``drop_response``, ``drop_count``, counts and statistics. An entry without a reference in
``tests.reference.REFERENCES`` fails here, so a new mask cannot land untested.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from stapo.algorithm.masks import (
    TOKEN_MASK_REGISTRY,
    MaskInputs,
    MaskSettings,
    TokenMask,
    build_token_mask,
    finalize_metrics,
    get_token_mask,
    register_token_mask,
)
from stapo.algorithm.validation import STAPOConfigError
from tests.reference import REFERENCES

NAN, INF = float("nan"), float("inf")
# float values torch sums (or exponentiates) in another order than the loop: equal to rounding; counts exactly
FLOAT_VALUES = ("grad_bound", "weight_sum", "min_weight")


def mask_inputs(seed: int, case: str, rows: int = 10, cols: int = 24) -> dict[str, torch.Tensor]:
    """Fresh float64 inputs: many sub-tau_p tokens, ragged rows, one empty row, a zero-advantage row."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(rows, cols, generator=g, dtype=torch.float64) < 0.35
    log_prob = torch.where(
        low,
        torch.empty(rows, cols, dtype=torch.float64).uniform_(math.log(1e-6), math.log(0.002), generator=g),
        torch.empty(rows, cols, dtype=torch.float64).uniform_(math.log(0.002), 0.0, generator=g),
    )
    entropy = torch.rand(rows, cols, generator=g, dtype=torch.float64) * 4
    sign = torch.tensor([1.0 if i % 3 else -1.0 for i in range(rows)], dtype=torch.float64)
    row_adv = sign * (0.1 + torch.rand(rows, generator=g, dtype=torch.float64))
    row_adv[0] = 0.0  # a group with one reward
    advantages = row_adv.unsqueeze(-1).expand(rows, cols).clone()
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    lengths[1] = 0  # an empty response
    response_mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(-1)
    if case == "ties":  # few distinct entropies: thresholds land on ties
        entropy = torch.round(entropy * 2) / 2
    elif case == "no_candidates":
        log_prob = log_prob.clamp(min=math.log(0.01))
    elif case == "all_masked":
        response_mask = torch.zeros_like(response_mask)
    elif case == "nonfinite":
        entropy[2, :4], entropy[3, 0], entropy[4, 1] = NAN, INF, -INF
        log_prob[5, 0], log_prob[5, 1] = -INF, NAN
        advantages[7, 2] = NAN
    elif case == "all_entropy_nan":
        entropy = torch.full_like(entropy, NAN)
    elif case == "per_row_advantages":
        advantages = row_adv
    return {"response_mask": response_mask, "advantages": advantages, "log_prob": log_prob, "entropy": entropy}


CASES = ["random", "ties", "no_candidates", "all_masked", "nonfinite", "all_entropy_nan", "per_row_advantages"]
SETTINGS = [
    {},
    {"tau_p": 0.01, "entropy_quantile": 0.5, "entropy_top_fraction": 0.35, "entropy_denominator": "kept"},
    {"entropy_quantile": 1.0, "entropy_top_fraction": 1.0},
]


def reference_for(name: str):
    if name not in REFERENCES:
        pytest.fail(
            f"token mask {name!r} is registered but tests/reference.py has no loop reference for it: add one to "
            "REFERENCES (an independent float64 loop written from the algorithm's definition)"
        )
    return REFERENCES[name]


def same(a: float, b: float, rel: float = 0.0) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == pytest.approx(b, rel=rel, abs=0.0) if rel else a == b


def assert_matches_reference(built: TokenMask, expected: dict) -> None:
    assert built.drop_response.dtype == torch.bool and built.drop_count.dtype == torch.bool
    assert built.drop_response.tolist() == expected["drop_response"]
    assert built.drop_count.tolist() == expected["drop_count"]
    assert sorted(built.counts) == sorted(expected["counts"])
    for key, value in expected["counts"].items():
        assert same(built.counts[key], value, rel=1e-12 if key.startswith(FLOAT_VALUES) else 0.0), key
    assert sorted(built.stats) == sorted(expected["stats"])
    for key, value in expected["stats"].items():
        assert same(built.stats[key], value, rel=1e-12 if key.startswith(FLOAT_VALUES) else 0.0), key
    if expected["weight"] is None:
        assert built.weight is None  # a 0/1 entry: no weight reaches the loss
    else:
        assert torch.tensor(expected["weight"], dtype=torch.float64).allclose(built.weight.double().cpu(), rtol=1e-12)


@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "other", "edges"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", sorted(TOKEN_MASK_REGISTRY))
def test_every_registered_mask_equals_its_loop_reference(name, case, settings):
    reference = reference_for(name)
    chosen = MaskSettings(token_mask=name, **settings)
    for seed in range(3):
        tensors = mask_inputs(seed, case)
        built = build_token_mask(MaskInputs(**tensors), chosen)
        as_lists = {key: value.tolist() for key, value in tensors.items()}
        assert_matches_reference(built, reference(as_lists, dataclasses.asdict(chosen)))


@pytest.mark.parametrize("name", sorted(TOKEN_MASK_REGISTRY))
def test_every_mask_with_float32_inputs_as_the_trainer_passes_them(name):
    """The trainer hands float32 tensors over; the reference reads the same float32 values in float64."""
    reference, settings = reference_for(name), MaskSettings(token_mask=name)
    for seed in range(4):
        tensors = mask_inputs(50 + seed, "random", rows=16, cols=40)
        tensors = {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}
        built = build_token_mask(MaskInputs(**tensors), settings)
        expected = reference({k: v.tolist() for k, v in tensors.items()}, dataclasses.asdict(settings))
        assert built.drop_response.tolist() == expected["drop_response"]
        assert built.drop_count.tolist() == expected["drop_count"]


def test_the_inputs_exercise_what_they_claim():
    """Guards against the cases above silently degenerating (a mask test that masks nothing proves nothing)."""
    stapo, entropy20 = MaskSettings(token_mask="stapo"), MaskSettings(token_mask="entropy20")
    random = build_token_mask(MaskInputs(**mask_inputs(0, "random")), stapo)
    assert random.counts["num_spurious"] > 3 and random.counts["num_candidates"] > 10
    assert random.counts["empty_responses"] == 1 and random.counts["num_zero_advantage"] > 0
    ties = mask_inputs(0, "ties")
    kept = build_token_mask(MaskInputs(**ties), entropy20)
    at_threshold = (ties["entropy"] == kept.stats["entropy_threshold"]) & ties["response_mask"]
    assert at_threshold.sum() > 1 and not (kept.drop_response & at_threshold).any()  # ties at the threshold kept
    none = build_token_mask(MaskInputs(**mask_inputs(0, "no_candidates")), stapo)
    assert none.counts["num_candidates"] == 0 and math.isnan(none.stats["tau_h"]) and not none.drop_response.any()
    assert math.isfinite(none.stats["quadrant_entropy_split"])  # the median fallback
    bad = build_token_mask(MaskInputs(**mask_inputs(0, "nonfinite")), stapo)
    assert bad.counts["nonfinite_entropy"] >= 4 and bad.counts["nonfinite_log_prob"] >= 1
    assert bad.counts["nonfinite_advantage"] == 1
    blind = build_token_mask(MaskInputs(**mask_inputs(0, "all_entropy_nan")), entropy20)
    assert math.isnan(blind.stats["entropy_threshold"]) and blind.counts["num_kept"] == 0


def test_masks_only_drop_response_tokens_and_stapo_drops_both_sum_and_count():
    tensors = mask_inputs(3, "random")
    for name in sorted(TOKEN_MASK_REGISTRY):
        built = build_token_mask(MaskInputs(**tensors), MaskSettings(token_mask=name))
        assert not (built.drop_response & ~tensors["response_mask"]).any(), name
        assert not (built.drop_count & ~tensors["response_mask"]).any(), name
    stapo = build_token_mask(MaskInputs(**tensors), MaskSettings(token_mask="stapo"))
    assert torch.equal(stapo.drop_response, stapo.drop_count)
    original = build_token_mask(MaskInputs(**tensors), MaskSettings(token_mask="entropy20"))
    assert original.drop_response.any() and not original.drop_count.any()  # the all-token denominator
    renormalised = build_token_mask(
        MaskInputs(**tensors), MaskSettings(token_mask="entropy20", entropy_denominator="kept")
    )
    assert torch.equal(renormalised.drop_count, original.drop_response)


@pytest.mark.parametrize("name", sorted(TOKEN_MASK_REGISTRY))
def test_ratios_are_ratios_of_summed_counts(name):
    """Two micro-batches' counts summed, then finalized: each ratio is sum(numerator) / sum(denominator)."""
    spec, settings = get_token_mask(name), MaskSettings(token_mask=name)
    parts = [build_token_mask(MaskInputs(**mask_inputs(seed, "random")), settings) for seed in (1, 2)]
    summed = {key: parts[0].counts[key] + parts[1].counts[key] for key in parts[0].counts}
    metrics = finalize_metrics(spec, summed, {})
    assert {"drop_ratio", "zero_advantage_fraction"} <= set(spec.ratios)
    for ratio, (numerator, denominator) in spec.ratios.items():
        want = summed[numerator] / summed[denominator] if summed[denominator] else 0.0
        assert metrics[ratio] == want, ratio
    empty = finalize_metrics(spec, {key: 0.0 for key in summed}, {})
    assert all(empty[ratio] == 0.0 for ratio in spec.ratios)


def test_stapo_ratios_and_quadrants_are_consistent_with_the_mask():
    tensors = mask_inputs(11, "random", rows=30, cols=40)
    built = build_token_mask(MaskInputs(**tensors), MaskSettings(token_mask="stapo"))
    metrics = finalize_metrics(get_token_mask("stapo"), built.counts, built.stats)
    assert metrics["mask_ratio"] == metrics["drop_ratio"] == built.counts["num_spurious"] / built.counts[
        "num_response_tokens"
    ]
    assert metrics["num_loss_tokens_expected"] == metrics["num_response_tokens"] - metrics["num_spurious"]
    quadrants = sum(value for key, value in built.counts.items() if key.startswith("quadrant/"))
    assert quadrants == built.counts["num_positive"]
    assert built.counts["quadrant/lowp_lowh"] == built.counts["num_spurious"]  # S2T's quadrant, exactly
    assert 0 < metrics["grad_bound_share_spurious"] < 1


def test_a_mask_that_needs_an_input_says_so():
    tensors = mask_inputs(0, "random")
    with pytest.raises(ValueError, match="token_mask='stapo' needs log_prob"):
        build_token_mask(
            MaskInputs(tensors["response_mask"], tensors["advantages"], entropy=tensors["entropy"]),
            MaskSettings(token_mask="stapo"),
        )
    with pytest.raises(ValueError, match="token_mask='entropy20' needs entropy"):
        build_token_mask(
            MaskInputs(tensors["response_mask"], tensors["advantages"]), MaskSettings(token_mask="entropy20")
        )


def test_unknown_mask_names_the_registry_entries():
    with pytest.raises(STAPOConfigError) as error:
        MaskSettings(token_mask="stapoo").validate(prefix="pl.")
    message = str(error.value)
    assert "pl.token_mask must be one of" in message and "'stapoo'" in message
    assert all(repr(name) in message for name in TOKEN_MASK_REGISTRY)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"token_mask": "entropy20", "source": "current"}, "pl.source='current' is not available for"),
        ({"source": "fresh"}, "pl.source must be one of ['old', 'current']"),
        ({"tau_p": 1.0}, "pl.tau_p must be a probability in (0, 1)"),
        ({"entropy_quantile": 0.0}, "pl.entropy_quantile must be in (0, 1]"),
        ({"entropy_top_fraction": 0.0}, "pl.entropy_top_fraction must be in (0, 1]"),
        ({"entropy_denominator": "some"}, "pl.entropy_denominator must be one of ['all', 'kept']"),
    ],
)
def test_settings_out_of_range_name_key_and_range(settings, message):
    with pytest.raises(STAPOConfigError) as error:
        MaskSettings(**settings).validate(prefix="pl.")
    assert message in str(error.value)


def test_folded_and_in_loss_follow_entry_and_source():
    assert MaskSettings(token_mask="stapo").folded and not MaskSettings(token_mask="stapo").in_loss
    assert MaskSettings(token_mask="stapo", source="current").in_loss
    assert not MaskSettings().folded and not MaskSettings(source="current").in_loss  # none: nothing to build
    assert MaskSettings.from_mapping({"tau_p": 0.01}) == MaskSettings(tau_p=0.01)


def test_register_refuses_a_second_function_under_a_taken_name():
    @register_token_mask("_test_keep_all")
    def keep_all(inputs, settings):
        nothing = torch.zeros_like(inputs.response_mask)
        return TokenMask(nothing, nothing)

    try:
        assert register_token_mask("_test_keep_all")(keep_all) is keep_all  # the same function again: a no-op
        with pytest.raises(ValueError, match="already registered"):
            register_token_mask("_test_keep_all")(lambda inputs, settings: None)
        # and a registered entry without a loop reference fails the registry test
        with pytest.raises(pytest.fail.Exception, match="has no loop reference"):
            reference_for("_test_keep_all")
    finally:
        del TOKEN_MASK_REGISTRY["_test_keep_all"]


@pytest.mark.parametrize("top_fraction", [0.2, 0.37])
def test_entropy20_threshold_is_exact_above_the_percentile_sampling_size(top_fraction):
    """One process above 2^20 positions (the driver, or a single rank) takes the exact quantile, as several
    ranks do: the kept set is the one numpy's quantile gives, not a strided sample's estimate."""
    import numpy as np

    g = torch.Generator().manual_seed(5)
    rows, cols = 300, 4000  # 1.2M positions > 2^20
    entropy = torch.rand(rows, cols, generator=g) * 3
    entropy[::7, ::11] = 0.5  # ties
    response_mask = torch.rand(rows, cols, generator=g) < 0.9
    settings = MaskSettings(token_mask="entropy20", entropy_top_fraction=top_fraction)
    built = build_token_mask(MaskInputs(response_mask, torch.ones(rows), None, entropy), settings)
    values = entropy[response_mask].double().numpy()
    threshold = float(np.quantile(values, 1.0 - top_fraction))
    assert built.stats["entropy_threshold"] == threshold
    assert built.counts["num_kept"] == int((values >= threshold).sum())


@pytest.mark.parametrize("name", ["stapo", "entropy20"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_mask_built_in_parts_is_each_parts_own_mask(name, seed):
    """``build_token_mask_in_parts`` (the paper's per-mini-batch scope) against the loop reference run on each
    part's tokens alone: the dropped tokens, the counts summed, the thresholds averaged over the parts where
    they are defined; part 1 holds no token (a rank without rows in a mini-batch still builds it)."""
    from stapo.algorithm.masks import build_token_mask_in_parts

    tensors = mask_inputs(seed, "ties" if seed else "plain")
    mask = tensors["response_mask"]
    part = torch.where(torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.5, 0, 2)
    settings = MaskSettings(token_mask=name, threshold_scope="mini_batch")
    built = build_token_mask_in_parts(MaskInputs(**tensors), settings, part, num_parts=3)
    counts: dict[str, float] = {}
    stats: dict[str, list[float]] = {}
    for k in range(3):
        where = mask & (part == k)
        one_row = {key: [[float(v) for v in value[where]]] for key, value in tensors.items() if key != "response_mask"}
        one_row["response_mask"] = [[1] * int(where.sum())]
        reference = REFERENCES[name](one_row, dataclasses.asdict(settings))
        assert built.drop_response[where].tolist() == reference["drop_response"][0], k
        assert built.drop_count[where].tolist() == reference["drop_count"][0], k
        for key, value in reference["counts"].items():
            counts[key] = counts.get(key, 0.0) + value
        for key, value in reference["stats"].items():
            stats.setdefault(key, []).append(value)
    assert not bool((built.drop_response & ~mask).any())
    for key, value in counts.items():
        if key != "empty_responses":  # per row of the whole input, not per part
            assert built.counts[key] == pytest.approx(value, rel=1e-9), key
    assert built.counts["empty_responses"] == float((~mask.any(dim=-1)).sum())
    for key, values in stats.items():
        defined = [v for v in values if not math.isnan(v)]
        assert built.stats[key] == pytest.approx(sum(defined) / len(defined), rel=1e-9), key
    assert built.stats["threshold_scopes"] == 3.0
