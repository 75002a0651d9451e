"""A non-finite loss on ONE rank must not hang the others, nor update anything, under real FSDP2.

Two gloo ranks on the CPU each hold a tiny language model wrapped with FSDP2 ``fully_shard``. Rank 1
has a NaN advantage on a real loss token. Both ranks run the production loss (``STAPOLossFn`` ->
verl's ``ppo_loss`` -> ``masked_clip``), the backward (FSDP's reduce-scatter), verl's
``fsdp2_clip_grad_norm_`` and verl's own ``FSDPEngine.optimizer_step`` (non-finite norm -> zero_grad,
no step). Both must finish, both must see a non-finite norm, the parameters must be unchanged on
both; then a clean step must change them (the test can fail). An earlier design raised on the bad
rank, which left its peer waiting in the backward's collective: the join timeout turns such a
regression into a failure instead of a hang.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

from tests.integration.gloo_ranks import free_port, start_ranks

# no verl import here: each rank selects the CPU platform before verl picks one (tests/integration/gloo_ranks.py)

WORLD = 2
HANG_GUARD_S = 240  # a healthy run takes seconds after the imports; a deadlock never ends
VOCAB, DIM, PROMPT = 11, 8, 3



class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.body = torch.nn.Linear(DIM, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.embed(ids))))


def _micro_batch(model, rank: int, poison: bool):
    """This rank's rows and the model's flat log-probs laid out as verl's engine hands them to the loss."""
    g = torch.Generator().manual_seed(100 + rank)
    lengths = [5, 7, 4]
    flat, rows = [], {k: [] for k in ("log_prob", "old_log_prob", "advantages", "response_mask", "loss_mask")}
    for i, n in enumerate(lengths):
        ids = torch.randint(0, VOCAB, (PROMPT + n,), generator=g)
        log_probs = torch.log_softmax(model(ids[:-1]), dim=-1).gather(-1, ids[1:].unsqueeze(-1)).squeeze(-1)
        flat.append(torch.cat([log_probs, log_probs.new_zeros(1)]))  # position t predicts token t + 1
        response = log_probs[PROMPT - 1 :].detach()
        advantages = torch.full((n,), 1.0 if i % 2 else -0.5, dtype=torch.float64)
        if poison and i == 0:
            advantages[1] = float("nan")  # a real loss token: mask and count keep it
        rows["log_prob"].append(response)
        rows["old_log_prob"].append(response + 0.05 * torch.randn(n, generator=g, dtype=torch.float64))
        rows["advantages"].append(advantages)
        rows["response_mask"].append(torch.ones(n, dtype=torch.long))
        rows["loss_mask"].append(torch.ones(n, dtype=torch.long))
    return rows, torch.cat(flat), sum(lengths)


def _step(engine, model, config, rank: int, poison: bool) -> dict:
    import torch.distributed as dist
    from verl.utils import tensordict_utils as tu

    from stapo.verl_plugin.training.losses import REFUSED_METRIC, STAPOLossFn, folded_mask_update
    from tests.integration.verl_batches import make_micro_batch

    rows, flat, tokens = _micro_batch(model, rank, poison=poison and rank == 1)
    total = torch.tensor(float(tokens))
    dist.all_reduce(total)  # verl's engine: the mini-batch's DP-global token count
    model_output, data, _ = make_micro_batch(rows, [PROMPT] * 3, int(total), 3 * WORLD, flat_log_probs=flat)
    tu.assign_non_tensor(data, dp_size=WORLD)
    with folded_mask_update():  # as the STAPO actor worker runs verl's update over its folded shard
        loss, metrics = STAPOLossFn(config)(model_output=model_output, data=data, dp_group=dist.group.WORLD)
    loss.backward()  # FSDP2: reduce-scatter of the gradients, a collective on every rank
    norm = engine.optimizer_step()  # verl's own clip + skip rule
    engine.optimizer.zero_grad()
    refused = metrics[REFUSED_METRIC]
    return {"loss": float(loss.detach()), "norm": norm, "refused": float(refused.values[0])}  # one micro-batch


def _full_params(model) -> list[torch.Tensor]:
    return [p.full_tensor().detach().clone() for p in model.parameters()]  # an all-gather: every rank calls it


def _select_cpu_platform() -> None:
    """What ``import verl`` does in a fresh process with STAPO_CPU_BACKEND=1: the plugin switches verl to the CPU
    platform. The forkserver imported verl without the flag, before this rank set it, so the rank asks the plugin
    again (``activate_if_requested`` is idempotent), before any module that reads the device at import."""
    from stapo.verl_plugin.cpu import activate_if_requested

    engine = "verl.workers.engine.fsdp.transformer_impl"  # its module-level device_name is read at import
    assert engine not in sys.modules, f"{engine} was imported before the rank chose the CPU platform"
    activate_if_requested()
    from verl.utils.device import get_device_name

    assert get_device_name() == "cpu", get_device_name()


def _worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), STAPO_CPU_BACKEND="1")
    _select_cpu_platform()
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from types import SimpleNamespace

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

        from tests.integration.verl_batches import actor_config

        config = actor_config(token_mask="none")  # here: unpickling a verl object would import verl too early
        torch.manual_seed(0)  # the same initial weights on both ranks, as verl loads one checkpoint
        model = TinyLM().double()
        fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        # verl's FSDPEngine.optimizer_step, run on the fields it reads: the real skip rule, no worker around it
        fields = {"module": model, "optimizer": optimizer, "optimizer_config": SimpleNamespace(clip_grad=1.0),
                  "scaler": None, "_qat_enabled": False}
        engine = SimpleNamespace(**fields)
        engine.optimizer_step = lambda: FSDPEngine.optimizer_step(engine)

        before = _full_params(model)
        bad = _step(engine, model, config, rank, poison=True)
        after_bad = _full_params(model)
        good = _step(engine, model, config, rank, poison=False)
        after_good = _full_params(model)
        results[rank] = {
            "bad": bad,
            "good": good,
            "unchanged_after_bad": all(torch.equal(a, b) for a, b in zip(before, after_bad)),
            "changed_after_good": any(not torch.equal(a, b) for a, b in zip(after_bad, after_good)),
            "finite_after_good": all(bool(torch.isfinite(p).all()) for p in after_good),
            "params": [p.sum().item() for p in after_good],
        }
    finally:
        dist.destroy_process_group()


def _run_with_hang_guard() -> dict:
    results = mp.Manager().dict()
    context = start_ranks(_worker, args=(free_port(), results), nprocs=WORLD, join=False)
    deadline = time.monotonic() + HANG_GUARD_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks did not finish within {HANG_GUARD_S} s: a non-finite loss hung FSDP")
    return dict(results)


@pytest.mark.slow  # ranks import verl's FSDP engine: ~6 s from a running forkserver, ~18 s with its start (load 5)
def test_nan_on_one_rank_skips_the_step_on_every_rank_without_hanging():
    results = _run_with_hang_guard()
    assert sorted(results) == list(range(WORLD)), results
    for rank in range(WORLD):
        got = results[rank]
        # the NaN of rank 1 reaches every rank through FSDP's gradient reduction: both see it and skip
        assert got["bad"]["norm"] != got["bad"]["norm"] or abs(got["bad"]["norm"]) == float("inf"), got["bad"]
        assert got["unchanged_after_bad"], rank
        # the clean step that follows is taken, finite, and identical on both ranks
        assert got["good"]["norm"] == got["good"]["norm"] and got["good"]["norm"] > 0, got["good"]
        assert got["changed_after_good"] and got["finite_after_good"], rank
    # one refusing rank: every rank reports the refused micro-batch, so verl's mean over the DP ranks reads 1, not 1/2
    from verl.utils.metric import AggregationType, Metric

    for phase, expected in (("bad", 1.0), ("good", 0.0)):
        per_rank = [Metric(AggregationType.SUM, results[rank][phase]["refused"]) for rank in range(WORLD)]
        assert Metric.aggregate_dp(per_rank) == expected, phase
    assert results[0]["params"] == results[1]["params"]
