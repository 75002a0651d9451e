"""DP-global S2T threshold over gloo: what the cross-rank quantile costs against a local one.

``source: current`` takes the entropy threshold over the current micro-batch's candidates of every
DP rank (``detect_spurious(..., group=dp_group)``: an all-reduce of the count, an all-gather of the
counts and one of the padded candidate entropies, then the exact quantile on every rank). Ranks are
processes started with ``torch.multiprocessing`` (spawn) on 127.0.0.1, one torch thread each. Per
rank and per call, interleaved with a barrier before each timed call:

- ``global_quantile`` of ``per_rank`` values vs ``linear_quantile`` of the same local values;
- ``detect_spurious`` with the group vs without it, on one micro-batch per rank (the real call).

Figures are the medians of rank 0 (every rank waits for the slowest at the collective anyway). On a
machine with fewer cores than ranks the ranks share cores: that inflates the global figures.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import fmt_num, md_row
from stapo.algorithm.quantile import global_quantile, linear_quantile
from stapo.algorithm.s2t import detect_spurious


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, per_rank: int, micro_tokens: int, repeats: int, results) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        group = dist.group.WORLD
        g = torch.Generator().manual_seed(rank)
        values = torch.rand(per_rank, generator=g) * 4
        # one micro-batch of this rank: 3e-4 of the tokens sampled below tau_p, half the responses positive
        rows = 8
        per_row = max(micro_tokens // rows, 1)
        log_prob = -torch.empty(rows, per_row).exponential_(4.0, generator=g)
        tail = torch.rand(rows, per_row, generator=g) < 3e-4
        log_prob[tail] = -10.0
        entropy = torch.rand(rows, per_row, generator=g) * 4
        advantages = torch.tensor([1.0, -1.0] * (rows // 2))
        mask = torch.ones(rows, per_row, dtype=torch.long)
        timings = {"global_q": [], "local_q": [], "detect_group": [], "detect_local": []}
        calls = {
            "global_q": lambda: global_quantile(values, 0.75, group),
            "local_q": lambda: linear_quantile(values, 0.75),
            "detect_group": lambda: detect_spurious(log_prob, entropy, advantages, mask, group=group),
            "detect_local": lambda: detect_spurious(log_prob, entropy, advantages, mask),
        }
        for round_index in range(repeats + 2):
            for name, call in calls.items():
                dist.barrier()
                start = time.perf_counter()
                call()
                elapsed = time.perf_counter() - start
                if round_index >= 2:
                    timings[name].append(elapsed)
        if rank == 0:
            results.update({name: list(samples) for name, samples in timings.items()})
    finally:
        dist.destroy_process_group()


def run(worlds=(2, 3, 4), per_rank: int = 100_000, micro_tokens: int = 8 * 4096, repeats: int = 20) -> list[dict]:
    out = []
    for world in worlds:
        with mp.Manager() as manager:
            results = manager.dict()
            mp.start_processes(
                _worker,
                args=(world, _free_port(), per_rank, micro_tokens, repeats, results),
                nprocs=world,
                start_method="spawn",
            )
            timings = dict(results)
        med = {name: statistics.median(samples) for name, samples in timings.items()}
        spread = {name: (max(s) - min(s)) / statistics.median(s) for name, s in timings.items()}
        out.append(
            {
                "bench": "quantile",
                "world": world,
                "per_rank": per_rank,
                "micro_tokens": micro_tokens,
                "global_q_ms": 1000 * med["global_q"],
                "local_q_ms": 1000 * med["local_q"],
                "q_ratio": med["global_q"] / med["local_q"],
                "detect_group_ms": 1000 * med["detect_group"],
                "detect_local_ms": 1000 * med["detect_local"],
                "detect_ratio": med["detect_group"] / med["detect_local"],
                "spread": max(spread.values()),
            }
        )
    return out


# ---------------------------------------------------------------- its section of BENCHMARKS.md

NAME = "quantile"
TITLE = "2b. DP-global quantile over gloo ranks"
SIZES = {
    "quick": dict(worlds=(2,), per_rank=2000, micro_tokens=2048, repeats=5),
    "full": dict(worlds=(2, 3, 4), per_rank=100_000, micro_tokens=8 * 4096, repeats=30),
}


def measure(device, **size) -> list[dict]:
    return run(**size)  # gloo ranks on the CPU, whatever the device


def render(rows: list[dict]) -> str:
    lines = [
        "| ranks | values per rank | global_quantile ms | local linear_quantile ms | ratio | "
        "detect_spurious with group ms | without ms | ratio | worst spread |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        keys = ("global_q_ms", "local_q_ms", "q_ratio", "detect_group_ms", "detect_local_ms", "detect_ratio", "spread")
        lines.append(md_row(r["world"], f"{r['per_rank']:,}", *(fmt_num(r[k]) for k in keys)))
    lines += ["", f"`detect_spurious` runs on one micro-batch of {rows[0]['micro_tokens']:,} response tokens per rank."]
    return "\n".join(lines)
