"""Independent references for the numerical tests: plain Python loops, float64, numpy.quantile.

Written from the spec, not from ``stapo/``: nothing here imports the code under test.
"""

from __future__ import annotations

import math

import numpy as np


def reference_spurious(log_prob, entropy, advantages, response_mask, tau_p, q):
    """Returns (spurious as nested lists of bools, tau_h) with a token-by-token loop (rows may be ragged)."""
    candidates = []
    for i in range(len(log_prob)):
        for t in range(len(log_prob[i])):
            if not response_mask[i][t]:
                continue
            adv = advantages[i][t] if isinstance(advantages[i], (list, tuple, np.ndarray)) else advantages[i]
            p = math.exp(float(log_prob[i][t]))
            if adv > 0 and p < tau_p and math.isfinite(float(entropy[i][t])):
                candidates.append((i, t, float(entropy[i][t])))
    spurious = [[False] * len(row) for row in log_prob]
    if not candidates:
        return spurious, math.nan
    tau_h = float(np.quantile(np.array([c[2] for c in candidates], dtype=np.float64), q))
    for i, t, h in candidates:
        if h < tau_h:
            spurious[i][t] = True
    return spurious, tau_h


def reference_clipped_token_loss(old_lp, lp, adv, eps_low, eps_high, c):
    """One token's PPO loss with clip-higher and dual clip (verl semantics), in float64."""
    log_ratio = min(max(lp - old_lp, -20.0), 20.0)
    ratio = math.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * min(max(ratio, 1 - eps_low), 1 + eps_high)
    loss = max(unclipped, clipped)
    if adv < 0:
        loss = min(loss, -adv * c)
    return loss


def reference_stapo_loss(old_lp, lp, adv, response_mask, entropy, tau_p, q, eps_low, eps_high, c):
    """The STAPO objective by loops: mean of the clipped loss over response tokens not spurious."""
    spurious, _ = reference_spurious(lp, entropy, adv, response_mask, tau_p, q)
    total, count = 0.0, 0
    for i in range(len(lp)):
        for t in range(len(lp[0])):
            if response_mask[i][t] and not spurious[i][t]:
                total += reference_clipped_token_loss(old_lp[i][t], lp[i][t], adv[i][t], eps_low, eps_high, c)
                count += 1
    return total / count if count else 0.0
