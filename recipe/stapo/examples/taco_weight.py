"""TACO's per-token weight (docs/algorithm.md section 7) written as a custom weight rule, outside the package.

    stapo check stapo.custom_rule.path=$PWD/recipe/stapo/examples/taco_weight.py stapo.custom_rule.name=taco_weight

trains bit for bit like algo=taco (tests/e2e/test_custom_rule_runs.py): on a positive-advantage response
token with finite p and H, w = 1 - lambda (1 - exp(-r)) with r = max(-log p - H + log alpha, 0); 1 elsewhere.
The weight multiplies the token's clipped loss; the token stays in the count.
"""

import math

import torch

ALPHA = 0.01
LAMBDA = 0.9


def taco_weight(log_prob, entropy, advantages, response_mask, quantile, alpha=ALPHA, lam=LAMBDA):
    """A float weight per token, in [1 - lambda, 1]."""
    r = (math.log(alpha) - log_prob - entropy).clamp(min=0.0)
    weight = 1.0 + lam * torch.expm1(-r)
    defined = response_mask & (advantages > 0) & torch.isfinite(log_prob) & torch.isfinite(entropy)
    return torch.where(defined, weight, torch.ones_like(weight))
