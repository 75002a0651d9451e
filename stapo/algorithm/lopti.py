"""Lopti (low-probability token isolation, arXiv 2505.12929): which of the step's two updates a token is in.

The paper finds that the large gradients of low-probability tokens swamp the updates of the high-probability
ones. Lopti updates the two groups separately, the low-probability tokens first: the second update then acts on
a policy the first has already moved (docs/algorithm.md section 7). The split is the authors' trainer's,
``exp(old_log_probs) < eta`` on the old-policy pass: a token whose old log-prob is NaN is not below eta and
lands in the second update with the others, so every response token is updated exactly once. Pure torch.
"""

from __future__ import annotations

import torch

# the two updates of a step, in their order
PHASES = ("low", "high")


def low_probability(old_log_prob: torch.Tensor, eta: float) -> torch.Tensor:
    """The tokens of the first update: old-policy probability strictly below ``eta`` (any layout)."""
    return old_log_prob.exp() < eta


def phase_masks(response_mask: torch.Tensor, low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``response_mask`` (the policy-gradient sum) of the first and of the second update, dtype kept.

    Only the sum is split: the token count (``loss_mask``) stays whole in both, as the authors zero the other
    tokens' advantages and keep every token in the mean, so the two updates' losses add up to the usual one under
    every aggregation mode: ``masked_clip`` hands the count to verl's ``agg_loss``, whose ``seq-mean-token-mean``
    would otherwise divide each response by its phase's tokens (docs/algorithm.md section 3)."""
    return response_mask.masked_fill(~low, 0), response_mask.masked_fill(low, 0)
