"""Why spurious tokens dominate updates: the logit-gradient norm of one token (docs/algorithm.md section 5).

For a per-token objective ``w * log pi(y)``, the gradient w.r.t. the logits ``a`` is
``w * (e_y - pi)``, so

    ||grad||^2 = w^2 (1 - 2p + sum_v pi(v)^2),      log sum_v pi(v)^2 = LSE(2a) - 2 LSE(a)

and, with entropy H over a vocabulary of size |V|,

    w^2 max(0, 1 - 2p + e^-H)  <=  ||grad||^2  <=  w^2 (2 - 2p - C_V H^2),   C_V = (|V|-1) / (|V| (ln|V|)^2).

Low p and low H both push the norm up: the rare confident-context tokens STAPO silences.
``w`` is ``rho * A`` where the PPO clip is inactive and 0 where it is (no gradient).
"""

from __future__ import annotations

import math

import torch


def collision_probability(logits: torch.Tensor) -> torch.Tensor:
    """``sum_v pi(v)^2`` from logits over the last dim, without materialising a second softmax."""
    logits = logits.to(torch.float64)
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))


def logit_grad_norm_sq(logits: torch.Tensor, token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Squared norm of d(w * log pi(y)) / d logits, per token, via the closed form."""
    log_probs = torch.log_softmax(logits.to(torch.float64), dim=-1)
    p = torch.exp(log_probs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1))
    return weight.to(torch.float64) ** 2 * (1.0 - 2.0 * p + collision_probability(logits))


def grad_norm_sq_lower_bound(
    p: torch.Tensor, entropy: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``w^2 max(0, 1 - 2p + e^-H)``: the lower bound, which needs no vocabulary size (the S2T diagnostics
    use it, in the batch's own ``dtype`` to avoid a float64 copy of the batch). In place on one fresh
    tensor: at 31M tokens every temporary of the batch costs ~0.1 s.

    The closed form goes below 0 for a likely token of middling entropy (p = 0.9, H = 0.6 gives -0.25):
    a squared norm is never negative, so 0 is the tighter bound there, and a sum of bounds over tokens
    (the spurious tokens' share of it) stays a sum of non-negative terms."""
    p, entropy, weight = p.to(dtype), entropy.to(dtype), weight.to(dtype)
    return torch.neg(entropy).exp_().sub_(p, alpha=2.0).add_(1.0).clamp_(min=0.0).mul_(weight).mul_(weight)


def grad_norm_bounds(
    p: torch.Tensor, entropy: torch.Tensor, weight: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lower and upper bounds of the squared logit-gradient norm from (p, H, w) alone."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    p, entropy, w2 = p.to(torch.float64), entropy.to(torch.float64), weight.to(torch.float64) ** 2
    c_v = (vocab_size - 1) / (vocab_size * math.log(vocab_size) ** 2)
    upper = w2 * (2.0 - 2.0 * p - c_v * entropy**2)
    return grad_norm_sq_lower_bound(p, entropy, weight), upper


def effective_pg_weight(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
) -> torch.Tensor:
    """``rho * A`` where the clipped-surrogate gradient flows, 0 where a clip is active.

    The PPO clip stops the gradient for A > 0 above ``1 + eps_high`` and for A < 0 below
    ``1 - eps_low``; verl's dual clip (``clip_ratio_c``) caps the loss of A < 0 at ``-A c``, so above
    ``rho = c`` the loss is that constant and the gradient is 0 as well.
    """
    clipped = ((advantages > 0) & (ratio > 1.0 + clip_ratio_high)) | ((advantages < 0) & (ratio < 1.0 - clip_ratio_low))
    if clip_ratio_c is not None:
        clipped = clipped | ((advantages < 0) & (ratio > clip_ratio_c))
    return torch.where(clipped, torch.zeros_like(ratio), ratio * advantages)


def exact_norm_shares(
    p: torch.Tensor, collision: torch.Tensor, advantages: torch.Tensor, silenced: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The silenced tokens' share of the positive-advantage tokens' exact logit-gradient norm at ``rho = 1``,
    ``|A| sqrt(1 - 2p + sum_v pi(v)^2)``, and of its square (what the lower bound of
    ``grad_bound_share_spurious`` estimates). ``collision`` is ``sum_v pi(v)^2`` per token, which the actor's
    pass does not return (the CPU rollout does). Undefined values count 0; NaN without a positive token."""
    p, collision, advantages = p.double(), collision.double(), advantages.double()
    norm_sq = (1.0 - 2.0 * p + collision).clamp(min=0.0) * advantages.square()
    positive = mask & (advantages > 0) & torch.isfinite(norm_sq)
    norm_sq = torch.where(positive, norm_sq, torch.zeros_like(norm_sq))
    norm = norm_sq.sqrt()
    total, total_sq = float(norm.sum()), float(norm_sq.sum())
    silenced = silenced & positive
    return {
        "grad_norm_share_spurious": float(norm[silenced].sum()) / total if total else math.nan,
        "grad_norm_sq_share_spurious": float(norm_sq[silenced].sum()) / total_sq if total_sq else math.nan,
    }
