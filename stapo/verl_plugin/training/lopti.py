"""Lopti's two updates per step, each through verl's own update, verl unpatched (docs/algorithm.md section 7).

The authors' trainer calls the actor update twice per step, on the same batch and old log-probs: first with
the advantages of the tokens with old ``p >= eta`` zeroed, then with those of ``p < eta`` zeroed, each a full
pass over every mini-batch (and epoch), every token kept in the loss's count. :func:`two_phase_update` does the
same with verl's own ``update_actor`` (``ActorRolloutRefWorker.update_actor`` -> ``TrainingWorker.
train_mini_batch``): called twice, on shallow copies of the shard (verl pops its settings from the TensorDict it
is handed) whose ``response_mask`` keeps one phase's tokens, ``loss_mask`` left whole (each response's count,
under every ``loss_agg_mode``: the loss hands it to verl's ``agg_loss``, docs/algorithm.md section 3). Dropping a
token from ``response_mask`` and zeroing its advantage give the same gradient; the KL and entropy terms, which verl sums
over ``response_mask``, are split the same way as the authors split them (their ``kl_entropy_mask``).

verl steps the learning-rate scheduler in ``train_batch`` on the flag ``update_lr_scheduler``, which
``train_mini_batch`` sets on the last mini-batch of each call: two calls would step it twice a step, running
a warmup or decay written in training steps at double speed. :class:`STAPOTrainingWorker` holds it during the
first call, so it steps once, after the second (the authors' scheduler is stepped by both calls, harmless
for their constant schedule without warmup).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.py_functional import append_to_dict
from verl.workers.engine_workers import TrainingWorker

from stapo.algorithm.lopti import PHASES, low_probability, phase_masks
from stapo.algorithm.quantile import all_reduce_sum
from stapo.verl_plugin.training.jagged import flat_fields, jagged

# the phases' own metrics and token counts, under actor/stapo/lopti/ (the worker's keys get verl's "actor/")
PHASE_PREFIX = "stapo/lopti/"
# keys not copied per phase: resources, the lr (stepped by the second phase only), the loss's own checks
NOT_PER_PHASE = ("perf/", "mfu", "lr", "stapo/")


class STAPOTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker`` (the engine behind the actor) whose learning-rate scheduler can be held."""

    hold_lr_scheduler = False

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_batch(self, data: TensorDict) -> TensorDict:
        if self.hold_lr_scheduler:  # train_mini_batch flags its last mini-batch; Lopti's first call must not step
            tu.assign_non_tensor(data, update_lr_scheduler=False)
        return super().train_batch(data)


@contextlib.contextmanager
def lr_scheduler_held(worker: TrainingWorker):
    """The span of an update that must not step the scheduler (Lopti's first phase)."""
    worker.hold_lr_scheduler = True
    try:
        yield
    finally:
        worker.hold_lr_scheduler = False


def two_phase_update(
    data: TensorDict,
    eta: float,
    update: Callable[[TensorDict], TensorDict | None],
    worker: TrainingWorker,
    group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
) -> TensorDict | None:
    """Run ``update`` (verl's) on the low-probability tokens of ``data``, then on the others; merged output.

    ``data`` is the shard after the token mask's fold. The output is the second call's, its metrics those of
    both calls as one call over twice the mini-batches would give them (verl's ``append_to_dict``), plus each
    phase's own under ``stapo/lopti/<phase>/`` and the phases' DP-global token counts; None where verl
    returns none (ranks without outputs).
    """
    if not isinstance(worker, STAPOTrainingWorker):
        raise RuntimeError(
            f"Lopti needs the actor's TrainingWorker to be {STAPOTrainingWorker.__name__} (got "
            f"{type(worker).__name__}): verl's own would step the learning-rate scheduler twice per step"
        )
    offsets, flat = flat_fields(data, ("response_mask", "old_log_probs"))
    low = low_probability(flat["old_log_probs"].float(), eta)
    masks = phase_masks(flat["response_mask"], low)
    counts = all_reduce_sum(torch.stack([mask.bool().sum() for mask in masks]).to(device, torch.float64), group)
    outputs = []
    for phase, mask in zip(PHASES, masks):
        phase_data = data.copy()  # verl pops mini_batch_size, epochs, ... from what it is handed
        phase_data["response_mask"] = jagged(mask, offsets)
        with lr_scheduler_held(worker) if phase == PHASES[0] else contextlib.nullcontext():
            outputs.append(update(phase_data))
    if any(output is None for output in outputs):
        return None
    phase_metrics = [dict(tu.get(output, "metrics")) for output in outputs]
    merged: dict = {}
    for metrics in phase_metrics:
        append_to_dict(merged, metrics)
    for phase, metrics in zip(PHASES, phase_metrics):
        for key, value in metrics.items():
            name = key.removeprefix("actor/")
            if not name.startswith(NOT_PER_PHASE):
                merged[f"{PHASE_PREFIX}{phase}/{name}"] = value
    total = float(counts.sum())
    for phase, count in zip(PHASES, counts.tolist()):
        merged[f"{PHASE_PREFIX}{phase}_tokens"] = count
    merged[PHASE_PREFIX + "low_fraction"] = float(counts[0]) / total if total > 0 else 0.0
    output = outputs[-1]
    tu.assign_non_tensor(output, metrics=merged)
    return output
