"""The pure pieces of the objective (per-token clipped losses, masking, the refusal loss) and the
gradient-norm identity, against float64 loops. The whole objective, with every registered mask,
through verl's loss path: tests/integration/test_verl_loss_path.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stapo.algorithm.gradnorm import effective_pg_weight, grad_norm_bounds, grad_norm_sq_lower_bound, logit_grad_norm_sq
from stapo.algorithm.loss import (
    clipped_pg_losses,
    masked_pg_losses,
    nan_gradient_loss,
    nonfinite_report,
    outside_mask_zeroed,
)
from tests.reference import reference_clipped_token_loss, reference_masked_loss
from tests.unit.test_s2t import random_batch

CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}


def with_old_policy(seed: int, rows: int = 12, cols: int = 40):
    log_prob, entropy, advantages, response_mask = random_batch(seed, rows, cols)
    g = torch.Generator().manual_seed(seed + 1000)
    # ratios spread over both clip edges and the dual-clip region
    old_log_prob = log_prob + torch.empty(rows, cols).uniform_(-3.0, 3.0, generator=g)
    return old_log_prob.double(), log_prob.double(), advantages.double(), response_mask, entropy.double()


@pytest.mark.parametrize("seed", range(4))
def test_masked_pg_losses_and_gradient_match_the_loop_reference(seed):
    """Per token, over a mask: the clipped loss and d/d log_prob, 0 (value and gradient) outside the mask."""
    old_lp, lp, adv, mask, _ = with_old_policy(seed)
    lp = lp.clone().requires_grad_(True)
    losses, _ = masked_pg_losses(old_lp, lp, adv, mask, **CLIP)
    losses.sum().backward()
    keep = mask.tolist()
    total, grad = reference_masked_loss(old_lp.tolist(), lp.detach().tolist(), adv.tolist(), keep, 1)
    assert float(losses.sum().detach()) == pytest.approx(total, rel=1e-12)
    np.testing.assert_allclose(lp.grad.numpy(), np.array(grad), rtol=1e-10, atol=1e-15)
    assert (losses[~mask] == 0).all() and (lp.grad[~mask] == 0).all()
    assert (lp.grad[mask] != 0).any() and (lp.grad[mask] == 0).any()  # both clipped and free tokens


def test_weights_scale_each_token_and_gradient_flows_through_log_prob_only():
    old_lp, lp, adv, mask, _ = with_old_policy(3)
    lp = lp.clone().requires_grad_(True)
    old_lp, adv = old_lp.clone().requires_grad_(True), adv.clone().requires_grad_(True)
    weights = torch.rand(lp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    plain, _ = masked_pg_losses(old_lp, lp, adv, mask, **CLIP)
    weighted, _ = masked_pg_losses(old_lp, lp, adv, mask, weights=weights, **CLIP)
    torch.testing.assert_close(weighted, plain * weights, rtol=1e-15, atol=0.0)
    weighted.sum().backward()
    assert lp.grad is not None and lp.grad.abs().sum() > 0
    assert old_lp.grad is None and adv.grad is None  # data, not parameters


def test_nan_outside_the_mask_reaches_neither_the_loss_nor_the_gradient():
    """The reason for outside_mask_zeroed: multiplying by the mask afterwards leaves NaN * 0 = NaN."""
    old_lp, lp, adv, mask, _ = with_old_policy(2)
    old_lp, lp, adv = old_lp.clone(), lp.clone(), adv.clone()
    old_lp[~mask], lp[~mask], adv[~mask] = float("nan"), float("inf"), float("nan")
    leaf = lp.requires_grad_(True)
    losses, _ = masked_pg_losses(old_lp, leaf, adv, mask, **CLIP)
    losses.sum().backward()
    assert torch.isfinite(losses).all() and torch.isfinite(leaf.grad).all()
    naive, _ = clipped_pg_losses(old_lp, lp.detach().requires_grad_(True), adv, **CLIP)
    assert not torch.isfinite((naive * mask).sum())  # what the guard prevents
    assert outside_mask_zeroed(mask, None) == [None]


def test_nan_gradient_loss_is_nan_with_nan_gradient_on_every_kept_token():
    """A refused micro-batch: NaN value and NaN gradient where kept (so the DP-global grad norm is NaN on
    every rank and verl skips the step), 0 elsewhere (no path from padding)."""
    _, lp, _, mask, _ = with_old_policy(0)
    lp = lp.clone()
    lp[~mask] = float("nan")
    leaf = lp.requires_grad_(True)
    loss = nan_gradient_loss(leaf, mask)
    assert loss.dim() == 0 and math.isnan(float(loss))
    loss.backward()
    assert torch.isnan(leaf.grad[mask]).all() and (leaf.grad[~mask] == 0).all()


def test_nonfinite_report_counts_each_input_over_loss_tokens_only():
    _, lp, adv, mask, _ = with_old_policy(1)
    lp, adv = lp.clone(), adv.clone()
    i, t = mask.nonzero()[0].tolist()
    lp[i, t], adv[~mask] = float("nan"), float("inf")  # one loss token, and padding that must not count
    report = nonfinite_report(torch.tensor(float("nan")), mask, log_prob=lp, advantages=adv, weights=None)
    assert f"among its {int(mask.sum())} loss tokens: {{'log_prob': 1, 'advantages': 0}}" in report
    assert "skipped on every rank" in report


@pytest.mark.parametrize("seed", range(3))
def test_clipped_losses_match_reference_per_token(seed):
    old_lp, lp, adv, _, _ = with_old_policy(seed)
    losses, flags = clipped_pg_losses(old_lp, lp, adv, **CLIP)
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            ref = reference_clipped_token_loss(float(old_lp[i, t]), float(lp[i, t]), float(adv[i, t]), 0.2, 0.28, 10.0)
            assert float(losses[i, t]) == pytest.approx(ref, rel=1e-12, abs=1e-15)
    assert flags["clipped"].any() and flags["dual_clipped"].any()


def test_dual_clip_constant_must_exceed_one():
    old_lp, lp, adv, _, _ = with_old_policy(0)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        clipped_pg_losses(old_lp, lp, adv, clip_ratio_c=1.0)


def _random_logits(seed, tokens=64, vocab=50):
    g = torch.Generator().manual_seed(seed)
    scale = torch.empty(tokens, 1).uniform_(0.1, 8.0, generator=g)  # from flat to very peaked
    logits = torch.randn(tokens, vocab, generator=g, dtype=torch.float64) * scale
    token_ids = torch.randint(0, vocab, (tokens,), generator=g)
    weight = torch.randn(tokens, generator=g, dtype=torch.float64)
    return logits, token_ids, weight


@pytest.mark.parametrize("seed", range(4))
def test_grad_norm_identity_matches_autograd(seed):
    logits, token_ids, weight = _random_logits(seed)
    closed_form = logit_grad_norm_sq(logits, token_ids, weight)
    for k in range(logits.shape[0]):
        row = logits[k].clone().requires_grad_(True)
        (weight[k] * torch.log_softmax(row, dim=-1)[token_ids[k]]).backward()
        assert float(closed_form[k]) == pytest.approx(float(row.grad.pow(2).sum()), rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_grad_norm_bounds_hold(seed):
    logits, token_ids, weight = _random_logits(seed, vocab=200)
    probs = torch.softmax(logits, dim=-1)
    entropy = -(probs * torch.log(probs)).sum(-1)
    p = probs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    exact = logit_grad_norm_sq(logits, token_ids, weight)
    lower, upper = grad_norm_bounds(p, entropy, weight, vocab_size=200)
    assert (lower <= exact * (1 + 1e-12)).all()
    assert (exact <= upper * (1 + 1e-12)).all()


def test_grad_norm_upper_bound_is_tight_at_uniform():
    vocab = 37
    logits = torch.zeros(1, vocab, dtype=torch.float64)
    exact = logit_grad_norm_sq(logits, torch.tensor([0]), torch.tensor([1.0]))
    _, upper = grad_norm_bounds(
        torch.tensor([1 / vocab], dtype=torch.float64), torch.tensor([math.log(vocab)], dtype=torch.float64),
        torch.tensor([1.0], dtype=torch.float64), vocab,
    )
    assert float(exact) == pytest.approx(float(upper), rel=1e-12)


def test_effective_weight_is_zero_where_clipped():
    ratio = torch.tensor([0.5, 1.0, 1.5, 0.5, 1.0, 1.5])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
    w = effective_pg_weight(ratio, adv, 0.2, 0.28)
    assert w.tolist() == [0.5, 1.0, 0.0, 0.0, -1.0, -1.5]


def test_effective_weight_is_zero_in_the_dual_clip_region():
    """A < 0 and ratio > c: verl's dual clip makes the loss the constant -A c, so no gradient flows."""
    ratio = torch.tensor([2.0, 9.0, 11.0, 50.0, 11.0], dtype=torch.float64)
    adv = torch.tensor([-1.0, -1.0, -1.0, -2.0, 1.0], dtype=torch.float64)
    w = effective_pg_weight(ratio, adv, 0.2, 0.28, clip_ratio_c=10.0)
    # without a dual clip (the earlier behaviour) the two tokens above c kept rho * A
    assert w.tolist() == [-2.0, -9.0, 0.0, 0.0, 0.0]
    assert effective_pg_weight(ratio, adv, 0.2, 0.28).tolist() == [-2.0, -9.0, -11.0, -100.0, 0.0]


@pytest.mark.parametrize("seed", range(3))
def test_effective_weight_is_the_autograd_weight_of_the_clipped_loss(seed):
    """d loss / d log_prob of the clipped loss (dual clip included) is -rho A where the weight is rho A."""
    old_lp, lp, adv, _, _ = with_old_policy(seed)
    lp = lp.clone().requires_grad_(True)
    losses, _ = clipped_pg_losses(old_lp, lp, adv, **CLIP)
    losses.sum().backward()
    ratio = torch.exp(lp.detach() - old_lp)
    weight = effective_pg_weight(ratio, adv, 0.2, 0.28, clip_ratio_c=10.0)
    inside = (lp.detach() - old_lp).abs() < 20.0
    torch.testing.assert_close(lp.grad[inside], -weight[inside], rtol=1e-12, atol=1e-15)
    assert ((adv < 0) & (ratio > 10.0)).any()  # the dual-clip region is exercised


def test_grad_norm_lower_bound_is_the_closed_form_and_below_the_exact_norm():
    logits, token_ids, weight = _random_logits(7, vocab=120)
    # one likely token of middling entropy, where the closed form is negative: p = 0.9, the rest spread evenly
    logits[0] = torch.cat([torch.tensor([8.0]), torch.full((119,), 8.0 - math.log(0.9 / 0.1 * 119))])
    token_ids[0] = 0
    probs = torch.softmax(logits, dim=-1)
    entropy = -(probs * torch.log(probs)).sum(-1)
    p = probs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    lower = grad_norm_sq_lower_bound(p, entropy, weight)
    for k in range(len(p)):
        w, pk, h = float(weight[k]), float(p[k]), float(entropy[k])
        assert float(lower[k]) == pytest.approx(w * w * max(0.0, 1 - 2 * pk + math.exp(-h)), rel=1e-12, abs=0.0)
    assert 1 - 2 * float(p[0]) + math.exp(-float(entropy[0])) < -0.1 and float(lower[0]) == 0.0
    assert (lower <= logit_grad_norm_sq(logits, token_ids, weight) * (1 + 1e-12)).all()
    assert lower.dtype == torch.float64


@pytest.mark.parametrize("seed", range(3))
def test_exact_norm_shares_match_autograd_norms(seed):
    """The silenced tokens' share of the exact logit-gradient norm |A| ||e_a - pi|| (and of its square) over the
    positive-advantage tokens, against per-token autograd gradients summed in a loop."""
    from stapo.algorithm.gradnorm import collision_probability, exact_norm_shares

    logits, token_ids, _ = _random_logits(seed, vocab=50)
    g = torch.Generator().manual_seed(seed + 7)
    tokens = logits.shape[0]
    advantages = torch.randn(tokens, generator=g, dtype=torch.float64)
    advantages[:3] = 0.0
    silenced = torch.rand(tokens, generator=g) < 0.3
    mask = torch.rand(tokens, generator=g) < 0.9
    p = torch.softmax(logits, dim=-1).gather(-1, token_ids[:, None])[:, 0]
    got = exact_norm_shares(p, collision_probability(logits), advantages, silenced, mask)
    norms = {"all": 0.0, "silenced": 0.0, "all_sq": 0.0, "silenced_sq": 0.0}
    for k in range(tokens):
        if not (mask[k] and advantages[k] > 0):
            continue
        row = logits[k].clone().requires_grad_(True)
        (advantages[k] * torch.log_softmax(row, dim=-1)[token_ids[k]]).backward()
        sq = float(row.grad.pow(2).sum())
        norms["all"] += math.sqrt(sq)
        norms["all_sq"] += sq
        if silenced[k]:
            norms["silenced"] += math.sqrt(sq)
            norms["silenced_sq"] += sq
    assert got["grad_norm_share_spurious"] == pytest.approx(norms["silenced"] / norms["all"], rel=1e-9)
    assert got["grad_norm_sq_share_spurious"] == pytest.approx(norms["silenced_sq"] / norms["all_sq"], rel=1e-9)
    nothing = exact_norm_shares(p, collision_probability(logits), -advantages.abs(), silenced, mask)
    assert math.isnan(nothing["grad_norm_share_spurious"]) and math.isnan(nothing["grad_norm_sq_share_spurious"])
