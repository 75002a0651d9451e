"""STARE's weights (stapo/algorithm/stare.py, registry entry ``stare``) against the float64 loop of tests/reference.py.

Fresh random inputs per case, and the edges: the authors' rounding of k (7 of 100 at P = 0.07, not a ceil's 8),
ties at the cut (all taken), the gate exactly at the target (off: strict), all-negative advantages (O1 weights
nothing, C2 only L-), an empty mask, NaN and -inf log-probs (never selected), NaN entropies (out of the gate's
mean), p = 1 and p = e^-60, P = 0 and P = 1. Also: the per-mini-batch build is each part's own STARE; the
weighted objective through verl's real ``ppo_loss`` with the gate on equals the loop's, over several micro-batch
splits; and on 2 gloo ranks the DP-global cut, gate and weights of STARE and STEER equal the single-process ones.
The registry-wide checks (every case of tests/unit/test_masks.py, the metrics of tests/unit/test_token_weights.py,
the folded path of tests/integration/test_verl_loss_path.py) run STARE too.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask, build_token_mask_in_parts
from stapo.algorithm.stare import stare_weight, top_count
from tests.reference import REFERENCES, reference_stare_weights

NAN, INF = float("nan"), float("inf")
ON = {"stare_target_entropy": 100.0}  # the gate on for entropies in [0, 5)
SETTINGS = [
    {**ON},
    {**ON, "stare_variant": "C2"},
    {**ON, "stare_variant": "C2", "stare_top_ratio": 0.37, "stare_w": 1.5, "stare_m": 0.25},
    {**ON, "stare_top_ratio": 0.0},
    {**ON, "stare_top_ratio": 1.0, "stare_variant": "C2"},
    {},  # the authors' defaults: the gate is off at these entropies
]
CASES = ["random", "ties", "nonfinite", "all_negative", "empty", "extreme"]


def stare_inputs(seed: int, case: str, rows: int = 9, cols: int = 23) -> dict[str, torch.Tensor]:
    """Float64 inputs, rows of either advantage sign and zero, ragged; padded positions hold NaN/inf."""
    g = torch.Generator().manual_seed(seed)
    log_prob = torch.empty(rows, cols, dtype=torch.float64).uniform_(-12.0, 0.0, generator=g)
    entropy = torch.rand(rows, cols, generator=g, dtype=torch.float64) * 5
    signs = torch.tensor([(1.0, -1.0, 0.0, 1.0, -1.0)[i % 5] for i in range(rows)], dtype=torch.float64)
    advantages = (signs * (0.1 + torch.rand(rows, generator=g, dtype=torch.float64))).unsqueeze(-1).expand(rows, cols)
    advantages = advantages.clone()
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(-1)
    if case == "ties":
        log_prob = torch.tensor([-0.5, -3.0, -7.0], dtype=torch.float64)[torch.randint(0, 3, (rows, cols), generator=g)]
    elif case == "nonfinite":
        log_prob.view(-1)[::4], log_prob.view(-1)[1::9], entropy.view(-1)[2::5] = NAN, -INF, NAN
    elif case == "all_negative":
        advantages = -advantages.abs() - 0.1
    elif case == "empty":
        mask = torch.zeros_like(mask)
    elif case == "extreme":
        pick = torch.rand(rows, cols, generator=g)
        log_prob[pick < 0.3], log_prob[pick > 0.7] = 0.0, -60.0
    log_prob[~mask], entropy[~mask], advantages[~mask] = NAN, INF, NAN
    return {"response_mask": mask, "advantages": advantages, "log_prob": log_prob, "entropy": entropy}


def as_lists(tensors: dict) -> dict:
    return {key: value.tolist() for key, value in tensors.items()}


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("index", range(len(SETTINGS)))
def test_weights_gate_and_cut_equal_the_loop_reference(index, case):
    for seed in range(3):
        tensors = stare_inputs(seed + 10 * index, case)
        settings = MaskSettings(token_mask="stare", **SETTINGS[index])
        built = build_token_mask(MaskInputs(**tensors), settings)
        weight, gate, cut = reference_stare_weights(as_lists(tensors), dataclasses.asdict(settings))
        assert built.weight.tolist() == weight  # W, M or 1: exact
        assert same(built.stats["stare_gate"], gate) and same(built.stats["stare_cut"], cut)
        expected = REFERENCES["stare"](as_lists(tensors), dataclasses.asdict(settings))
        assert built.counts["num_upweighted"] == expected["counts"]["num_upweighted"]
        assert not built.drop_response.any() and not built.drop_count.any()  # nothing dropped, all counted


def test_the_cases_exercise_what_they_claim():
    settings = MaskSettings(token_mask="stare", **SETTINGS[1])
    random = build_token_mask(MaskInputs(**stare_inputs(0, "random")), settings)
    assert random.counts["num_upweighted"] > 0 and random.counts["num_downweighted"] > 0
    ties = stare_inputs(0, "ties")
    tied = build_token_mask(MaskInputs(**ties), MaskSettings(token_mask="stare", **ON))
    positive = ties["response_mask"] & (ties["advantages"] > 0)
    k = top_count(int(positive.sum()), 0.1)
    assert tied.counts["num_upweighted"] > k  # the ties at the cut are all taken
    assert tied.counts["num_upweighted"] == int((positive & (-ties["log_prob"] >= tied.stats["stare_cut"])).sum())
    off = build_token_mask(MaskInputs(**stare_inputs(0, "random")), MaskSettings(token_mask="stare"))
    assert off.stats["stare_gate"] == 0.0 and bool((off.weight == 1.0).all()) and math.isfinite(off.stats["stare_cut"])


def test_k_is_the_authors_rounding_not_a_ceil():
    """100 tokens at P = 0.07: 100 * 0.07 = 7.000000000000001 in floating point; the authors' +0.999999 takes 7."""
    assert 100 * 0.07 > 7 and top_count(100, 0.07) == 7 and math.ceil(100 * 0.07) == 8
    assert top_count(101, 0.07) == 8 and top_count(5, 0.01) == 1 and top_count(0, 0.5) == 0 and top_count(7, 0.0) == 0
    assert top_count(30, 0.1) == 3 and top_count(9, 1.0) == 9
    lp = -torch.arange(1, 101, dtype=torch.float64).unsqueeze(0)  # surprisal 1..100, all distinct
    ones = torch.ones_like(lp)
    built = stare_weight(lp, torch.zeros_like(lp), ones, torch.ones_like(lp, dtype=torch.bool), top_ratio=0.07)
    assert built.weight.tolist()[0] == [1.0] * 93 + [1.1] * 7 and built.cut == 94.0 and built.gate == 1.0


def test_gate_is_strict_and_undefined_without_a_finite_entropy():
    lp = torch.log(torch.tensor([[0.5, 0.1, 0.01, 0.9]], dtype=torch.float64))
    adv, mask = torch.ones_like(lp), torch.ones_like(lp, dtype=torch.bool)
    at_target = stare_weight(lp, torch.full_like(lp, 0.3), adv, mask, top_ratio=0.25)
    assert at_target.gate == 0.0 and bool((at_target.weight == 1.0).all())  # mean == H_tgt: off
    below = stare_weight(lp, torch.full_like(lp, 0.3).nextafter(torch.zeros_like(lp)), adv, mask, top_ratio=0.25)
    assert below.gate == 1.0 and below.weight.tolist() == [[1.0, 1.0, 1.1, 1.0]]
    blind = stare_weight(lp, torch.full_like(lp, NAN), adv, mask, top_ratio=0.25)
    assert math.isnan(blind.gate) and bool((blind.weight == 1.0).all())
    # a NaN entropy leaves the mean; the others decide
    mixed = stare_weight(lp, torch.tensor([[NAN, 0.1, 0.2, 0.3]], dtype=torch.float64), adv, mask, top_ratio=0.25)
    assert mixed.gate == 1.0


def test_all_negative_advantages_weight_only_with_c2():
    tensors = stare_inputs(4, "all_negative")
    o1 = build_token_mask(MaskInputs(**tensors), MaskSettings(token_mask="stare", **ON))
    assert bool((o1.weight == 1.0).all()) and math.isnan(o1.stats["stare_cut"])
    c2 = build_token_mask(MaskInputs(**tensors), MaskSettings(token_mask="stare", stare_variant="C2", **ON))
    assert set(c2.weight[tensors["response_mask"]].tolist()) == {0.9, 1.0} and c2.counts["num_upweighted"] == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_a_per_mini_batch_build_is_each_parts_own_stare(seed):
    """threshold_scope mini_batch: each part's cut and gate from its own tokens (part 1 holds none)."""
    tensors = stare_inputs(seed, "ties" if seed else "random")
    mask = tensors["response_mask"]
    part = torch.where(torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.5, 0, 2)
    settings = MaskSettings(token_mask="stare", threshold_scope="mini_batch", stare_variant="C2",
                            stare_target_entropy=2.5)
    built = build_token_mask_in_parts(MaskInputs(**tensors), settings, part, num_parts=3)
    gates = []
    for k in range(3):
        where = mask & (part == k)
        one_row = {key: [value[where].tolist()] for key, value in tensors.items() if key != "response_mask"}
        one_row["response_mask"] = [[True] * int(where.sum())]
        weight, gate, _ = reference_stare_weights(one_row, dataclasses.asdict(settings))
        assert built.weight[where].tolist() == weight[0], k
        gates.append(gate)
    defined = [g for g in gates if not math.isnan(g)]
    assert built.stats["stare_gate"] == sum(defined) / len(defined)
    assert bool((built.weight[~mask] == 1.0).all())


@pytest.mark.parametrize("splits", [[10], [3, 4, 3], [1] * 10])
def test_the_weighted_objective_through_verls_loss_equals_the_loop(splits):
    """O1 with the gate on, folded as the actor worker folds it, through STAPOLossFn -> verl's ppo_loss ->
    masked_clip -> agg_loss: the loss and each token's gradient equal the loop's (w times the clipped loss, the
    token-mean over every response token)."""
    from stapo.verl_plugin.training.losses import STAPOLossFn
    from tests.integration.test_verl_loss_path import ragged_rows, random_batch, reference_for_entry
    from tests.integration.verl_batches import actor_config, fold_as_trainer, run_micro_batches

    tensors, lengths, prompt_lens = random_batch(5)
    settings = MaskSettings(token_mask="stare", **ON)
    response_mask, loss_mask, built = fold_as_trainer(tensors, settings)
    assert built.counts["num_upweighted"] > 0
    rows = ragged_rows(tensors, lengths, response_mask, loss_mask, built.weight)
    total, grads, _ = run_micro_batches(STAPOLossFn(actor_config(token_mask="stare", **ON)), rows, prompt_lens,
                                        splits, int(loss_mask.sum()))
    expected, expected_grad, _, count = reference_for_entry(tensors, settings)
    assert count == int(tensors["response_mask"].sum())  # weighted tokens stay in the count
    assert total == pytest.approx(expected, rel=1e-10)
    for row, (got, want) in enumerate(zip(grads, expected_grad)):
        assert got == pytest.approx(want[: lengths[row]], rel=1e-9, abs=1e-15), row


# --- 2 gloo ranks: the scope's statistics are DP-global (STARE's cut and gate, STEER's maximum) -----------------

RANK_SETTINGS = {
    "stare": {"stare_variant": "C2", "stare_target_entropy": 2.5, "stare_top_ratio": 0.2},
    "steer": {"steer_lambda_min": 0.6},
}


def _rank_shard(rank: int) -> dict[str, torch.Tensor]:
    tensors = stare_inputs(200 + rank, "random", rows=5 + 2 * rank)
    tensors["log_prob"], tensors["entropy"] = tensors["log_prob"].float(), tensors["entropy"].float()
    return tensors


def _on_rank(rank: int, world: int, group) -> dict:
    out = {}
    for name, extra in RANK_SETTINGS.items():
        built = build_token_mask(MaskInputs(**_rank_shard(rank), group=group), MaskSettings(token_mask=name, **extra))
        out[name] = (built.weight.tolist(), dict(built.stats))
    return out


@pytest.mark.slow  # starts processes: out of make test-fast
def test_two_ranks_equal_the_concatenated_batch():
    from tests.integration.gloo_ranks import run_cases

    results = run_cases(_on_rank, {2: (2, ())})[2]
    shards = [_rank_shard(rank) for rank in range(2)]
    union = {key: [row for shard in shards for row in shard[key].tolist()] for key in shards[0]}
    for name, extra in RANK_SETTINGS.items():
        expected = REFERENCES[name](union, dataclasses.asdict(MaskSettings(token_mask=name, **extra)))
        offset = 0
        for rank, shard in enumerate(shards):
            weight, stats = results[rank][name]
            rows = shard["response_mask"].shape[0]
            want = torch.tensor(expected["weight"][offset: offset + rows], dtype=torch.float64)
            torch.testing.assert_close(torch.tensor(weight, dtype=torch.float64), want, rtol=1e-12, atol=0.0)
            for key, value in expected["stats"].items():
                assert stats[key] == pytest.approx(value, rel=1e-12, nan_ok=True), (name, rank, key)
            offset += rows
    assert results[0]["stare"][1]["stare_gate"] == 1.0  # the weights are really on


@pytest.mark.parametrize(("key", "value", "message"), [
    ("stare_w", 0.9, "stare_w must be in [1, inf)"),
    ("stare_m", 1.5, "stare_m must be in [0, 1]"),
    ("stare_top_ratio", -0.1, "stare_top_ratio must be in [0, 1]"),
    ("stare_target_entropy", NAN, "stare_target_entropy must be in [0, inf)"),
    ("stare_variant", "C3", "stare_variant must be one of ['O1', 'C2']"),
])
def test_settings_out_of_range_are_refused_naming_the_key_and_range(key, value, message):
    from stapo.algorithm.validation import STAPOConfigError

    with pytest.raises(STAPOConfigError, match="^" + re.escape(f"pl.{message}")):
        MaskSettings(token_mask="stare", **{key: value}).validate(prefix="pl.")
    with pytest.raises(STAPOConfigError, match="source='current' is not available for pl.token_mask='stare'"):
        MaskSettings(token_mask="stare", source="current").validate(prefix="pl.")
