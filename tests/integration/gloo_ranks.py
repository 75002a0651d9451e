"""Real gloo ranks for the tests, all started from one forkserver per pytest process; and ``run_cases``: one start of
the ranks for every case of a module, each case on the first ``world`` ranks, in a subgroup of its own
(``dist.new_group``), so 1, 2 and 3 ranks are tried by one start of 3 processes.

Why one place: a rank started with "spawn" is a fresh interpreter that imports torch, tensordict, verl and the
project's modules again, seconds of CPU per rank (a 2-core machine ran 3 such imports side by side for every
module, issue 62). Every rank-starting module calls ``start_ranks`` here, so every rank of a pytest process is
forked from the same server, which imported ``PRELOAD`` once (``multiprocessing``'s forkserver with
``set_forkserver_preload``); the first module's ranks start the server, the later ones find it running. The ranks
stay separate processes in real gloo process groups, each forked from the server, not from pytest, so a rank
still starts from the modules' import-time state alone: what a rank or a test registered in its own process (a
custom rule, a user's loss file) reaches no other rank.

What the server must not do before it forks: start torch's thread pools (importing torch does not; the first
parallel op would, and no code runs there but the imports), create a process group, or pick verl's platform.
verl resolves its platform lazily (``verl.plugin.platform.get_platform``), and none of ``PRELOAD`` calls it at
import; modules that read the device at import (``verl.workers.engine.fsdp.transformer_impl``) stay out of
``PRELOAD``, so a rank may still choose the CPU platform first (tests/reliability/test_fsdp_nonfinite.py). The
server was started with the environment pytest had then; every rank gets pytest's environment of the moment it
was started (``start_ranks``) before its function runs, and sets its own ``MASTER_PORT``.

A subgroup is what verl hands the mask to (its DP group), so the function under test sees the same kind of group
in ``run_cases`` as alone; the ranks outside a case's subgroup wait for the next case. A rank that raises fails
the caller with the rank's traceback (``torch.multiprocessing``'s ``ProcessRaisedException``).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from collections.abc import Callable, Hashable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

# imported once by the server: the libraries, the project's modules and the modules of the rank functions; each
# rank finds them imported (a name missing here is imported by each rank that needs it, as a spawned rank did)
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch.distributed.fsdp",
    "tensordict",
    "verl",
    "verl.utils.tensordict_utils",
    "stapo.algorithm.masks",
    "stapo.verl_plugin.training.custom_rule",
    "stapo.verl_plugin.training.losses",
    "stapo.verl_plugin.training.shard_mask",
    "tests.integration.gloo_ranks",
    "tests.integration.jagged_rows",
    "tests.integration.verl_batches",
    "tests.integration.mini_batch_ranks",
    "tests.integration.test_distributed_quantile",
    "tests.integration.test_shard_mask",
    "tests.reliability.test_fsdp_nonfinite",
    "tests.reliability.test_numerics_distributed",
    "tests.unit.test_custom_rule_ranks",
    "tests.unit.test_stare",
)
START_METHOD = "forkserver"

# a case: (world, args) -> fn(rank, world, group, *args) on ranks 0..world-1
Cases = dict[Hashable, tuple[int, tuple]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(fn: Callable[..., Any], args: tuple, nprocs: int, join: bool = True):
    """``torch.multiprocessing.start_processes(fn, args, nprocs)`` forked from this process's forkserver: each rank
    runs ``fn(rank, *args)``. ``fn`` must be a module-level function (a rank imports its module, if the server did
    not). Without ``join``, the ``ProcessContext`` to join."""
    multiprocessing.get_context(START_METHOD).set_forkserver_preload(list(PRELOAD))  # read when the server starts
    return mp.start_processes(_with_environment, args=(dict(os.environ), fn, args), nprocs=nprocs, join=join,
                              start_method=START_METHOD)


def _with_environment(rank: int, environment: dict[str, str], fn: Callable[..., Any], args: tuple) -> None:
    os.environ.clear()
    os.environ.update(environment)  # the caller's, as a spawned rank inherited it
    fn(rank, *args)


def run_cases(fn: Callable[..., Any], cases: Cases) -> dict[Hashable, list[Any]]:
    """``fn``'s result on each rank of each case: ``{case: [rank 0's, rank 1's, ...]}``. ``fn`` must be a
    module-level function (a rank imports its module, if the server did not)."""
    size = max(world for world, _ in cases.values())
    results = mp.Manager().dict()
    start_ranks(_rank, args=(size, free_port(), fn, cases, results), nprocs=size)
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
