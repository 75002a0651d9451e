"""STEER (arXiv 2510.10150): each token's loss weighted down by how much its update would change the entropy.

docs/algorithm.md section 7. The first-order entropy change a token's policy-gradient step causes is, up to a
factor shared by the batch, ``Omega = (A / q) p (1 - p) (log p + H)`` (``p`` the current probability of the
sampled token, ``q`` the old one, ``H`` the old-policy entropy of its distribution). With ``m = |Omega|``,

    k = -log(lambda_min) / max(max m, 0.02),     w = clip(exp(-k m), lambda_min, 1)

so the token with the largest ``|Omega|`` of the scope gets ``lambda_min`` and a token that moves the entropy
little keeps about 1 (the authors' exponential mode, ``run_exp.sh``). Weights are in ``[lambda_min, 1]``.

As the authors' code: ``p`` is clamped to ``[1e-8, 1 - 1e-8]`` and ``q`` to ``[1e-8, 1]``; the maximum is
over the scope's response tokens (here every rank of ``group``, the authors' one micro-batch of one rank).
Unlike it, a token without a finite log-probability, old log-probability, entropy or advantage has ``m = 0``
(weight 1): the authors' clamp would give a ``-inf`` log-probability a finite ``m``; the project keeps an
undefined token's weight at 1 (docs/algorithm.md section 7). Computed and returned in float64 (the loss
casts them to its own dtype), so ``1 - p`` does not round to 0 for ``p`` near 1 and a weight just below 1 is
counted as down-weighted on every layout. Pure torch, no verl.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from stapo.algorithm.quantile import all_reduce_min

STEER_LAMBDA_MIN = 0.8  # run/run_exp.sh: token_weight_min 0.8, linear False
STEER_M_FLOOR = 0.02  # core_algos.py compute_token_weights: k's denominator is at least this
P_CLAMP = 1e-8


def entropy_change(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """``m = |Omega|`` in float64 on the response tokens where it is defined, 0 elsewhere."""
    lp, old, h, a = (t.detach().to(torch.float64) for t in (log_prob, old_log_prob, entropy, advantages))
    defined = response_mask & torch.isfinite(lp) & torch.isfinite(old) & torch.isfinite(h) & torch.isfinite(a)
    p = torch.exp(lp).clamp(P_CLAMP, 1.0 - P_CLAMP)
    q = torch.exp(old).clamp(P_CLAMP, 1.0)
    omega = (a / q) * p * (1.0 - p) * (torch.log(p) + h)
    zero = torch.zeros((), dtype=torch.float64, device=omega.device)
    return torch.where(defined & torch.isfinite(omega), omega.abs(), zero)


def steer_weight(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    lambda_min: float = STEER_LAMBDA_MIN,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """STEER's weights over ``response_mask`` (1 elsewhere), in float64; the maximum of ``m`` is
    taken over every rank of ``group`` (one collective, made by every rank)."""
    m = entropy_change(log_prob, old_log_prob, entropy, advantages, response_mask)
    local_max = m.max() if m.numel() else torch.zeros((), dtype=torch.float64, device=m.device)
    largest = -float(all_reduce_min(-local_max, group))  # max over ranks as a min of the negated values
    k = -math.log(lambda_min) / max(largest, STEER_M_FLOOR)
    weight = torch.exp(-k * m).clamp(lambda_min, 1.0)
    return torch.where(response_mask, weight, torch.ones_like(weight))
