"""The STAPO objective, its gradient, the 20-Entropy baseline and the gradient-norm identity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stapo.gradnorm import effective_pg_weight, grad_norm_bounds, logit_grad_norm_sq
from stapo.loss import clipped_pg_losses, entropy20_loss, high_entropy_keep_mask, stapo_loss
from stapo.s2t import spurious_mask
from tests.reference import reference_clipped_token_loss, reference_spurious, reference_stapo_loss
from tests.unit.test_s2t import random_batch

CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}


def with_old_policy(seed: int, rows: int = 12, cols: int = 40):
    log_prob, entropy, advantages, response_mask = random_batch(seed, rows, cols)
    g = torch.Generator().manual_seed(seed + 1000)
    # ratios spread over both clip edges and the dual-clip region
    old_log_prob = log_prob + torch.empty(rows, cols).uniform_(-3.0, 3.0, generator=g)
    return old_log_prob.double(), log_prob.double(), advantages.double(), response_mask, entropy.double()


def reference_gradient(old_lp, lp, adv, response_mask, entropy, tau_p, q):
    """d loss / d log_prob by hand: -A*rho/N where the unclipped branch is the active one, else 0."""
    spurious, _ = reference_spurious(lp, entropy, adv, response_mask, tau_p, q)
    valid = [(i, t) for i in range(len(lp)) for t in range(len(lp[0])) if response_mask[i][t] and not spurious[i][t]]
    grad = [[0.0] * len(lp[0]) for _ in lp]
    for i, t in valid:
        raw = lp[i][t] - old_lp[i][t]
        if abs(raw) >= 20.0:
            continue  # the log-ratio clamp stops the gradient
        ratio, a = math.exp(raw), adv[i][t]
        unclipped, clipped = -a * ratio, -a * min(max(ratio, 0.8), 1.28)
        if clipped > unclipped:
            continue  # the clipped branch is constant in log_prob
        if a < 0 and unclipped > -a * 10.0:
            continue  # dual clip: constant
        grad[i][t] = -a * ratio / len(valid)
    return grad


@pytest.mark.parametrize("seed", range(6))
def test_stapo_loss_matches_loop_reference(seed):
    old_lp, lp, adv, mask, entropy = with_old_policy(seed)
    loss, metrics = stapo_loss(old_lp, lp, adv, mask, entropy, tau_p=0.002, entropy_quantile=0.75, **CLIP)
    expected = reference_stapo_loss(
        old_lp.tolist(), lp.tolist(), adv.tolist(), mask.tolist(), entropy.tolist(), 0.002, 0.75, 0.2, 0.28, 10.0
    )
    assert float(loss) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert metrics["num_spurious"] > 0  # the mask really changed the objective
    assert metrics["num_valid"] == int(mask.sum()) - metrics["num_spurious"]


@pytest.mark.parametrize("seed", range(4))
def test_stapo_gradient_matches_hand_derivative(seed):
    old_lp, lp, adv, mask, entropy = with_old_policy(seed)
    lp = lp.clone().requires_grad_(True)
    loss, _ = stapo_loss(old_lp, lp, adv, mask, entropy, **CLIP)
    loss.backward()
    expected = reference_gradient(old_lp.tolist(), lp.detach().tolist(), adv.tolist(), mask.tolist(), entropy.tolist(), 0.002, 0.75)
    np.testing.assert_allclose(lp.grad.numpy(), np.array(expected), rtol=1e-10, atol=1e-14)
    silenced = spurious_mask(lp.detach(), entropy, adv, mask)
    assert silenced.any() and (lp.grad[silenced] == 0).all()


def test_gradient_flows_through_log_prob_only():
    old_lp, lp, adv, mask, entropy = with_old_policy(3)
    lp = lp.clone().requires_grad_(True)
    entropy = entropy.clone().requires_grad_(True)
    old_lp = old_lp.clone().requires_grad_(True)
    stapo_loss(old_lp, lp, adv, mask, entropy)[0].backward()
    assert lp.grad is not None and lp.grad.abs().sum() > 0
    assert entropy.grad is None and old_lp.grad is None


def test_all_tokens_masked_gives_zero_loss_with_a_graph():
    old_lp, lp, adv, mask, entropy = with_old_policy(0)
    lp = lp.clone().requires_grad_(True)
    loss, metrics = stapo_loss(old_lp, lp, adv, torch.zeros_like(mask), entropy)
    assert float(loss.detach()) == 0.0 and metrics["mask_ratio"] == 0.0
    loss.backward()
    assert (lp.grad == 0).all()


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


@pytest.mark.parametrize("renormalise", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_entropy20_against_numpy(seed, renormalise):
    old_lp, lp, adv, mask, entropy = with_old_policy(seed)
    loss, metrics = entropy20_loss(old_lp, lp, adv, mask, entropy, top_fraction=0.2, renormalise=renormalise, **CLIP)
    response_entropy = entropy[mask].numpy()
    threshold = np.quantile(response_entropy, 0.8)
    total, kept = 0.0, 0
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if mask[i, t] and float(entropy[i, t]) >= threshold:
                total += reference_clipped_token_loss(float(old_lp[i, t]), float(lp[i, t]), float(adv[i, t]), 0.2, 0.28, 10.0)
                kept += 1
    denominator = kept if renormalise else int(mask.sum())
    assert float(loss) == pytest.approx(total / denominator, rel=1e-12)
    assert metrics["keep_ratio"] == pytest.approx(kept / int(mask.sum()))
    assert 0.19 <= metrics["keep_ratio"] <= 0.22


def test_entropy20_ties_at_threshold_are_kept_and_empty_keeps_nothing():
    entropy = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    assert high_entropy_keep_mask(entropy, mask, 0.2).all()
    assert not high_entropy_keep_mask(entropy, torch.zeros_like(mask), 0.2).any()


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
