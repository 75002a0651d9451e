"""``source=current`` over two real gloo ranks where one rank has no candidate (and an empty response).

The rank without candidates must take the same tau_h as the other, mask nothing, and both ranks'
losses must stay finite and average (as FSDP averages gradients) to the valid-token mean of the
union, computed by a float64 loop over both ranks' tokens together.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from verl.utils import tensordict_utils as tu

from tests.reference import reference_clipped_token_loss, reference_spurious
from tests.reliability.test_numerics import NAN, Q, TAU_P, _rows, batch

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        from stapo.verl_plugin.losses import MASK_FOLDED_KEY, STAPOLossFn
        from tests.integration.verl_batches import make_micro_batch

        old, new, entropy, advantages, mask = _shard(rank)
        total_tokens = sum(int(_shard(r)[4].sum()) for r in range(WORLD))
        rows = _rows(old, new, entropy, advantages, mask)
        model_output, data, leaf = make_micro_batch(rows, [3] * mask.shape[0], total_tokens, WORLD * mask.shape[0])
        tu.assign_non_tensor(data, dp_size=WORLD, **{MASK_FOLDED_KEY: False})
        loss_fn = STAPOLossFn(config)
        loss, metrics = loss_fn(model_output=model_output, data=data, dp_group=dist.group.WORLD)
        loss.backward()
        value = {key: float(m.values[0]) for key, m in metrics.items() if key.startswith("actor/stapo/")}
        results[rank] = {"loss": float(loss.detach()), "grad_finite": bool(torch.isfinite(leaf.grad).all()), **value}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks import verl: ~10 s on an idle 2-core machine, ~80 s under a load of 10
def test_rank_without_candidates_agrees_and_the_average_is_the_union_mean():
    from tests.integration.verl_batches import actor_config

    config = actor_config(loss_mode="stapo", source="current")  # composed once, here, not in every rank
    results = mp.Manager().dict()
    mp.start_processes(_worker, args=(_free_port(), config, results), nprocs=WORLD, start_method="spawn")
    shards = [_shard(rank) for rank in range(WORLD)]
    old, new, entropy, advantages, mask = (torch.cat([s[k] for s in shards]) for k in range(5))
    entropy = entropy.float().double()  # verl hands the model's entropy over as float32
    spurious, tau_h = reference_spurious(new.tolist(), entropy.tolist(), advantages.tolist(), mask.tolist(), TAU_P, Q)
    valid = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] and not spurious[i][t]]
    expected = sum(
        reference_clipped_token_loss(float(old[i, t]), float(new[i, t]), float(advantages[i, t]), 0.2, 0.28, 10.0)
        for i, t in valid
    ) / len(valid)

    got = [results[rank] for rank in range(WORLD)]
    assert all(r["grad_finite"] for r in got)
    assert got[0]["actor/stapo/num_candidates_local"] > 0 and got[1]["actor/stapo/num_candidates_local"] == 0
    assert got[0]["actor/stapo/tau_h"] == got[1]["actor/stapo/tau_h"] == tau_h
    assert got[0]["actor/stapo/num_candidates"] == got[1]["actor/stapo/num_candidates"]
    assert got[1]["actor/stapo/num_spurious"] == 0 and got[0]["actor/stapo/num_spurious"] > 0
    assert got[1]["actor/stapo/empty_responses"] == 1 and got[1]["actor/stapo/nonfinite_entropy"] == 1
    average = sum(r["loss"] for r in got) / WORLD  # FSDP averages the ranks' gradients, so their losses
    assert abs(average - expected) <= 1e-6 * abs(expected)
