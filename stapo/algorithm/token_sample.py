"""Which response tokens a diagnostic reads when it cannot read them all: evenly spread positions.

``token_sample`` picks up to N response tokens spread evenly over the batch (the data of the
paper's probability-entropy map); ``spread_positions`` is the selection, also used to cap the
silenced-token log. Both are deterministic (evenly spaced in batch order), so two paired runs read
the same positions, and neither lists every position of a paper-size batch. Pure torch, no verl.
"""

from __future__ import annotations

import torch

from stapo.algorithm.s2t import broadcast_advantages


def spread_positions(mask: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """At most ``max_tokens`` flat (row-major) positions of ``mask``'s True values, evenly spread, ascending.

    The k True values are cut into ``max_tokens`` equal runs and the middle one of each run is kept:
    a capped selection shows tokens from the whole batch (every prompt group, early and late
    positions), not only its first rows.

    Without listing every True position: on a dense mask of a paper-size batch (31M tokens) that
    list alone is 250 MB. The ranks wanted are known from the count; blocks of the mask are counted,
    and only the blocks holding a wanted rank are searched.
    """
    flat = mask.reshape(-1).bool()
    count = int(torch.count_nonzero(flat))
    if max_tokens <= 0 or count == 0:
        return torch.zeros(0, dtype=torch.long, device=mask.device)
    if count <= max_tokens:
        return flat.nonzero().squeeze(1)
    ranks = (2 * torch.arange(max_tokens, device=flat.device) + 1) * count // (2 * max_tokens)
    return nth_true(flat, ranks)


def nth_true(flat: torch.Tensor, ranks: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Positions of the ``ranks``-th True values (0-based, ascending ranks) of a 1-D bool tensor."""
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % block)).view(-1, block)
    per_block = torch.count_nonzero(padded, dim=1)
    before = per_block.cumsum(0) - per_block  # True values before each block
    blocks = torch.searchsorted(before, ranks, right=True) - 1
    within = ranks - before[blocks]  # rank inside its block
    running = padded[blocks].cumsum(dim=1)  # one row per wanted rank: blocks x block, small
    offsets = (running > within.unsqueeze(1)).to(torch.uint8).argmax(dim=1)
    return blocks * block + offsets


def token_sample(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    silenced: torch.Tensor,
    size: int,
) -> list[dict[str, float]]:
    """Up to ``size`` response tokens spread evenly over the batch, as ``{prob, entropy, advantage, silenced}``.

    The data of the paper's probability-entropy map: positive- and negative-advantage tokens with the
    S2T region (p < tau_p, H < tau_h) drawn over them. Deterministic (evenly spaced in batch order), so
    two paired runs sample the same positions.
    """
    positions = spread_positions(response_mask, size)  # flat, row-major: read by index, not by a full mask
    broadcast_advantages(advantages, log_prob)  # refuses a shape that is neither per token nor per response
    per_response = advantages.shape != log_prob.shape

    def at(values: torch.Tensor, per_row: bool = False) -> torch.Tensor:
        return values[positions // response_mask.shape[-1]] if per_row else values.reshape(-1)[positions]

    rows = zip(
        torch.exp(at(log_prob).double()).tolist(),
        at(entropy).double().tolist(),
        at(advantages, per_response).double().tolist(),
        at(silenced).tolist(),
    )
    return [{"prob": p, "entropy": h, "advantage": a, "silenced": bool(s)} for p, h, a, s in rows]
