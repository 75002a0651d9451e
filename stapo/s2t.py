"""S2T (Silencing Spurious Tokens): which response tokens STAPO drops from the policy gradient.

Spec section 2. A response token is a *candidate* when its advantage is positive and its probability
is below ``tau_p``; it is *spurious* when, in addition, its entropy is below ``tau_h``, the
``entropy_quantile``-quantile of the candidates' entropies over the whole detection scope (every
rank of ``group``). Inequalities are strict; an empty candidate set masks nothing.

Pure torch, no verl: tensors in, tensors and floats out. Shapes are ``(batch, response_len)``;
``advantages`` may also be ``(batch,)`` (one value per response, broadcast over its tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from stapo.quantile import all_reduce_sum, global_quantile, linear_quantile
from stapo.validation import check_entropy_quantile, check_tau_p

ENTROPY_PERCENTILES = (0.5, 0.8, 0.95)


@dataclass(frozen=True)
class S2TDetection:
    """The outcome of one detection: the mask and the threshold it used."""

    spurious: torch.Tensor  # bool, True = silenced
    candidates: torch.Tensor  # bool, A > 0 and p < tau_p on a response token
    tau_h: float  # NaN when the detection scope holds no candidate
    num_candidates: int  # over the whole scope (all ranks)


def _broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
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


def candidate_mask(
    log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, tau_p: float
) -> torch.Tensor:
    """Response tokens with a positive advantage and probability ``exp(log_prob) < tau_p``."""
    check_tau_p(tau_p)
    advantages = _broadcast_advantages(advantages, log_prob)
    return response_mask.bool() & (advantages > 0) & (torch.exp(log_prob) < tau_p)


def detect_spurious(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_p: float = 0.002,
    entropy_quantile: float = 0.75,
    group: dist.ProcessGroup | None = None,
) -> S2TDetection:
    """Build the S2T mask; ``group=None`` makes this process the whole detection scope.

    Candidates whose entropy is not finite take no part in the threshold and are never masked
    (a NaN cannot be ranked); callers that care count them with :func:`s2t_diagnostics`.
    """
    check_entropy_quantile(entropy_quantile)
    _check_shapes(log_prob, entropy, response_mask)
    with torch.no_grad():
        candidates = candidate_mask(log_prob, advantages, response_mask, tau_p)
        candidates = candidates & torch.isfinite(entropy)
        candidate_entropy = entropy[candidates]
        num_candidates = int(all_reduce_sum(torch.tensor(candidate_entropy.numel()), group).item())
        tau_h = global_quantile(candidate_entropy, entropy_quantile, group)
        if math.isnan(tau_h):
            spurious = torch.zeros_like(candidates)
        else:
            spurious = candidates & (entropy.to(torch.float64) < tau_h)
    return S2TDetection(spurious=spurious, candidates=candidates, tau_h=tau_h, num_candidates=num_candidates)


def spurious_mask(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_p: float = 0.002,
    entropy_quantile: float = 0.75,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """True where a token is spurious (same shape as ``log_prob``). See :func:`detect_spurious`."""
    return detect_spurious(log_prob, entropy, advantages, response_mask, tau_p, entropy_quantile, group).spurious


def s2t_diagnostics(
    detection: S2TDetection,
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_p: float,
) -> dict[str, float]:
    """Spec section 4 statistics of one detection, over the tokens this process holds.

    Keys are short (``mask_ratio``, ``tau_h``, ...); the verl glue prefixes them ``actor/stapo/``.
    The quadrants split positive-advantage tokens by probability at ``tau_p`` and by entropy at
    ``tau_h``; with no candidates ``tau_h`` is undefined and the split falls back to the median
    entropy of those tokens (``quadrant_entropy_split`` records the value used).
    """
    with torch.no_grad():
        mask = response_mask.bool()
        advantages = _broadcast_advantages(advantages, log_prob)
        positive = mask & (advantages > 0)
        low_prob = torch.exp(log_prob) < tau_p
        finite = torch.isfinite(entropy)
        num_tokens = int(mask.sum())
        num_positive = int(positive.sum())
        num_spurious = int(detection.spurious.sum())
        response_entropy = entropy[mask & finite]
        metrics = {
            "mask_ratio": num_spurious / num_tokens if num_tokens else 0.0,
            "num_spurious": float(num_spurious),
            "num_candidates": float(detection.num_candidates),
            "num_candidates_local": float(detection.candidates.sum()),
            "tau_h": detection.tau_h,
            "positive_low_prob_frac": float((positive & low_prob).sum()) / num_positive if num_positive else 0.0,
            # how often the degenerate cases of issue 8 happened in this batch (all over response tokens):
            # a NaN/inf entropy is never ranked nor masked, a NaN log-prob is never a candidate, a
            # non-finite advantage fails the loss; zero advantages (a group with one reward) and empty
            # responses (verl's padding samples, instant EOS) are legal but carry no signal
            "nonfinite_entropy": float((mask & ~finite).sum()),
            "nonfinite_log_prob": float((mask & ~torch.isfinite(log_prob)).sum()),
            "nonfinite_advantage": float((mask & ~torch.isfinite(advantages)).sum()),
            "zero_advantage_fraction": float((mask & (advantages == 0)).sum()) / num_tokens if num_tokens else 0.0,
            "empty_responses": float((~mask.any(dim=-1)).sum()) if mask.dim() > 1 else float(not mask.any()),
            "num_response_tokens": float(num_tokens),
        }
        for p in ENTROPY_PERCENTILES:
            metrics[f"entropy_p{round(p * 100)}"] = linear_quantile(response_entropy, p)
        split = detection.tau_h
        if math.isnan(split):
            split = linear_quantile(entropy[positive & finite], 0.5)
        metrics["quadrant_entropy_split"] = split
        low_entropy = entropy.to(torch.float64) < split
        for prob_name, prob_sel in (("lowp", low_prob), ("highp", ~low_prob)):
            for ent_name, ent_sel in (("lowh", low_entropy), ("highh", ~low_entropy)):
                metrics[f"quadrant/{prob_name}_{ent_name}"] = float((positive & prob_sel & ent_sel).sum())
    return metrics
