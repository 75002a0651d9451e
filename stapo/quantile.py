"""Exact linear-interpolation quantiles, local or over a torch.distributed group.

Why not ``torch.quantile``: it refuses inputs above 2**24 elements, and a real STAPO batch holds
tens of millions of response tokens. ``torch.kthvalue`` has no such limit and is O(n).

The interpolation reproduces ``numpy.quantile(..., method="linear")`` bit for bit in float64
(virtual index ``(n - 1) * q`` and numpy's two-sided lerp), so thresholds can be checked against
numpy exactly, including ties.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's ``_lerp``: interpolate from the nearer end, which keeps t in [0.5, 1] exact at b."""
    diff = b - a
    if t >= 0.5:
        return b - diff * (1.0 - t)
    return a + diff * t


def linear_quantile(values: torch.Tensor, q: float) -> float:
    """The q-quantile of a 1-D tensor (numpy's linear method), as a Python float64.

    Returns NaN for an empty tensor: callers decide what an empty set means.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    flat = values.reshape(-1)
    n = flat.numel()
    if n == 0:
        return math.nan
    flat = flat.to(torch.float64)
    index = (n - 1) * q
    lo = math.floor(index)
    hi = min(lo + 1, n - 1)
    a = torch.kthvalue(flat, lo + 1).values.item()
    b = a if hi == lo else torch.kthvalue(flat, hi + 1).values.item()
    return _lerp(a, b, index - lo)


def group_size(group: dist.ProcessGroup | None) -> int:
    """World size of ``group``; 1 when there is no group (this process only)."""
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group=group)


def gather_variable(values: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Concatenate a 1-D tensor of different length on every rank, in rank order.

    Only the values themselves travel (padded to the longest rank's count), never the tokens they
    were selected from: for the S2T threshold that is the candidates, about 1% of the batch.
    """
    values = values.reshape(-1)
    world = group_size(group)
    if world == 1:
        return values
    count = torch.tensor([values.numel()], dtype=torch.long, device=values.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(c.item()) for c in counts]
    longest = max(sizes)
    if longest == 0:
        return values
    padded = values.new_zeros(longest)
    padded[: values.numel()] = values
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([piece[:size] for piece, size in zip(pieces, sizes)])


def all_reduce_sum(value: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum of a tensor over the group (a copy; the input is untouched)."""
    total = value.clone()
    if group_size(group) > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


def global_quantile(values: torch.Tensor, q: float, group: dist.ProcessGroup | None = None) -> float:
    """The q-quantile of the union of ``values`` over every rank of ``group`` (same on all ranks)."""
    return linear_quantile(gather_variable(values, group), q)
