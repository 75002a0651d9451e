"""S2T (STAPO's mask, docs/algorithm.md section 2) written as a custom token rule, outside the package.

    stapo check stapo.custom_rule.path=$PWD/recipe/stapo/examples/s2t_rule.py stapo.custom_rule.name=s2t_rule

trains bit for bit like algo=stapo (tests/e2e/test_custom_rule_runs.py): the candidates are response tokens
with A > 0, a finite log-probability and p < tau_p; tau_h is the 0.75-quantile of the candidates' entropies
over the preset's scope (every DP rank, each PPO mini-batch), through the ``quantile`` helper; a candidate
below tau_h loses its gradient. Only torch: the file is imported by every worker of the run.
"""

import math

import torch

TAU_P = 0.002
ENTROPY_QUANTILE = 0.75


def s2t_rule(log_prob, entropy, advantages, response_mask, quantile, tau_p=TAU_P, q=ENTROPY_QUANTILE):
    """True where the token keeps its gradient (every tensor is (batch, response_len))."""
    prob = torch.exp(log_prob)  # in the log-probs' dtype, as S2T compares it
    candidates = response_mask & (advantages > 0) & (prob < tau_p) & (log_prob != -math.inf)
    candidates &= torch.isfinite(entropy)  # a NaN entropy cannot be ranked: never silenced
    tau_h = quantile(entropy[candidates], q)  # NaN when no rank holds a candidate: nothing is silenced
    spurious = candidates & (entropy.double() < tau_h)  # strict, compared in float64
    return ~spurious
