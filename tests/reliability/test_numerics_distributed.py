"""``source=current`` over two real gloo ranks where one rank has no candidate (and an empty response).

The rank without candidates must take the same tau_h as the other, mask nothing, and both ranks'
losses must stay finite and average (as FSDP averages gradients) to the valid-token mean of the
union, computed by a float64 loop over both ranks' tokens together; every count each rank reports
is the DP-global total, equal to the loop reference's count over the union.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stapo.algorithm.masks import MaskSettings
from stapo.verl_plugin.training.losses import REFUSED_METRIC
from tests.integration.gloo_ranks import free_port, start_ranks
from tests.reference import REFERENCES, reference_clipped_token_loss, reference_spurious
from tests.reliability.test_numerics import NAN, PROMPT, TAU_P, Q, batch

WORLD = 2



def _shard(rank: int):
    old, new, entropy, advantages, mask = batch(20 + rank, rows=4)
    if rank == 1:
        advantages = -advantages.abs()  # no positive advantage: no candidate on this rank
        mask[2] = False  # and an empty response
        entropy[0, 0] = NAN  # a non-finite entropy that must not matter
    return old, new, entropy, advantages, mask


def _worker(rank: int, port: int, config, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from stapo.verl_plugin.training.losses import (
            STAPOLossFn,  # imports verl: in the rank (the forkserver's preload), not at collection
        )
        from tests.integration.verl_batches import metric_values, padded_rows, run_micro_batches

        old, new, entropy, advantages, mask = _shard(rank)
        total_tokens = sum(int(_shard(r)[4].sum()) for r in range(WORLD))
        tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages, "model_entropy": entropy}
        rows = padded_rows(tensors, mask, mask)
        count = mask.shape[0]
        loss, grads, metrics = run_micro_batches(
            STAPOLossFn(config), rows, [PROMPT] * count, [count], total_tokens,
            dp_size=WORLD, dp_group=dist.group.WORLD, global_batch_size=WORLD * count,
        )
        results[rank] = {
            "loss": loss,
            "grad_finite": all(math.isfinite(g) for row in grads for g in row),
            **metric_values(metrics[0]),
        }
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks():
    """One run of both ranks for the tests below (forked from tests/integration/gloo_ranks.py's forkserver)."""
    from tests.integration.verl_batches import actor_config

    config = actor_config(token_mask="stapo", source="current")  # composed once, here, not in every rank
    results = mp.Manager().dict()
    start_ranks(_worker, args=(free_port(), config, results), nprocs=WORLD)
    shards = [_shard(rank) for rank in range(WORLD)]
    old, new, entropy, advantages, mask = (torch.cat([s[k] for s in shards]) for k in range(5))
    entropy = entropy.float().double()  # verl hands the model's entropy over as float32
    union = {"response_mask": mask, "advantages": advantages, "log_prob": new, "entropy": entropy}
    settings = dataclasses.asdict(MaskSettings(token_mask="stapo", source="current"))
    want = REFERENCES["stapo"]({k: v.tolist() for k, v in union.items()}, settings)
    return [results[rank] for rank in range(WORLD)], (old, new, entropy, advantages, mask), want


@pytest.mark.slow  # starts processes: ~3 s from a running forkserver, ~10 s with its start (2 cores, load 5)
def test_rank_without_candidates_agrees_and_the_average_is_the_union_mean(two_ranks):
    got, (old, new, entropy, advantages, mask), want = two_ranks
    spurious, tau_h = reference_spurious(new.tolist(), entropy.tolist(), advantages.tolist(), mask.tolist(), TAU_P, Q)
    valid = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] and not spurious[i][t]]
    expected = sum(
        reference_clipped_token_loss(float(old[i, t]), float(new[i, t]), float(advantages[i, t]), 0.2, 0.28, 10.0)
        for i, t in valid
    ) / len(valid)

    assert all(r["grad_finite"] for r in got)
    assert all(r[REFUSED_METRIC] == 0.0 for r in got)
    assert got[0]["actor/stapo/_sum/tau_h"] == got[1]["actor/stapo/_sum/tau_h"] == tau_h == want["stats"]["tau_h"]
    # every count is a DP-global total on every rank (one all-reduce), equal to the union's loop count
    for key, value in want["counts"].items():
        for rank in range(WORLD):
            rel = 1e-12 if key.startswith("grad_bound") else 0.0
            assert got[rank][f"actor/stapo/_sum/{key}"] == pytest.approx(value, rel=rel), (rank, key)
    counts = want["counts"]
    assert counts["num_spurious"] > 0 and counts["empty_responses"] == 1 and counts["nonfinite_entropy"] == 1
    average = sum(r["loss"] for r in got) / WORLD  # FSDP averages the ranks' gradients, so their losses
    assert abs(average - expected) <= 1e-6 * abs(expected)


@pytest.mark.slow
def test_in_loss_candidate_count_is_the_union_count(two_ranks):
    """num_candidates is a total over the group when the mask is built: the loss must not sum it over ranks again."""
    got, _, want = two_ranks
    for rank in range(WORLD):
        assert got[rank]["actor/stapo/_sum/num_candidates"] == want["counts"]["num_candidates"], rank
