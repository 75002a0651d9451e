"""DCPO (arXiv 2509.02333): PPO's clip bounds set per token from the old probability of the sampled token.

docs/algorithm.md section 7. PPO clips the ratio ``r = p / q`` to the same ``[1 - eps_low, 1 + eps_high]`` for
every token, which lets a likely token move its probability far more than an unlikely one. DCPO bounds the
change of probability instead, ``|(r - 1) q| <= eps`` in the authors' README form, solved per token:

    low  = 1/2 + 1/2 sqrt(max(1 - 4 eps_low / q, 0))
    high = min(1/2 + 1/2 sqrt(1 + 4 eps_high / q), max(c, 10))

with ``c`` the dual-clip constant (the cap ``max(c, 10)`` is the authors' code, ``get_clip_low_high``, not the
paper's text). The per-token loss is PPO's with these bounds and verl's dual clip,
``max(-A r, -A clip(r, low, high))``, capped at ``-A c`` for ``A < 0`` (the authors' ``clip_type: dynamic``):
``masked_clip``'s own arithmetic (``stapo.algorithm.loss.ratio_clipped_pg_losses``) with per-token bounds.
``low`` is in ``[1/2, 1]`` and ``high`` in ``[1, max(c, 10)]``, so the clip range always contains 1.

A probability ``q`` that underflows to 0 gets ``low = 1`` and ``high = max(c, 10)``, as the authors' code.
The log-ratio is clamped to ``[-20, 20]`` before the exponential, as verl's vanilla loss and this project's
``masked_clip`` (the authors' DCPO loss dropped that clamp; it only matters beyond ``r = e^20``). Pure torch.
"""

from __future__ import annotations

import torch

from stapo.algorithm.loss import outside_mask_zeroed, ratio_clipped_pg_losses, weighted_in_mask

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
    old_in, log_in, adv_in, weights_in = outside_mask_zeroed(mask, old_log_prob, log_prob, advantages, weights)
    low, high = dcpo_ratio_bounds(old_in, eps_low, eps_high, clip_ratio_c)
    pg_losses, flags = ratio_clipped_pg_losses(old_in, log_in, adv_in, low, high, clip_ratio_c)
    return weighted_in_mask(pg_losses, weights_in, mask), {**flags, "low": low, "high": high}
