"""Soft per-token weights of the policy-gradient loss: TACO and Advantage Reweighting.

docs/algorithm.md section 7. A token mask (``stapo.algorithm.masks``) takes a token out of the loss or leaves it
in; these leave every token in and multiply its per-token loss by a weight in [0, 1] instead, so the
tail tokens that dominate the gradient (section 1) weigh less without being silenced. A weighted token
stays in the count the loss divides by (weights are not renormalised). Both read the probability ``p``
of the sampled token and, for TACO, the entropy ``H`` of its distribution, from the old-policy pass
(``source: old``) or the update forward (``source: current``), always detached.

A token whose weight is undefined (a non-finite log-probability, or entropy for TACO) keeps weight 1,
as S2T never silences such a token; the registry counts it. Pure torch, no verl: shapes are
``(batch, response_len)``, computed in the inputs' dtype.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from stapo.algorithm.quantile import all_reduce_min


def taco_weight(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    alpha: float,
    lam: float,
) -> torch.Tensor:
    """TACO (arXiv 2607.07976): ``w = 1 - lam (1 - exp(-r))``, ``r = max(-log p - H + log alpha, 0)``, on
    positive-advantage response tokens with a finite log p and H; 1 on every other position.

    ``r`` is how far the token's surprisal ``-log p`` exceeds the distribution's mean surprisal ``H`` by
    more than ``log(1/alpha)``: a token far in the tail of its own distribution. Why ``max(r, 0)`` (this
    project's decision; no source for the paper's own rule on ``r < 0`` could be consulted): without it a
    token likelier than the margin would get ``w > 1`` (up to ``1 + lam (1/alpha - 1)``, 90 at the paper's
    values), and the method only down-weights tail tokens; with it ``w`` is in ``[1 - lam, 1]``.
    Negative-advantage tokens are left at 1: the method concerns the reinforcement of tail tokens.
    """
    r = (math.log(alpha) - log_prob - entropy).clamp(min=0.0)
    weight = 1.0 + lam * torch.expm1(-r)  # 1 - lam (1 - e^-r), accurate for small r
    defined = response_mask & (advantages > 0) & torch.isfinite(log_prob) & torch.isfinite(entropy)
    return torch.where(defined, weight, torch.ones_like(weight))


def advrew_weight(log_prob: torch.Tensor, response_mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """Advantage Reweighting (arXiv 2505.12929): ``w = alpha p + (1 - alpha)`` on every response token with
    a finite log p, whatever the advantage's sign; 1 on every other position.

    The paper scales each token's advantage by ``w``; with ``w >= 0`` that is the same as scaling its
    clipped per-token loss (PPO's min and the dual clip commute with a non-negative factor), which is how
    the loss applies it. ``p`` is capped at 1 so a rounding above 0 in a log-probability cannot give
    ``w > 1``.
    """
    prob = torch.exp(log_prob.clamp(max=0.0))
    weight = alpha * prob + (1.0 - alpha)
    defined = response_mask & torch.isfinite(log_prob)
    return torch.where(defined, weight, torch.ones_like(weight))


def weight_metrics(
    weight: torch.Tensor,
    response_mask: torch.Tensor,
    advantages: torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """What a reader needs to see of a weighting, over the response tokens: additive counts and sums (so a
    mean weight over micro-batches and DP ranks is a ratio of sums) and the minimum weight over every rank
    of ``group`` (NaN without a response token)."""
    positive = response_mask & (advantages > 0)
    below = weight < 1.0
    zero = torch.zeros((), dtype=weight.dtype, device=weight.device)
    # elementwise selections in the batch's dtype, no gather: the fold runs this on every response token
    counts = {
        "num_positive": float(torch.count_nonzero(positive)),
        "num_positive_downweighted": float(torch.count_nonzero(positive & below)),
        "num_downweighted": float(torch.count_nonzero(response_mask & below)),
        "weight_sum_positive": float(torch.where(positive, weight, zero).sum()),
        "weight_sum": float(torch.where(response_mask, weight, zero).sum()),
    }
    inf = torch.tensor(math.inf, dtype=weight.dtype, device=weight.device)
    local = weight.masked_fill(~response_mask, math.inf).min() if weight.numel() else inf
    smallest = float(all_reduce_min(local, group))
    return counts, {"min_weight": smallest if math.isfinite(smallest) else math.nan}
