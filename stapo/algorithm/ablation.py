"""Threshold ablations for free: what a grid of (tau_p, q) settings would have silenced this step.

From the same old-pass tensors the S2T mask reads, for every tau_p of the grid the candidates'
entropies are sorted once; every q then costs a quantile read off the sorted values and a binary
search for the count below it. The same detection is also applied to negative-advantage tokens
(``A < 0`` instead of ``A > 0``), which the paper leaves unexamined (docs/algorithm.md section 2):
those are never masked, only counted.

The cell of the configured (tau_p, q) reproduces the folded mask's counts exactly: same candidate
rule, same linear quantile (bit for bit), same strict inequality. Pure torch, no verl. (The token
sample of the probability-entropy map is ``stapo.algorithm.token_sample``.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from stapo.algorithm.quantile import quantile_of_sorted
from stapo.algorithm.s2t import broadcast_advantages
from stapo.algorithm.validation import check_entropy_quantile, check_tau_p

DEFAULT_TAU_PS = (5e-4, 1e-3, 2e-3, 5e-3, 1e-2)
DEFAULT_QS = (0.5, 0.75, 0.9, 1.0)
SIGNS = {"pos": 1, "neg": -1}


def cell_name(sign: str, tau_p: float, q: float) -> str:
    """Metric-friendly cell name, e.g. ``pos/tau_p=0.002,q=0.75``."""
    return f"{sign}/tau_p={tau_p:g},q={q:g}"


def threshold_grid(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_ps: Sequence[float] = DEFAULT_TAU_PS,
    qs: Sequence[float] = DEFAULT_QS,
) -> dict[str, float]:
    """``{<cell>/num_candidates, <cell>/num_silenced, <cell>/mask_ratio, <cell>/tau_h}`` for every cell and sign.

    ``mask_ratio`` is over all response tokens, as the S2T mask's; ``tau_h`` is NaN without candidates.
    """
    for tau_p in tau_ps:
        check_tau_p(tau_p, "stapo.ablation.")
    for q in qs:
        check_entropy_quantile(q, "stapo.ablation.")
    with torch.no_grad():
        advantages = broadcast_advantages(advantages, log_prob)
        num_tokens = float(torch.count_nonzero(response_mask))
        # one pass over the batch: the tokens below the largest tau_p (a small share), then only those
        # a log-prob of -inf is never a candidate (exp gives 0), as in the S2T rule
        # (stapo.algorithm.s2t.candidate_parts)
        low = response_mask.bool() & torch.isfinite(entropy) & (torch.exp(log_prob) < max(tau_ps))
        low &= log_prob != -math.inf
        low_prob, low_entropy, low_adv = torch.exp(log_prob[low]), entropy[low], advantages[low]
        metrics: dict[str, float] = {}
        for sign_name, sign in SIGNS.items():
            signed = low_adv * sign > 0
            for tau_p in tau_ps:
                values = torch.sort(low_entropy[signed & (low_prob < tau_p)].to(torch.float64)).values
                for q in qs:
                    tau_h = quantile_of_sorted(values, q)
                    silenced = 0 if math.isnan(tau_h) else int(torch.searchsorted(values, tau_h, side="left"))
                    name = cell_name(sign_name, tau_p, q)
                    metrics[f"{name}/num_candidates"] = float(values.numel())
                    metrics[f"{name}/num_silenced"] = float(silenced)
                    metrics[f"{name}/mask_ratio"] = silenced / num_tokens if num_tokens else 0.0
                    metrics[f"{name}/tau_h"] = tau_h
    return metrics
