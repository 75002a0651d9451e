"""S2T (Silencing Spurious Tokens): which response tokens STAPO drops from the policy gradient.

docs/algorithm.md section 2. A response token is a *candidate* when its advantage is positive and its probability
is below ``tau_p``; it is *spurious* when, in addition, its entropy is below ``tau_h``, the
``entropy_quantile``-quantile of the candidates' entropies over the whole detection scope (every
rank of ``group``). Inequalities are strict; an empty candidate set masks nothing.

Pure torch, no verl: tensors in, tensors and floats out. Shapes are ``(batch, response_len)``;
``advantages`` may also be ``(batch,)`` (one value per response, broadcast over its tokens).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from stapo.algorithm.quantile import all_reduce_sum, global_quantile
from stapo.algorithm.validation import PAPER_ENTROPY_QUANTILE, PAPER_TAU_P, check_entropy_quantile, check_tau_p


@dataclass(frozen=True)
class S2TDetection:
    """The outcome of one detection: the mask and the threshold it used."""

    spurious: torch.Tensor  # bool, True = silenced
    candidates: torch.Tensor  # bool, A > 0 and p < tau_p on a response token
    tau_h: float  # NaN when the detection scope holds no candidate
    num_candidates: int  # over the whole scope (all ranks)
    parts: CandidateParts | None = None  # the candidate rule's tensors (detect_spurious sets them)


def broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Token-level advantages; a ``(batch,)`` tensor (one value per response) is broadcast over tokens."""
    if advantages.shape == like.shape:
        return advantages
    if advantages.dim() == 1 and advantages.shape[0] == like.shape[0]:
        return advantages.unsqueeze(-1).expand_as(like)
    raise ValueError(
        f"advantages must have shape {tuple(like.shape)} or ({like.shape[0]},), got {tuple(advantages.shape)}"
    )


def _check_shapes(log_prob: torch.Tensor, entropy: torch.Tensor, response_mask: torch.Tensor) -> None:
    if entropy.shape != log_prob.shape or response_mask.shape != log_prob.shape:
        raise ValueError(
            "log_prob, entropy and response_mask must share one shape, got "
            f"{tuple(log_prob.shape)}, {tuple(entropy.shape)}, {tuple(response_mask.shape)}"
        )


@dataclass(frozen=True)
class CandidateParts:
    """The candidate rule and the two intermediate tensors it is made of (the ``stapo`` mask's quadrant
    counts reuse them instead of computing them again over the whole batch)."""

    positive: torch.Tensor  # bool, a response token with A > 0
    prob: torch.Tensor  # exp(log_prob), in the log-probs' dtype
    candidates: torch.Tensor  # bool, positive and prob < tau_p


def candidate_parts(
    log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, tau_p: float
) -> CandidateParts:
    """Response tokens with a positive advantage, a finite log-prob and probability ``exp(log_prob) < tau_p``,
    with the two intermediate tensors of that rule."""
    check_tau_p(tau_p)
    advantages = broadcast_advantages(advantages, log_prob)
    positive = response_mask.bool() & (advantages > 0)
    prob = torch.exp(log_prob)
    # exp(-inf) = 0 < tau_p would make a token of log-prob -inf a candidate; the rule says a token whose
    # log-probability is not finite never is (docs/algorithm.md section 2). NaN and +inf fail `prob < tau_p`.
    return CandidateParts(positive, prob, positive & (prob < tau_p) & (log_prob != -math.inf))


def detect_spurious(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_p: float = PAPER_TAU_P,
    entropy_quantile: float = PAPER_ENTROPY_QUANTILE,
    group: dist.ProcessGroup | None = None,
) -> S2TDetection:
    """Build the S2T mask; ``group=None`` makes this process the whole detection scope.

    Candidates whose entropy is not finite take no part in the threshold and are never masked
    (a NaN cannot be ranked); the ``stapo`` entry of ``stapo.algorithm.masks`` counts them.
    """
    check_entropy_quantile(entropy_quantile)
    _check_shapes(log_prob, entropy, response_mask)
    with torch.no_grad():
        parts = candidate_parts(log_prob, advantages, response_mask, tau_p)
    return dataclasses.replace(spurious_among(parts.candidates, entropy, entropy_quantile, group), parts=parts)


def spurious_among(
    candidates: torch.Tensor, entropy: torch.Tensor, entropy_quantile: float, group: dist.ProcessGroup | None = None
) -> S2TDetection:
    """The second half of :func:`detect_spurious`: the candidates below ``tau_h`` (any shape).

    Works at the candidates' positions only, a small share of a batch: their
    entropies are read once by index, and a non-finite one leaves the candidate set.
    """
    check_entropy_quantile(entropy_quantile)
    if entropy.shape != candidates.shape:  # positions are read by flat index: a mismatch would read wrong tokens
        raise ValueError(
            f"entropy and candidates must share one shape, got {tuple(entropy.shape)} and {tuple(candidates.shape)}"
        )
    with torch.no_grad():
        candidates = candidates.bool().contiguous()
        positions = candidates.view(-1).nonzero().squeeze(1)
        candidate_entropy = entropy.reshape(-1)[positions]
        finite = torch.isfinite(candidate_entropy)
        if not bool(finite.all()):
            candidates = candidates.clone()
            candidates.view(-1)[positions[~finite]] = False
            positions, candidate_entropy = positions[finite], candidate_entropy[finite]
        # on the tensors' device: a NCCL group cannot all-reduce a CPU tensor
        count = torch.tensor(candidate_entropy.numel(), device=entropy.device)
        num_candidates = int(all_reduce_sum(count, group).item())
        tau_h = global_quantile(candidate_entropy, entropy_quantile, group)
        spurious = torch.zeros(candidates.shape, dtype=torch.bool, device=candidates.device)
        if not math.isnan(tau_h):
            # compared in float64 (tau_h interpolates between two entropies and may not be a float32),
            # but only at the candidates: no full-batch float64 copy
            spurious.view(-1)[positions] = candidate_entropy.to(torch.float64) < tau_h
    return S2TDetection(spurious=spurious, candidates=candidates, tau_h=tau_h, num_candidates=num_candidates)

