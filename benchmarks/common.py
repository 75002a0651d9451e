"""Shared pieces of the benchmarks: device choice, interleaved timing, tensor-memory accounting.

Timing: every benchmark interleaves its variants (A, B, C, B, C, A, ...) after one warm-up round, so
load from other processes on a shared machine hits all variants alike; it reports the median and the
spread ((max - min) / median) of each variant. On CUDA the clock is read after a synchronize.

Memory: :class:`TensorMemory` is a torch dispatch mode that sees every tensor the measured code
creates (forward and backward ops alike) and keeps a running total of the bytes of the storages that
are still alive. Its peak is *peak live tensor bytes allocated by the measured code*, inputs not
counted; the same number on CPU and GPU, independent of the allocator's caching and of other
processes. It also records the largest tensor created (elements and shape), which is how the loss
benchmark shows that no vocabulary-sized tensor appears. It slows the ops down, so memory is measured
in separate passes from the timing. On CUDA ``torch.cuda.max_memory_allocated`` is recorded too.
"""

from __future__ import annotations

import math
import re
import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible to torch")
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Samples:
    """Seconds of one variant, one value per measured round."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the machine was for this variant."""
        if not self.values:
            return math.nan
        return (max(self.values) - min(self.values)) / self.median


def paired_ratio(a: Samples, b: Samples) -> float:
    """Median over rounds of a/b, each round's two samples taken back to back (cancels load drift)."""
    ratios = [x / y for x, y in zip(a.values, b.values) if y > 0]
    return statistics.median(ratios) if ratios else math.nan


def interleaved(
    variants: dict[str, Callable[[], Callable[[], object]]],
    repeats: int,
    device: torch.device,
    warmup: int = 1,
) -> dict[str, Samples]:
    """Time ``variants`` round-robin (order rotated every round); ``prepare() -> run()``, only ``run`` timed.

    ``prepare`` builds fresh inputs (outside the clock) so that no variant reuses another's graph.
    """
    samples = {name: Samples() for name in variants}
    names = list(variants)
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)  # rotate the order so no variant always runs first
        for name in names[shift:] + names[:shift]:
            run = variants[name]()
            sync(device)
            start = time.perf_counter()
            run()
            sync(device)
            elapsed = time.perf_counter() - start
            if round_index >= warmup:
                samples[name].values.append(elapsed)
            del run
    return samples


class TensorMemory(TorchDispatchMode):
    """Peak live bytes of the tensors created while the mode is active (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.largest_numel = 0
        self.largest_shape: tuple[int, ...] = ()
        self.largest_op = ""
        self._owned: dict[tuple[str, int], int] = {}

    def _free(self, key, nbytes: int) -> None:
        if self._owned.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {
            (str(t.device), t.untyped_storage().data_ptr())
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and not t.is_nested
        }
        out = func(*args, **kwargs)
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or tensor.is_nested:
                continue
            if tensor.numel() > self.largest_numel:
                self.largest_numel, self.largest_shape, self.largest_op = tensor.numel(), tuple(tensor.shape), str(func)
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            nbytes = storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._owned:
                continue  # a view or an in-place result of something already counted
            self._owned[key] = nbytes
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, nbytes)
        return out


@dataclass
class MemoryResult:
    peak_tensor_bytes: int
    largest_numel: int
    largest_shape: tuple[int, ...]
    largest_op: str
    cuda_peak_bytes: int | None  # torch.cuda.max_memory_allocated above the starting allocation


def measure_memory(prepare: Callable[[], Callable[[], object]], device: torch.device) -> MemoryResult:
    """Run ``prepare()()`` once under :class:`TensorMemory` (inputs built by ``prepare`` not counted)."""
    run = prepare()
    cuda_peak = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with TensorMemory() as mode:
        run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        cuda_peak = torch.cuda.max_memory_allocated(device) - base
    return MemoryResult(mode.peak, mode.largest_numel, mode.largest_shape, mode.largest_op, cuda_peak)


def rss_peak_reset() -> bool:
    """Reset this process's VmHWM (Linux >= 4.0); False where /proc does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def rss_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB, from /proc/self/status; (0, 0) if unavailable."""
    try:
        status = open("/proc/self/status").read()
    except OSError:
        return 0, 0
    rss = re.search(r"VmRSS:\s+(\d+)", status)
    hwm = re.search(r"VmHWM:\s+(\d+)", status)
    return (int(rss.group(1)) if rss else 0, int(hwm.group(1)) if hwm else 0)


def machine_info(device: torch.device) -> dict[str, str]:
    from stapo.machine_kind import cpuinfo_fields

    cpu = cpuinfo_fields().get("model name", "unknown CPU")
    import os

    cores = os.cpu_count() or 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU figures)"
    return {
        "cpu": cpu,
        "cores": str(cores),
        "torch_threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "gpu": gpu,
        "device": str(device),
    }


def load_average() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def fmt_bytes(n: float | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def md_row(*cells) -> str:
    """One row of a markdown table."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def fmt_num(x, digits: int = 2) -> str:
    """A number for a table; ``n/a`` for a missing or NaN one."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}f}"


def fmt_peak(row: dict) -> str:
    """Peak live tensor bytes of a row, with the CUDA allocator's peak beside it when measured."""
    cuda = row.get("cuda_peak_bytes")
    return fmt_bytes(row.get("peak_tensor_bytes")) + (f" (CUDA peak {fmt_bytes(cuda)})" if cuda is not None else "")
