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

EXACT_LIMIT = 1 << 20  # masked_quantiles is exact up to this many positions


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's ``_lerp``: interpolate from the nearer end, which keeps t in [0.5, 1] exact at b."""
    diff = b - a
    if t >= 0.5:
        return b - diff * (1.0 - t)
    return a + diff * t


def _interpolated(n: int, q: float, value_at) -> float:
    """numpy's linear method on n ordered values, ``value_at(k)`` being the k-th smallest (0-based)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    if n == 0:
        return math.nan
    index = (n - 1) * q
    lo = math.floor(index)
    hi = min(lo + 1, n - 1)
    a = value_at(lo)
    b = a if hi == lo else value_at(hi)
    return _lerp(a, b, index - lo)


def linear_quantile(values: torch.Tensor, q: float, widen: bool = True) -> float:
    """The q-quantile of a tensor (numpy's linear method), as a Python float64.

    Returns NaN for an empty tensor: callers decide what an empty set means. ``widen=False`` ranks
    the values in their own dtype (same result for float32/bf16 inputs, whose order a cast to float64
    keeps, without the float64 copy); the interpolation is float64 either way.
    """
    flat = values.reshape(-1)
    flat = flat.to(torch.float64) if widen else flat
    return _interpolated(flat.numel(), q, lambda k: float(torch.kthvalue(flat, k + 1).values.item()))


def quantile_of_sorted(sorted_values: torch.Tensor, q: float) -> float:
    """:func:`linear_quantile` of an already sorted 1-D tensor (many q for one sort), bit-identical to it."""
    flat = sorted_values.reshape(-1)  # only the read values widen: a float32 / bf16 value is exact as a float
    return _interpolated(flat.numel(), q, lambda k: float(flat[k].item()))


def masked_quantiles(
    values: torch.Tensor, mask: torch.Tensor, qs: tuple[float, ...], max_exact: int | None = EXACT_LIMIT
) -> list[float]:
    """Linear quantiles of ``values[mask]`` for several q, without gathering the whole selection.

    Exact up to ``max_exact`` positions (always with ``max_exact=None``, for a threshold that decides
    which tokens a mask drops): the positions outside ``mask`` are set to +inf, which only
    pushes them past every selected value, so the k-th smallest of the selection is the k-th smallest
    of the whole array; one ``numpy.partition`` finds every needed rank in a single pass. Above that
    (a paper-size batch: 31M tokens) they are the exact quantiles of an evenly strided sample of about
    ``max_exact`` positions: deterministic, with a rank error around 1/sqrt(max_exact) (0.1% at the
    default), which is what a logged percentile needs, at a fraction of the cost. That is for CPU
    tensors (the driver); on a GPU the selection is sorted once and read exactly at every q.
    """
    mask = mask.bool()
    if values.device.type != "cpu":  # one sort for every q (a GPU sorts 31M values in milliseconds; each
        selected = torch.sort(values[mask].reshape(-1)).values  # kthvalue would be a sort of its own)
        return [quantile_of_sorted(selected, q) for q in qs]
    import numpy as np

    flat, flat_mask = values.reshape(-1), mask.reshape(-1)
    if max_exact is not None and flat.numel() > max_exact:
        stride = -(-flat.numel() // max_exact)
        flat, flat_mask = flat[::stride], flat_mask[::stride]
    n = int(torch.count_nonzero(flat_mask))
    array = torch.where(flat_mask, flat, torch.tensor(float("inf"), dtype=flat.dtype))
    array = array.float().numpy() if array.dtype == torch.bfloat16 else array.numpy()
    ranks = sorted({k for q in qs if n for k in _ranks(n, q)})
    if ranks:
        array = np.partition(array, ranks)
    return [_interpolated(n, q, lambda k: float(array[k])) for q in qs]


def _ranks(n: int, q: float) -> tuple[int, int]:
    index = (n - 1) * q
    lo = math.floor(index)
    return lo, min(lo + 1, n - 1)


def less_than(values: torch.Tensor, threshold: float) -> torch.Tensor:
    """``values < threshold`` as if compared in float64, without widening ``values``.

    A float64 threshold (an interpolated quantile) need not be representable in the values' dtype;
    torch would round it to that dtype first. With ``t`` the nearest representable value: if
    ``t >= threshold`` no value of the dtype lies in [threshold, t), so ``v < threshold`` iff ``v < t``;
    if ``t < threshold`` none lies in (t, threshold), so ``v < threshold`` iff ``v <= t``.
    """
    if values.dtype == torch.float64:
        return values < threshold
    rounded = torch.tensor(threshold, dtype=torch.float64).to(values.dtype)
    if float(rounded) >= threshold:
        return values < rounded
    return values <= rounded


def dp_ranks(group: dist.ProcessGroup | None) -> int:
    """How many data-parallel ranks ``group`` holds; 1 when there is no group (this process only)."""
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group=group)


def gather_variable(values: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Concatenate a 1-D tensor of different length on every rank, in rank order.

    Only the values themselves travel (padded to the longest rank's count), never the tokens they
    were selected from: for the S2T threshold that is the candidates, a small share of the batch.
    """
    values = values.reshape(-1)
    world = dp_ranks(group)
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
    if dp_ranks(group) > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


def all_reduce_min(value: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Minimum of a tensor over the group, elementwise (a copy; the input is untouched)."""
    smallest = value.clone()
    if dp_ranks(group) > 1:
        dist.all_reduce(smallest, op=dist.ReduceOp.MIN, group=group)
    return smallest


def global_quantile(values: torch.Tensor, q: float, group: dist.ProcessGroup | None = None) -> float:
    """The q-quantile of the union of ``values`` over every rank of ``group`` (same on all ranks)."""
    return linear_quantile(gather_variable(values, group), q)


def group_masked_quantiles(
    values: torch.Tensor,
    mask: torch.Tensor,
    qs: tuple[float, ...],
    group: dist.ProcessGroup | None = None,
    max_exact: int = EXACT_LIMIT,
) -> list[float]:
    """:func:`masked_quantiles` over the union of every rank's ``values[mask]`` (same on all ranks).

    Exact while the ranks together hold at most ``max_exact`` positions, so a batch split over DP ranks
    gives the quantiles of the whole batch bit for bit; above that every rank takes the same evenly
    strided sample of its own positions, at the stride the whole batch would take, so only about
    ``max_exact`` values travel however large the batch. One process is :func:`masked_quantiles` itself.
    """
    if dp_ranks(group) == 1:
        return masked_quantiles(values, mask, qs, max_exact)
    flat, flat_mask = values.reshape(-1), mask.reshape(-1).bool()
    positions = all_reduce_sum(torch.tensor(flat.numel(), device=values.device), group)
    if int(positions) > max_exact:
        stride = -(-int(positions) // max_exact)
        flat, flat_mask = flat[::stride], flat_mask[::stride]
    union = torch.sort(gather_variable(flat[flat_mask], group).to(torch.float64)).values
    return [quantile_of_sorted(union, q) for q in qs]
