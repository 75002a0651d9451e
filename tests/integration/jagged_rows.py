"""Random response rows in verl's jagged layout, for tests whose ranks need no verl config machinery
(``verl_batches`` composes Hydra and imports the loss glue): the rank functions import this module only."""

from __future__ import annotations

import math

import torch


def response_rows(
    rows: int,
    seed: int,
    max_len: int,
    specials: tuple[int, int, int],
    low_share: float = 0.05,
    candidates: bool = True,
) -> dict[str, list[torch.Tensor]]:
    """Per-row tensors of verl's jagged response-only fields (as the v1 trainer stores them after
    advantages): token ids, masks, old log-probs with a ``low_share`` of low-probability tokens,
    entropies, one advantage per row (0 on every fourth row; all negative without ``candidates``).
    ``specials`` are the rows of an instant EOS, of a response without any response token and of
    a response with a hole (tool output)."""
    empty, no_tokens, hole = specials
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len, (rows,), generator=g).tolist()
    lengths[empty] = 0
    batch = {name: [] for name in ("responses", "response_mask", "old_log_probs", "entropy", "advantages")}
    for row, n in enumerate(lengths):
        mask = torch.ones(n, dtype=torch.int64)
        if row == no_tokens:
            mask[:] = 0
        if row == hole and n > 20:
            mask[10:20] = 0
        log_prob = -torch.empty(n).exponential_(3.0, generator=g)
        low = torch.rand(n, generator=g) < low_share
        log_prob[low] = torch.empty(int(low.sum())).uniform_(math.log(1e-6), math.log(2e-3), generator=g)
        advantage = float(torch.randn((), generator=g)) if row % 4 else 0.0
        advantage = advantage if candidates else -abs(advantage)
        batch["responses"].append(torch.randint(1, 1000, (n,), generator=g))
        batch["response_mask"].append(mask)
        batch["old_log_probs"].append(log_prob * mask)
        batch["entropy"].append(torch.empty(n).exponential_(1.0, generator=g) * mask)
        batch["advantages"].append(torch.full((n,), advantage) * mask)
    return batch
