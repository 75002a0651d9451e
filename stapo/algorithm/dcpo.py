"""DCPO (arXiv 2509.02333): PPO's clip bounds set per token from the old probability of the sampled token.

docs/algorithm.md section 7. PPO clips the ratio ``r = p / q`` to the same ``[1 - eps_low, 1 + eps_high]`` for
every token, which lets a likely token move its probability far more than an unlikely one. DCPO bounds the
change of probability instead, ``|(r - 1) q| <= eps`` in the authors' README form, solved per token:

    low  = 1/2 + 1/2 sqrt(max(1 - 4 eps_low / q, 0))
    high = min(1/2 + 1/2 sqrt(1 + 4 eps_high / q), max(c, 10))

with ``c`` the dual-clip constant (the cap ``max(c, 10)`` is the authors' code, ``get_clip_low_high``, not the
paper's text). The per-token loss is PPO's with these bounds and verl's dual clip,
``max(-A r, -A clip(r, low, high))``, capped at ``-A c`` for ``A < 0`` (the authors' ``clip_type: dynamic``).
``low`` is in ``[1/2, 1]`` and ``high`` in ``[1, max(c, 10)]``, so the clip range always contains 1.

A probability ``q`` that underflows to 0 gets ``low = 1`` and ``high = max(c, 10)``, as the authors' code.
The log-ratio is clamped to ``[-20, 20]`` before the exponential, as verl's vanilla loss and this project's
``masked_clip`` (the authors' DCPO loss dropped that clamp; it only matters beyond ``r = e^20``). Pure torch.
"""

from __future__ import annotations

import torch

from stapo.algorithm.loss import LOG_RATIO_LIMIT, outside_mask_zeroed
from stapo.algorithm.validation import STAPOConfigError

DCPO_HIGH_CAP = 10.0  # the upper bound never exceeds max(clip_ratio_c, this) (get_clip_low_high)


def dcpo_ratio_bounds(
    old_log_prob: torch.Tensor, eps_low: float, eps_high: float, clip_ratio_c: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(low, high)`` ratio bounds from the old log-probability (detached), in its dtype."""
    q = torch.exp(old_log_prob.detach())
    zero = q == 0
    safe_q = torch.where(zero, torch.ones_like(q), q)  # no division by 0; those tokens are set below
    low = 0.5 + 0.5 * torch.sqrt((1.0 - 4.0 * eps_low / safe_q).clamp(min=0.0))
    high = 0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high / safe_q)
    cap = max(clip_ratio_c, DCPO_HIGH_CAP)
    low = torch.where(zero, torch.ones_like(low), low)
    high = torch.where(zero, torch.full_like(high, cap), high.clamp(max=cap))
    return low, high


def dcpo_pg_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    clip_ratio_c: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DCPO's per-token losses over ``mask`` (0 elsewhere, no path for a NaN outside it), times the optional
    per-token ``weights`` (verl's rollout importance weights), and the flags ``clipped`` (the clipped branch is
    the larger loss), ``dual_clipped``, ``log_ratio``, ``low`` and ``high`` (the bounds)."""
    if clip_ratio_c <= 1.0:
        raise STAPOConfigError(f"clip_ratio_c must be > 1 (dual-clip constant, DCPO's script: 10), got {clip_ratio_c}")
    old_in, log_in, adv_in, weights_in = outside_mask_zeroed(mask, old_log_prob, log_prob, advantages, weights)
    old_in, adv_in = old_in.detach(), adv_in.detach()
    low, high = dcpo_ratio_bounds(old_in, eps_low, eps_high, clip_ratio_c)
    log_ratio = torch.clamp(log_in - old_in, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -adv_in * ratio
    clipped = -adv_in * torch.clamp(ratio, low, high)
    ppo = torch.maximum(unclipped, clipped)
    cap = -adv_in * clip_ratio_c
    pg_losses = torch.where(adv_in < 0, torch.minimum(ppo, cap), ppo)
    if weights_in is not None:
        pg_losses = pg_losses * weights_in
    flags = {
        "clipped": clipped > unclipped,
        "dual_clipped": (adv_in < 0) & (ppo > cap),
        "log_ratio": log_ratio,
        "low": low,
        "high": high,
    }
    return pg_losses * mask.to(pg_losses.dtype), flags
