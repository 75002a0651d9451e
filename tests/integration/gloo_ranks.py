"""Real gloo ranks, spawned once for every case of a module: each case runs on the first ``world`` ranks, in a
subgroup of its own (``dist.new_group``), so 1, 2 and 3 ranks are tried by one spawn of 3 processes.

A spawned rank costs seconds of imports (torch, tensordict, the module of the function it runs); a spawn per
case paid them again for every case. A subgroup is what verl hands the mask too (its DP group), so the function
under test sees the same kind of group either way; the ranks outside a case's subgroup wait for the next case.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Hashable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

# a case: (world, args) -> fn(rank, world, group, *args) on ranks 0..world-1
Cases = dict[Hashable, tuple[int, tuple]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cases(fn: Callable[..., Any], cases: Cases) -> dict[Hashable, list[Any]]:
    """``fn``'s result on each rank of each case: ``{case: [rank 0's, rank 1's, ...]}``. ``fn`` must be a
    module-level function (a spawned rank imports its module)."""
    size = max(world for world, _ in cases.values())
    results = mp.Manager().dict()
    mp.start_processes(_rank, args=(size, free_port(), fn, cases, results), nprocs=size, start_method="spawn")
    return {case: [results[(case, rank)] for rank in range(world)] for case, (world, _) in cases.items()}


def _rank(rank: int, size: int, port: int, fn: Callable[..., Any], cases: Cases, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        for case, (world, args) in cases.items():
            group = dist.new_group(ranks=list(range(world)))  # every rank takes part in creating every group
            if rank < world:
                results[(case, rank)] = fn(rank, world, group, *args)
    finally:
        dist.destroy_process_group()
