"""The S2T mask and the exact quantile against loops, float64 and numpy.quantile."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stapo.algorithm.quantile import linear_quantile
from stapo.algorithm.s2t import candidate_parts, detect_spurious, spurious_among
from stapo.algorithm.validation import STAPOConfigError
from tests.reference import reference_candidates, reference_spurious


def random_batch(seed: int, rows: int = 12, cols: int = 40, low_prob_share: float = 0.3):
    """Fresh inputs with many sub-tau_p tokens, padding, a fully masked row and zero advantages."""
    g = torch.Generator().manual_seed(seed)
    low = torch.empty(rows, cols).uniform_(math.log(1e-6), math.log(0.002), generator=g)
    high = torch.empty(rows, cols).uniform_(math.log(0.002), 0.0, generator=g)
    pick_low = torch.rand(rows, cols, generator=g) < low_prob_share
    log_prob = torch.where(pick_low, low, high)
    entropy = torch.rand(rows, cols, generator=g) * 4.0
    signs = torch.tensor([1.0 if i % 3 else -1.0 for i in range(rows)])  # two thirds positive
    row_adv = torch.randn(rows, generator=g).abs() * signs
    row_adv[0] = 0.0  # a group with equal rewards
    advantages = row_adv.unsqueeze(-1).expand(rows, cols).clone()
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    lengths[1] = 0  # every token of a row masked
    response_mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(-1)
    return log_prob, entropy, advantages, response_mask


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("q", [0.75, 0.8, 0.5, 0.1, 1.0])
def test_mask_matches_loop_reference(seed, q):
    log_prob, entropy, advantages, response_mask = random_batch(seed)
    detection = detect_spurious(log_prob, entropy, advantages, response_mask, tau_p=0.002, entropy_quantile=q)
    expected, tau_h = reference_spurious(
        log_prob.tolist(), entropy.tolist(), advantages.tolist(), response_mask.tolist(), 0.002, q
    )
    assert detection.spurious.tolist() == expected
    assert detection.tau_h == tau_h  # bit-exact with numpy's linear method
    assert detection.num_candidates > 10  # the inputs really exercise the threshold
    assert detection.spurious.dtype == torch.bool and detection.spurious.shape == log_prob.shape


def test_only_positive_advantage_response_tokens_are_masked():
    log_prob, entropy, advantages, response_mask = random_batch(123, rows=30, cols=60)
    mask = detect_spurious(log_prob, entropy, advantages, response_mask).spurious
    assert mask.any()
    assert not (mask & (advantages <= 0)).any()
    assert not (mask & ~response_mask).any()
    assert not (mask & (torch.exp(log_prob) >= 0.002)).any()


def test_per_row_advantages_broadcast_like_token_advantages():
    log_prob, entropy, advantages, response_mask = random_batch(5)
    per_row = advantages[:, 0].clone()
    assert torch.equal(
        detect_spurious(log_prob, entropy, per_row, response_mask).spurious,
        detect_spurious(log_prob, entropy, advantages, response_mask).spurious,
    )


def test_no_candidates_masks_nothing():
    log_prob, entropy, advantages, response_mask = random_batch(1)
    detection = detect_spurious(log_prob.clamp(min=math.log(0.01)), entropy, advantages, response_mask)
    assert detection.num_candidates == 0 and math.isnan(detection.tau_h)
    assert not detection.spurious.any()


def test_zero_advantages_mask_nothing():
    log_prob, entropy, advantages, response_mask = random_batch(2)
    assert not detect_spurious(log_prob, entropy, torch.zeros_like(advantages), response_mask).spurious.any()


def test_one_candidate_is_never_below_its_own_threshold():
    log_prob = torch.full((2, 4), -0.1)
    log_prob[0, 2] = math.log(1e-4)
    entropy = torch.rand(2, 4)
    detection = detect_spurious(log_prob, entropy, torch.ones(2, 4), torch.ones(2, 4, dtype=torch.bool))
    assert detection.num_candidates == 1
    assert detection.tau_h == pytest.approx(float(entropy[0, 2]))
    assert not detection.spurious.any()  # strict inequality


def test_ties_at_threshold_are_kept():
    # candidates' entropies [1, 2, 2, 2, 3]: the 0.5-quantile is exactly 2, only the 1 is below it
    log_prob = torch.full((1, 5), math.log(1e-4))
    entropy = torch.tensor([[2.0, 1.0, 2.0, 3.0, 2.0]])
    detection = detect_spurious(
        log_prob, entropy, torch.ones(1, 5), torch.ones(1, 5, dtype=torch.bool), entropy_quantile=0.5
    )
    assert detection.tau_h == 2.0
    assert detection.spurious.tolist() == [[False, True, False, False, False]]


def test_probability_exactly_tau_p_is_not_a_candidate():
    tau_p = 0.25  # exactly representable, so exp(log(tau_p)) == tau_p
    log_prob = torch.tensor([[math.log(tau_p), math.log(0.1), math.log(0.1)]], dtype=torch.float64)
    assert math.exp(math.log(tau_p)) == tau_p
    detection = detect_spurious(
        log_prob, torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64), torch.ones(1, 3),
        torch.ones(1, 3, dtype=torch.bool), tau_p=tau_p,
    )
    assert detection.candidates.tolist() == [[False, True, True]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nonfinite_log_prob_is_never_a_candidate(dtype):
    """exp(-inf) = 0 < tau_p: a token of log-prob -inf would pass the probability test; the rule
    (docs/algorithm.md section 2) says a non-finite log-prob is never a candidate, nor silenced."""
    log_prob, entropy, advantages, response_mask = random_batch(11)
    log_prob, entropy = log_prob.to(dtype), entropy.to(dtype)
    advantages = advantages.abs() + 0.1
    response_mask[:, :6] = True
    log_prob[2, :3] = -math.inf
    log_prob[4, 0], log_prob[4, 1] = math.nan, math.inf
    entropy[2, :3] = 0.0  # the lowest entropy of the batch: silenced if it were a candidate
    detection = detect_spurious(log_prob, entropy, advantages, response_mask, entropy_quantile=1.0)
    expected, tau_h = reference_spurious(
        log_prob.tolist(), entropy.tolist(), advantages.tolist(), response_mask.tolist(), 0.002, 1.0
    )
    assert not detection.candidates[2, :3].any() and not detection.candidates[4, :2].any()
    assert not detection.spurious[2, :3].any()
    assert detection.spurious.tolist() == expected and detection.tau_h == tau_h
    assert detection.spurious.any()


def test_nan_entropy_is_neither_ranked_nor_masked():
    log_prob, entropy, advantages, response_mask = random_batch(9)
    entropy[3, :5] = float("nan")
    detection = detect_spurious(log_prob, entropy, advantages.abs() + 0.1, response_mask)
    assert math.isfinite(detection.tau_h)
    assert not detection.spurious[3, :5].any()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"tau_p": 0.0}, "tau_p"),
        ({"tau_p": 1.0}, "tau_p"),
        ({"tau_p": float("nan")}, "tau_p"),
        ({"entropy_quantile": 0.0}, "entropy_quantile"),
        ({"entropy_quantile": 1.5}, "entropy_quantile"),
    ],
)
def test_bad_settings_name_the_setting_and_range(kwargs, name):
    log_prob, entropy, advantages, response_mask = random_batch(0)
    with pytest.raises(STAPOConfigError, match=rf"{name} must"):
        detect_spurious(log_prob, entropy, advantages, response_mask, **kwargs).spurious


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="share one shape"):
        detect_spurious(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2), torch.ones(2, 3, dtype=torch.bool))
    # the second half alone reads entropies by flat position: (3, 2) has as many values as (2, 3) but
    # other tokens at them, so it must be refused, not read
    with pytest.raises(ValueError, match="share one shape"):
        spurious_among(torch.ones(2, 3, dtype=torch.bool), torch.zeros(3, 2), 0.75)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 1001])
@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.7, 0.75, 0.8, 0.95, 1.0])
def test_linear_quantile_is_bit_exact_with_numpy(n, q):
    values = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
    assert linear_quantile(values, q) == float(np.quantile(values.double().numpy(), q))


def test_linear_quantile_with_duplicates_and_empty():
    values = torch.tensor([3.0, 1.0, 1.0, 1.0, 2.0, 2.0])
    for q in (0.2, 0.5, 0.6, 0.9):
        assert linear_quantile(values, q) == float(np.quantile(values.double().numpy(), q))
    assert math.isnan(linear_quantile(torch.tensor([]), 0.5))


def test_linear_quantile_above_torch_quantile_limit():
    n = 2**24 + 3  # torch.quantile refuses inputs this large
    values = torch.rand(n, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError):
        torch.quantile(values, 0.75)
    assert linear_quantile(values, 0.75) == float(np.quantile(values.double().numpy(), 0.75))


def test_candidates_are_the_loop_references_candidates_including_nonfinite_entropy():
    """The candidate rule ignores entropy; detect_spurious' candidates also need a finite entropy to rank."""
    log_prob, entropy, advantages, response_mask = random_batch(4)
    entropy[2:5, :6] = float("nan")
    advantages = advantages.abs() + 0.1
    expected = {(i, t) for i, t, _ in reference_candidates(
        log_prob.tolist(), entropy.tolist(), advantages.tolist(), response_mask.tolist(), 0.002
    )}
    detection = detect_spurious(log_prob, entropy, advantages, response_mask)
    assert {tuple(x) for x in detection.candidates.nonzero().tolist()} == expected
    plain = candidate_parts(log_prob, advantages, response_mask, 0.002).candidates
    assert (plain & ~detection.candidates).any()  # the NaN-entropy candidates, left out of the threshold
    assert not (plain & ~detection.candidates & torch.isfinite(entropy)).any()
    assert detection.num_candidates == len(expected)
