"""The DP-global threshold over real gloo process groups equals the single-process one.

Each rank holds a different random shard (one rank with no candidate at all); the mask every rank
computes with ``group=WORLD`` must equal, shard for shard, the mask of the concatenated batch
computed in one process, and tau_h must equal numpy's quantile of all candidates.
"""

from __future__ import annotations

import math
import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stapo.loss import high_entropy_keep_mask
from stapo.quantile import global_quantile
from stapo.s2t import detect_spurious
from tests.unit.test_s2t import random_batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shard(rank: int):
    log_prob, entropy, advantages, response_mask = random_batch(100 + rank, rows=6 + rank, cols=30)
    if rank == 1:  # a rank without candidates while the others have some
        advantages = -advantages.abs()
    return log_prob, entropy, advantages, response_mask


def _worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        log_prob, entropy, advantages, response_mask = _shard(rank)
        detection = detect_spurious(log_prob, entropy, advantages, response_mask, group=dist.group.WORLD)
        keep = high_entropy_keep_mask(entropy, response_mask, 0.2, group=dist.group.WORLD)
        values = torch.randn(rank * 50, generator=torch.Generator().manual_seed(rank))  # rank 0: empty
        results[rank] = {
            "spurious": detection.spurious.tolist(),
            "tau_h": detection.tau_h,
            "num_candidates": detection.num_candidates,
            "keep": keep.tolist(),
            "q": global_quantile(values, 0.3, dist.group.WORLD),
        }
    finally:
        dist.destroy_process_group()


def _pad_cat(tensors):
    cols = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, cols - t.shape[1])) for t in tensors])


@pytest.mark.parametrize("world", [1, 2, 3])
def test_global_threshold_equals_single_process(world):
    manager = mp.Manager()
    results = manager.dict()
    mp.start_processes(_worker, args=(world, _free_port(), results), nprocs=world, start_method="spawn")
    shards = [_shard(rank) for rank in range(world)]
    log_prob, entropy, advantages, response_mask = (_pad_cat([s[k] for s in shards]) for k in range(4))
    single = detect_spurious(log_prob, entropy, advantages, response_mask)
    single_keep = high_entropy_keep_mask(entropy, response_mask, 0.2)
    all_values = torch.cat([torch.randn(r * 50, generator=torch.Generator().manual_seed(r)) for r in range(world)])

    offset = 0
    for rank in range(world):
        rows = shards[rank][0].shape[0]
        got = results[rank]
        assert got["tau_h"] == single.tau_h
        assert got["num_candidates"] == single.num_candidates
        assert got["spurious"] == single.spurious[offset : offset + rows].tolist()
        assert got["keep"] == single_keep[offset : offset + rows].tolist()
        expected_q = float(np.quantile(all_values.double().numpy(), 0.3)) if all_values.numel() else math.nan
        assert got["q"] == expected_q or (math.isnan(got["q"]) and math.isnan(expected_q))
        offset += rows
    assert single.spurious.any()
