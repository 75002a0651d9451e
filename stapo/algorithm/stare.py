"""STARE (arXiv 2606.19236): surprisal-guided token-level advantage reweighting, gated by the batch entropy.

docs/algorithm.md section 7. Among the positive-advantage response tokens (``T+``), the top ``P`` share by
surprisal ``s = -log p`` (the least likely tokens, ``L+``) have their advantage multiplied by ``W > 1``; with
the variant ``C2`` the top ``P`` of the negative-advantage tokens (``L-``) by ``M < 1`` as well; every other
token keeps 1. The weights apply only while the gate is on: the mean entropy of the scope's response tokens
below ``H_tgt`` (the authors' closed loop: amplify exploration only once entropy has fallen). Scaling the
advantage by ``w >= 0`` is scaling the clipped per-token loss, so the loss applies ``w`` as a weight.

Scope: the cut and the gate are taken over every rank of ``group`` (the caller's scope: one threshold
scope of the STAPO trainer). ``L+`` holds ``k = max(1, int(n P + 0.999999))`` tokens, ``n = |T+|`` over the
scope (the authors' rounding: a true ceil would pick 8 of 100 at P = 0.07, as 100 * 0.07 = 7.000000000000001),
here every token whose surprisal is at least the k-th largest: ties at the cut are all taken, where the
authors' ``topk`` keeps an arbitrary k of them (so the selection does not depend on the row order or layout).
A token without a finite log-probability is in neither set (weight 1); without a finite entropy it does not
count in the gate's mean. The weights are float64 (``W`` and ``M`` exactly as configured; the loss casts them to its
own dtype). Pure torch, no verl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from stapo.algorithm.quantile import all_reduce_sum, gather_variable

# the authors' defaults (hp-luo/STARE, core_algos.py and the README's 7B recipe): variant O1, P 0.1, W 1.1,
# M 0.9 (read by C2 only), H_tgt 0.3
STARE_VARIANTS = ("O1", "C2")
STARE_VARIANT = "O1"
STARE_TOP_RATIO = 0.1
STARE_W = 1.1
STARE_M = 0.9
STARE_TARGET_ENTROPY = 0.3


@dataclass(frozen=True)
class StareWeights:
    weight: torch.Tensor  # float64, 1 off L+ / L- and everywhere while the gate is off
    gate: float  # 1.0 on, 0.0 off, NaN without a finite entropy in the scope (then off)
    cut: float  # the surprisal of L+'s k-th token over the scope, NaN when T+ is empty or P = 0


def top_count(n: int, top_ratio: float) -> int:
    """How many of ``n`` tokens the top ``top_ratio`` share holds (the authors' rounding, at least 1 of n > 0)."""
    if n == 0 or top_ratio <= 0.0:
        return 0
    return min(max(1, int(n * top_ratio + 0.999999)), n)


def top_surprisal(surprisal: torch.Tensor, candidates: torch.Tensor, top_ratio: float,
                  group: dist.ProcessGroup | None) -> tuple[torch.Tensor, float]:
    """The candidates whose surprisal is at least the k-th largest of all candidates over ``group``, and that
    k-th largest value (NaN when none is selected). Every rank joins the gather, with or without candidates."""
    union = gather_variable(surprisal[candidates], group)
    k = top_count(union.numel(), top_ratio)
    if k == 0:
        return torch.zeros_like(candidates), math.nan
    cut = union.kthvalue(union.numel() - k + 1).values  # the k-th largest, in the values' own dtype
    return candidates & (surprisal >= cut), float(cut)


def gate_entropy(entropy: torch.Tensor, response_mask: torch.Tensor, group: dist.ProcessGroup | None) -> float:
    """The mean finite entropy of the response tokens over every rank of ``group`` (NaN without one)."""
    finite = response_mask & torch.isfinite(entropy)
    local = torch.stack([
        torch.where(finite, entropy, torch.zeros((), dtype=entropy.dtype, device=entropy.device)).sum(
            dtype=torch.float64),
        torch.count_nonzero(finite).to(torch.float64),
    ])
    total, count = all_reduce_sum(local, group).tolist()
    return total / count if count else math.nan


def stare_weight(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    top_ratio: float = STARE_TOP_RATIO,
    w: float = STARE_W,
    m: float = STARE_M,
    variant: str = STARE_VARIANT,
    target_entropy: float = STARE_TARGET_ENTROPY,
    group: dist.ProcessGroup | None = None,
) -> StareWeights:
    """STARE's per-token weights over ``response_mask`` (1 elsewhere), shapes ``(batch, response_len)``.

    ``log_prob`` and ``entropy`` are detached values (the old-policy pass for the preset); ``advantages``
    token-level. The gate and the cut are DP-global over ``group``: every rank makes the same collectives.
    """
    mean_entropy = gate_entropy(entropy, response_mask, group)
    gate = math.nan if math.isnan(mean_entropy) else float(mean_entropy < target_entropy)
    surprisal = -log_prob
    finite = response_mask & torch.isfinite(surprisal)
    top_plus, cut = top_surprisal(surprisal, finite & (advantages > 0), top_ratio, group)
    weight = torch.ones_like(log_prob, dtype=torch.float64)
    if variant == "C2":  # the negative side's collective runs whatever the gate, as the positive's
        top_minus, _ = top_surprisal(surprisal, finite & (advantages < 0), top_ratio, group)
        if gate == 1.0:
            weight = weight.masked_fill(top_minus, m)
    if gate == 1.0:
        weight = weight.masked_fill(top_plus, w)
    return StareWeights(weight, gate, cut)
