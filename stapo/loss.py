"""The STAPO objective and the paper's baseline masks, as pure functions over tensors.

Spec section 3:  L = -(1 / sum valid) * sum valid * min(rho A, clip(rho, 1-eps_low, 1+eps_high) A),
with verl's dual clip (for A < 0 the per-token loss is capped at -A * clip_ratio_c).

Shapes are ``(batch, response_len)``. Detection uses detached tensors: the mask is data, only
``log_prob`` carries gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from stapo.quantile import global_quantile
from stapo.s2t import detect_spurious, s2t_diagnostics
from stapo.validation import STAPOConfigError, check_top_fraction

LOG_RATIO_LIMIT = 20.0  # same clamp as verl, so exp() cannot overflow on a stale old_log_prob


def clipped_pg_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 10.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO losses with clip-higher and dual clip, plus the boolean masks of which clip bit.

    Returns ``(pg_losses, flags)`` where flags hold ``clipped`` (the clipped branch is the larger
    loss), ``dual_clipped`` (A < 0 and the dual-clip cap is active) and ``log_ratio``.
    """
    if clip_ratio_c <= 1.0:
        raise STAPOConfigError(f"clip_ratio_c must be > 1 (dual-clip constant, paper: 10), got {clip_ratio_c}")
    # old_log_prob and advantages are data: detached, so only log_prob can carry gradient
    old_log_prob, advantages = old_log_prob.detach(), advantages.detach()
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    ppo = torch.maximum(unclipped, clipped)
    cap = -advantages * clip_ratio_c
    pg_losses = torch.where(advantages < 0, torch.minimum(ppo, cap), ppo)
    flags = {
        "clipped": clipped > unclipped,
        "dual_clipped": (advantages < 0) & (ppo > cap),
        "log_ratio": log_ratio,
    }
    return pg_losses, flags


def outside_mask_zeroed(mask: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """``tensors`` with every position outside ``mask`` set to 0 (``None`` passes through).

    Why: a loss that multiplies by the mask afterwards still has NaN * 0 = NaN in its value and, in
    the backward pass, 0 * NaN = NaN in the gradient of the policy, so a non-finite value at a
    padded or silenced position (a stale old log-prob, an empty response) would poison the update
    without any token of the loss being non-finite. ``torch.where`` cuts both paths.
    """
    mask = mask.bool()
    zero = torch.zeros((), dtype=torch.float64)
    return [None if t is None else torch.where(mask, t, zero.to(dtype=t.dtype, device=t.device)) for t in tensors]


def nonfinite_report(loss: torch.Tensor, mask: torch.Tensor, **tensors: torch.Tensor | None) -> str:
    """The message of a refused update: how many loss tokens of each input are not finite."""
    mask = mask.bool()
    counts = {name: int((mask & ~torch.isfinite(t)).sum()) for name, t in tensors.items() if t is not None}
    return (
        f"policy loss is {float(loss.detach())} on this micro-batch: non-finite values among its {int(mask.sum())} "
        f"loss tokens: {counts}; the update is refused (check the reward, the advantage estimator and the "
        "rollout/actor log-probs of this batch)"
    )


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over ``mask``; 0 (still connected to the graph) when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def stapo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    entropy: torch.Tensor,
    tau_p: float = 0.002,
    entropy_quantile: float = 0.75,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 10.0,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The single-process STAPO objective (token-mean over valid tokens) and its diagnostics.

    Detection runs on the given (current) ``log_prob`` and ``entropy``, detached; ``group`` widens
    only the quantile's scope, the denominator stays this process's valid-token count. Values
    outside the valid tokens take no part; a non-finite value on a valid token raises
    ``FloatingPointError`` with the counts (never a silent NaN update).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_prob)
    detection = detect_spurious(
        log_prob.detach(), entropy.detach(), advantages, response_mask, tau_p, entropy_quantile, group
    )
    valid = response_mask.bool() & ~detection.spurious
    old_in, log_in, adv_in = outside_mask_zeroed(valid, old_log_prob, log_prob, advantages)
    pg_losses, flags = clipped_pg_losses(old_in, log_in, adv_in, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    loss = masked_token_mean(pg_losses, valid)
    if not torch.isfinite(loss):
        raise FloatingPointError(
            nonfinite_report(loss, valid, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages)
        )
    metrics = s2t_diagnostics(detection, log_prob.detach(), entropy.detach(), advantages, response_mask, tau_p)
    metrics["pg_clipfrac"] = float(masked_token_mean(flags["clipped"].float(), valid))
    metrics["num_valid"] = float(valid.sum())
    return loss, metrics


def high_entropy_keep_mask(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    top_fraction: float = 0.2,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """20-Entropy baseline ("Beyond the 80/20 rule"): keep response tokens in the top entropy band.

    Threshold = the (1 - top_fraction)-quantile of the entropy of all response tokens over the
    scope (every rank of ``group``); a token is kept when its entropy is >= the threshold, so
    ties at the threshold are kept. True = keep.
    """
    check_top_fraction(top_fraction)
    mask = response_mask.bool()
    with torch.no_grad():
        threshold = global_quantile(entropy[mask], 1.0 - top_fraction, group)
        if threshold != threshold:  # no response token anywhere
            return torch.zeros_like(mask)
        return mask & (entropy.to(torch.float64) >= threshold)


def entropy20_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    entropy: torch.Tensor,
    top_fraction: float = 0.2,
    renormalise: bool = False,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 10.0,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The 20-Entropy objective: the clipped loss on kept tokens only.

    ``renormalise=False`` is the original (denominator = all response tokens); ``True`` divides by
    the kept tokens, as STAPO does for its valid tokens.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_prob)
    keep = high_entropy_keep_mask(entropy.detach(), response_mask, top_fraction, group)
    old_in, log_in, adv_in = outside_mask_zeroed(keep, old_log_prob, log_prob, advantages)
    pg_losses, _ = clipped_pg_losses(old_in, log_in, adv_in, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    denominator = keep if renormalise else response_mask.bool()
    kept_sum = (pg_losses * keep.to(pg_losses.dtype)).sum()
    loss = kept_sum / denominator.sum().clamp(min=1).to(pg_losses.dtype)
    if not torch.isfinite(loss):
        raise FloatingPointError(
            nonfinite_report(loss, keep, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages)
        )
    num_tokens = int(response_mask.bool().sum())
    metrics = {"keep_ratio": float(keep.sum()) / num_tokens if num_tokens else 0.0}
    return loss, metrics
