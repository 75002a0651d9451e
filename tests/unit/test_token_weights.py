"""The soft per-token weights (TACO, Advantage Reweighting) against the float64 loops of tests/reference.py.

Fresh random inputs per test (seeded, several shapes, the empty batch included) with rows of no response
token, zero and negative advantages, p = 1, tiny p, ties, tokens on TACO's r = 0 edge, and NaN/inf
log-probs, entropies and advantages at padded positions (and, for the weights alone, at response tokens).
Checked: each weight, the entry's counts, ratios and minimum; the weighted objective and its gradient with
respect to the log-probs (autograd in float64 against the loop); that nothing at a padded position reaches the
loss or its gradient; that weights never amplify and weighted tokens stay in the count; that the per-mini-batch
build stitches the same weights. The verl path: tests/integration/test_weighted_update.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from stapo.algorithm.loss import masked_pg_losses
from stapo.algorithm.masks import (
    TOKEN_MASK_REGISTRY,
    MaskInputs,
    MaskSettings,
    build_token_mask,
    build_token_mask_in_parts,
    finalize_metrics,
    get_token_mask,
)
from tests.reference import REFERENCES, reference_masked_loss

NAN, INF = float("nan"), float("inf")
WEIGHTED = sorted(name for name, spec in TOKEN_MASK_REGISTRY.items() if spec.weighted)
# weights of one token's own values, never above 1; STARE (a cut and a gate over the scope, W > 1) and STEER (a
# maximum over the scope) are bounded and stitched in tests/unit/test_stare.py and tests/unit/test_steer.py
TOKENWISE = ("taco", "advrew")
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}
SHAPES = [(0, 5), (1, 1), (4, 9), (11, 37)]
SETTINGS = {
    "taco": [{}, {"taco_alpha": 0.3, "taco_lambda": 1.0}, {"taco_alpha": 1e-4, "taco_lambda": 0.0}],
    "advrew": [{}, {"advrew_alpha": 1.0}, {"advrew_alpha": 0.0}],
    "stare": [{"stare_target_entropy": 100.0}, {"stare_target_entropy": 100.0, "stare_variant": "C2",
                                                 "stare_top_ratio": 0.5}, {}],
    "steer": [{}, {"steer_lambda_min": 0.5}, {"steer_lambda_min": 1.0}],
}
SUMS = ("weight_sum", "weight_sum_positive", "min_weight")  # float sums in another order than the loop's


def weight_inputs(seed: int, rows: int, cols: int, case: str = "random") -> dict[str, torch.Tensor]:
    """Float64 inputs; rows alternate positive, negative and zero advantages; padded positions hold NaN/inf."""
    g = torch.Generator().manual_seed(seed)
    log_prob = torch.empty(rows, cols, dtype=torch.float64).uniform_(math.log(1e-9), 0.0, generator=g)
    pick = torch.rand(rows, cols, generator=g)
    log_prob[pick < 0.1] = 0.0  # p = 1
    log_prob[(pick >= 0.1) & (pick < 0.2)] = -60.0  # tiny p
    entropy = torch.rand(rows, cols, generator=g, dtype=torch.float64) * 5
    signs = torch.tensor([(1.0, -1.0, 0.0, 1.0)[i % 4] for i in range(rows)], dtype=torch.float64)
    advantages = (signs * (0.1 + torch.rand(rows, generator=g, dtype=torch.float64))).unsqueeze(-1)
    advantages = advantages.expand(rows, cols).clone()
    lengths = torch.randint(0, cols + 1, (rows,), generator=g)
    if rows > 2:
        lengths[2] = 0  # a row without a response token
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(-1)
    if case == "ties":  # few distinct values; some tokens exactly on TACO's r = 0 edge (alpha 0.01)
        log_prob = torch.tensor([math.log(0.5), math.log(1e-4), 0.0], dtype=torch.float64)[
            torch.randint(0, 3, (rows, cols), generator=g)]
        entropy = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)[torch.randint(0, 3, (rows, cols), generator=g)]
        edge = torch.rand(rows, cols, generator=g) < 0.3
        log_prob[edge] = math.log(0.01) - entropy[edge]
    elif case == "nonfinite" and rows * cols:  # undefined weights at response tokens: kept at 1, and counted
        flat_lp, flat_h = log_prob.view(-1), entropy.view(-1)
        flat_lp[:: 5], flat_lp[1:: 7], flat_h[2:: 6], flat_h[3:: 11] = -INF, NAN, NAN, INF
    outside = ~mask  # values outside the response must never matter
    log_prob[outside], entropy[outside], advantages[outside] = NAN, INF, NAN
    return {"response_mask": mask, "advantages": advantages, "log_prob": log_prob, "entropy": entropy}


def as_lists(tensors: dict) -> dict:
    return {key: value.tolist() for key, value in tensors.items()}


def check_against_reference(name: str, tensors: dict, settings: MaskSettings):
    built = build_token_mask(MaskInputs(**tensors), settings)
    expected = REFERENCES[name](as_lists(tensors), dataclasses.asdict(settings))
    want = torch.tensor(expected["weight"], dtype=torch.float64).reshape(built.weight.shape)
    torch.testing.assert_close(built.weight, want, rtol=1e-12, atol=0.0)
    assert not built.drop_response.any() and not built.drop_count.any()
    assert built.counts.keys() == expected["counts"].keys() and built.stats.keys() == expected["stats"].keys()
    for key, value in {**expected["counts"], **expected["stats"]}.items():
        got = built.counts.get(key, built.stats.get(key))
        if math.isnan(value):
            assert math.isnan(got), key
        else:
            assert got == (pytest.approx(value, rel=1e-12) if key in SUMS else value), key
    return built


@pytest.mark.parametrize("case", ["random", "ties", "nonfinite"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", WEIGHTED)
def test_each_weight_and_its_metrics_equal_the_loop_reference(name, shape, case):
    for index, extra in enumerate(SETTINGS[name]):
        tensors = weight_inputs(100 * index + shape[0] * 7 + shape[1], *shape, case)
        built = check_against_reference(name, tensors, MaskSettings(token_mask=name, **extra))
        metrics = finalize_metrics(get_token_mask(name), built.counts, built.stats)
        tokens, positive = built.counts["num_response_tokens"], built.counts["num_positive"]
        assert metrics["mean_weight"] == (built.counts["weight_sum"] / tokens if tokens else 0.0)
        assert metrics["mean_weight_positive"] == (built.counts["weight_sum_positive"] / positive if positive else 0.0)


@pytest.mark.parametrize("name", TOKENWISE)
def test_the_inputs_exercise_what_they_claim(name):
    tensors = weight_inputs(3, 11, 37)
    built = build_token_mask(MaskInputs(**tensors), MaskSettings(token_mask=name))
    counts = built.counts
    assert counts["empty_responses"] >= 1 and counts["num_zero_advantage"] > 0
    assert 0 < counts["num_positive_downweighted"] < counts["num_positive"]  # some tail, some not (p = 1 ones)
    assert built.stats["min_weight"] < 0.72
    ties = weight_inputs(3, 11, 37, "ties")
    r = math.log(0.01) - ties["log_prob"] - ties["entropy"]
    assert bool((r[ties["response_mask"]] == 0).any())  # tokens exactly on TACO's edge


def test_taco_clips_r_at_zero_and_advrew_is_linear_in_p():
    """Hand values: TACO never above 1 (r < 0 is 0), 1 - lambda far in the tail, 1 off positive advantages;
    Advantage Reweighting 1 at p = 1, 1 - alpha at p -> 0, for either sign."""
    alpha, lam = 0.01, 0.9
    lp = torch.tensor([[0.0, -1.0, -20.0, -20.0, math.log(alpha) - 1.0, -20.0]], dtype=torch.float64)
    h = torch.tensor([[0.0, 0.5, 0.0, 0.0, 1.0, NAN]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones_like(lp, dtype=torch.bool)
    taco = build_token_mask(MaskInputs(mask, adv, lp, h), MaskSettings(token_mask="taco")).weight
    far = 1.0 - lam * (1.0 - math.exp(-(20.0 + math.log(alpha))))
    assert taco[0, :2].tolist() == [1.0, 1.0]  # r < 0: not amplified
    assert taco[0, 2].item() == pytest.approx(far, rel=1e-14) and taco[0, 3].item() == 1.0  # A < 0: untouched
    assert taco[0, 4].item() == pytest.approx(1.0, abs=1e-14) and taco[0, 5].item() == 1.0  # edge; undefined H
    advrew = build_token_mask(MaskInputs(mask, adv, lp, h), MaskSettings(token_mask="advrew")).weight
    assert advrew[0, 0].item() == 1.0 and advrew[0, 3].item() == advrew[0, 2].item()
    assert advrew[0, 2].item() == pytest.approx(0.7 + 0.3 * math.exp(-20.0), rel=1e-15)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", WEIGHTED)
def test_weighted_loss_and_gradient_equal_the_loop_reference(name, shape, seed):
    """The objective of docs/algorithm.md section 3 with the weights: the token-mean over every response token
    (none dropped) of w times the clipped loss; d/d log_prob in float64 autograd against the loop's."""
    tensors = weight_inputs(seed, *shape)
    mask = tensors["response_mask"]
    g = torch.Generator().manual_seed(seed + 50)
    shift = torch.empty(shape, dtype=torch.float64).uniform_(-0.6, 0.6, generator=g)
    shift[::3, ::4] = 2.5  # the dual-clip region for A < 0
    old = tensors["log_prob"]
    new = (old + shift).masked_fill(~mask, INF).requires_grad_(True)  # a padded value never reaches the loss
    built = build_token_mask(MaskInputs(**tensors), MaskSettings(token_mask=name))
    count = built.counts["num_loss_tokens_expected"]
    assert count == built.counts["num_response_tokens"]  # weighted tokens stay in the count
    losses, _ = masked_pg_losses(old, new, tensors["advantages"], mask, weights=built.weight, **CLIP)
    loss = losses.sum() / max(count, 1.0)
    loss.backward()
    lists = as_lists(tensors)
    expected = REFERENCES[name](lists, dataclasses.asdict(MaskSettings(token_mask=name)))
    new_list = new.detach().masked_fill(~mask, 0.0).tolist()
    want, grad = reference_masked_loss(lists["log_prob"], new_list, lists["advantages"], lists["response_mask"],
                                       count or 1, weights=expected["weight"])
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12, abs=1e-15)
    torch.testing.assert_close(new.grad, torch.tensor(grad, dtype=torch.float64).reshape(shape), rtol=1e-10,
                               atol=1e-15)
    assert bool(torch.isfinite(new.grad).all()) and not bool(new.grad[~mask].any())


@pytest.mark.parametrize("name", TOKENWISE)
def test_weights_never_amplify_and_drop_nothing(name):
    for seed in range(4):
        tensors = weight_inputs(seed + 20, 9, 31)
        settings = MaskSettings(token_mask=name)
        built = build_token_mask(MaskInputs(**tensors), settings)
        floor = 1.0 - (settings.taco_lambda if name == "taco" else settings.advrew_alpha)
        mask = tensors["response_mask"]
        assert bool((built.weight[mask] >= floor).all()) and bool((built.weight <= 1.0).all())
        assert bool((built.weight[~mask] == 1.0).all())
        if name == "taco":  # only positive-advantage tokens are touched
            assert bool((built.weight[mask & ~(tensors["advantages"] > 0)] == 1.0).all())


@pytest.mark.parametrize("name", TOKENWISE)
def test_per_part_build_stitches_the_same_weights_and_the_whole_minimum(name):
    """The paper's mini-batch scope builds each part on its own; a token-wise weight must not depend on it, and
    the reported minimum is the whole input's, not a mean of the parts' minima."""
    tensors = weight_inputs(7, 11, 37)
    settings = MaskSettings(token_mask=name)
    whole = build_token_mask(MaskInputs(**tensors), settings)
    part = torch.randint(0, 3, (11, 1), generator=torch.Generator().manual_seed(1)).expand(11, 37)
    parts = build_token_mask_in_parts(MaskInputs(**tensors), settings, part, 3)
    assert torch.equal(parts.weight, whole.weight)
    assert parts.stats["min_weight"] == whole.stats["min_weight"]
    for key, value in whole.counts.items():
        assert parts.counts[key] == pytest.approx(value, rel=1e-12), key


@pytest.mark.parametrize("name", sorted(TOKEN_MASK_REGISTRY))
def test_only_weighted_entries_return_a_weight(name):
    built = build_token_mask(MaskInputs(**weight_inputs(1, 4, 9)), MaskSettings(token_mask=name))
    assert (built.weight is not None) == get_token_mask(name).weighted == (name in (*TOKENWISE, "stare", "steer"))
