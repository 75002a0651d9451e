"""Lopti's two updates per step, through verl's real ``TrainingWorker.train_mini_batch`` and ``train_batch``.

The STAPO actor worker's ``TrainingWorker`` (``STAPOTrainingWorker``) runs verl's own mini-batch loop (iterator,
shuffled; ``update_lr_scheduler`` flag; metric merge) and ``train_batch`` (scheduler step, metric
post-processing); only the engine below them is a stand-in: verl's micro-batch split (dynamic batch size, rows
regrouped) and post-processing around the production loss (``STAPOLossFn`` -> verl's ``ppo_loss`` ->
``masked_clip``) on a tiny float64 model, then a plain SGD step. FSDP and the real optimizer do not touch the
rows, so they are left out.

The reference is independent: starting from the same parameters, a loop runs the low-probability phase over
every mini-batch, then the high one, each mini-batch's gradient the loop objective of tests/reference.py over
that phase's tokens with the mini-batch's full token count, chained through the model by autograd, and the same
SGD step. Every recorded gradient and the final parameters must agree. Seconds, no Ray.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from verl.utils import tensordict_utils as tu
from verl.workers.engine.utils import postprocess_batch_func, prepare_micro_batches
from verl.workers.engine_workers import TrainingWorker

from stapo.algorithm.masks import MaskSettings
from stapo.verl_plugin.training.lopti import PHASE_PREFIX, STAPOTrainingWorker, two_phase_update
from stapo.verl_plugin.training.losses import STAPOLossFn, folded_mask_update
from stapo.verl_plugin.training.shard_mask import fold_shard
from tests.integration.test_weighted_update import MINI, ROWS, TinyLM, _shard
from tests.integration.verl_batches import actor_config
from tests.reference import REFERENCES, reference_masked_loss

ETA, SGD_LR = 0.5, 0.5


class TinyEngine:
    """The engine interface verl's TrainingWorker calls, over ``TinyLM``; records each ``train_batch``."""

    def __init__(self, model: TinyLM):
        self.model, self.scheduler_steps, self.calls = model, 0, []

    def train_mode(self, **_):
        return contextlib.nullcontext()

    def get_data_parallel_group(self):
        return None

    def get_data_parallel_size(self):
        return 1

    def get_data_parallel_rank(self):
        return 0

    def is_mp_src_rank_with_outputs(self):
        return True

    def lr_scheduler_step(self):
        self.scheduler_steps += 1
        return 1e-6 * self.scheduler_steps

    def train_batch(self, data, loss_function):
        """verl's FSDP engine without FSDP: the mini-batch's count from ``loss_mask``, its micro-batch split, the
        loss and backward per micro-batch, its post-processing, an SGD step."""
        tu.assign_non_tensor(data, batch_num_tokens=int(data["loss_mask"].values().sum()), dp_size=1)
        micro_batches, indices = prepare_micro_batches(data, dp_group=None)
        assert len(micro_batches) > 1  # the split really regroups the rows
        self.model.zero_grad()
        outputs = []
        for micro in micro_batches:
            pieces = [self.model(ids)[0] for ids in micro["input_ids"].unbind()]
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), micro["input_ids"].offsets().diff().cumsum(0)])
            model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(torch.cat(pieces), offsets)}
            loss, metrics = loss_function(model_output=model_output, data=micro, dp_group=None)
            loss.backward()
            outputs.append({"loss": loss.detach().item(), "metrics": metrics})
        grads = [p.grad.clone() for p in self.model.parameters()]
        self.calls.append((data["row"].tolist(), grads))
        with torch.no_grad():
            for p in self.model.parameters():
                p.sub_(SGD_LR * p.grad)
        output = postprocess_batch_func(output_lst=outputs, indices=indices, data=data)
        output["metrics"]["grad_norm"] = float(torch.cat([g.flatten() for g in grads]).norm())
        return output


def _training_worker(cls, engine: TinyEngine, loss_fn) -> TrainingWorker:
    """verl's TrainingWorker class without its process-group and engine set-up (the stand-in engine instead)."""
    worker = object.__new__(cls)
    worker.engine, worker.loss_fn, worker.flops_counter, worker.device_name = engine, loss_fn, None, "cpu"
    worker.model_config = {}
    worker.engine_config = SimpleNamespace(
        forward_only=False, use_dynamic_bsz=True, max_token_len_per_gpu=40, micro_batch_size_per_gpu=2,
        use_fused_kernels=False,
    )
    worker.profiler = SimpleNamespace(rank=0, step=lambda: None, check_enable=lambda: False)
    return worker


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """verl's train_mini_batch gathers the token counts over the default group: a one-rank gloo group."""
    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _driver_settings(data) -> None:
    """What verl's v1 trainer puts into the batch for ``update_actor`` (``PPOTrainer._update_actor``)."""
    tu.assign_non_tensor(
        data, global_batch_size=MINI, mini_batch_size=MINI, epochs=1, seed=3, dataloader_kwargs={"shuffle": True}
    )


def _low(rows: dict, i: int, t: int) -> bool:
    """The loop split: the old pass's float32 log-prob (as the trainer hands it over), exp below eta."""
    value = float(torch.tensor(float(rows["old"][i][t]), dtype=torch.float32))
    assert abs(math.exp(value) - ETA) > 1e-6  # no token on the edge, where float rounding could decide
    return math.exp(value) < ETA


def _reference_steps(model: TinyLM, rows: dict, order: list[list[int]], weight) -> tuple[list, TinyLM]:
    """The loop update: for each phase, for each mini-batch (rows in verl's order), the gradient of the phase's
    loss over the mini-batch's full count, then the SGD step. Returns the gradients and the updated model."""
    model = copy.deepcopy(model)
    grads = []
    for phase in ("low", "high"):
        for members in order:
            keep = [[_low(rows, i, t) == (phase == "low") for t in range(len(rows["old"][i]))] for i in members]
            new = []
            for i in members:
                log_prob, _ = model(rows["ids"][i])
                p, n = rows["prompt"][i], len(rows["old"][i])
                new.append(log_prob[p - 1 : p - 1 + n])
            tokens = sum(len(x) for x in new)  # every token of the mini-batch in the count
            _, grad = reference_masked_loss(
                [rows["old"][i].tolist() for i in members], [x.tolist() for x in new],
                [rows["adv"][i].tolist() for i in members], keep, tokens,
                weights=None if weight is None else [weight[i] for i in members],
            )
            surrogate = sum((torch.tensor(g, dtype=torch.float64) * x).sum() for g, x in zip(grad, new))
            model.zero_grad()
            surrogate.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(SGD_LR * p.grad)
    return grads, model


def _loop_weights(rows: dict, name: str):
    if name == "none":
        return None
    lists = {
        "response_mask": [[True] * len(old) for old in rows["old"]],
        "advantages": [adv.tolist() for adv in rows["adv"]],
        "log_prob": [old.float().tolist() for old in rows["old"]],
        "entropy": [ent.float().tolist() for ent in rows["entropy"]],
    }
    return REFERENCES[name](lists, dataclasses.asdict(MaskSettings(token_mask=name)))["weight"]


@pytest.mark.parametrize("name", ["none", "advrew"])  # Lopti alone, and the paper's AR+Lopti
def test_two_phases_match_the_loop_update_and_step_the_scheduler_once(name, process_group):
    torch.manual_seed(0)
    model = TinyLM(sharpness=6.0).double()
    data, rows = _shard(model, seed=1)
    data["row"] = torch.arange(ROWS)
    _driver_settings(data)
    settings = MaskSettings(token_mask=name, lopti=True, lopti_eta=ETA)
    if settings.folded:
        fold_shard(data, settings)  # the actor worker folds first, then splits
    with torch.no_grad():  # the update's policy moved from the old one: ratios off 1, some clipped
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    start = copy.deepcopy(model)
    engine = TinyEngine(model)
    worker = _training_worker(STAPOTrainingWorker, engine, STAPOLossFn(actor_config(token_mask=name, lopti=True)))
    with folded_mask_update():
        output = two_phase_update(data, ETA, worker.train_mini_batch, worker)

    assert engine.scheduler_steps == 1  # once per step, after the second phase's last mini-batch
    order = [members for members, _ in engine.calls[: ROWS // MINI]]
    assert [members for members, _ in engine.calls[ROWS // MINI :]] == order  # phase 2 sees the same mini-batches
    assert sorted(i for members in order for i in members) == list(range(ROWS)) and len(order) > 1
    want, reference_model = _reference_steps(start, rows, order, _loop_weights(rows, name))
    assert len(want) == len(engine.calls) == 2 * len(order)
    for step, ((_, got), expected) in enumerate(zip(engine.calls, want)):
        assert any(bool(g.abs().max() > 1e-6) for g in got), step  # each phase of each mini-batch has tokens
        for g, e in zip(got, expected):
            assert torch.allclose(g, e, rtol=1e-5, atol=1e-9), step  # float32 weights, as folded
    for p, q in zip(model.parameters(), reference_model.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-9)

    metrics = tu.get(output, "metrics")
    assert metrics["lr"] == [1e-6]  # only the second call reports (and steps) the scheduler
    assert len(metrics["grad_norm"]) == 2 * len(order)  # both phases' mini-batches, as one call over twice as many
    for phase in ("low", "high"):
        assert len(metrics[f"{PHASE_PREFIX}{phase}/grad_norm"]) == len(order)
        assert f"{PHASE_PREFIX}{phase}/pg_clipfrac" in metrics and f"{PHASE_PREFIX}{phase}/lr" not in metrics
    tokens = sum(len(old) for old in rows["old"])
    low = sum(_low(rows, i, t) for i in range(ROWS) for t in range(len(rows["old"][i])))
    assert 0 < low < tokens
    assert (metrics[PHASE_PREFIX + "low_tokens"], metrics[PHASE_PREFIX + "high_tokens"]) == (low, tokens - low)


def test_verls_own_training_worker_is_refused(process_group):
    """verl's TrainingWorker would step the scheduler in both calls: a step would count as two."""
    model = TinyLM(sharpness=6.0).double()
    data, _ = _shard(model, seed=2)
    worker = _training_worker(TrainingWorker, TinyEngine(model), None)
    with pytest.raises(RuntimeError, match="would step the learning-rate scheduler twice per step"):
        two_phase_update(data, ETA, worker.train_mini_batch, worker)


def test_the_loss_refuses_lopti_outside_the_workers_update():
    """verl's own trainers would run one update over every token: the first micro-batch refuses it."""
    from tests.integration.test_verl_loss_path import ragged_rows, random_batch
    from tests.integration.verl_batches import _run_micro_batches

    tensors, lengths, prompt_lens = random_batch(3)
    mask = tensors["response_mask"]
    rows = ragged_rows(tensors, lengths, mask, mask)
    loss_fn = STAPOLossFn(actor_config(lopti=True, token_mask="none"))
    with pytest.raises(RuntimeError, match=r"lopti=true reached the loss outside the STAPO trainer's actor worker"):
        _run_micro_batches(loss_fn, rows, prompt_lens, [10], int(mask.sum()), 1, None, None)
