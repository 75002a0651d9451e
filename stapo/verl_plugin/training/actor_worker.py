"""verl's actor worker with the token mask folded into its shard at the start of the update.

The STAPO trainer maps the actor role to :class:`STAPOActorWorker` (``STAPOTrainer._init_resource_pool_mgr``,
the way verl's own separate-async trainer swaps in its worker). Only ``update_actor`` differs:
:func:`stapo.verl_plugin.training.shard_mask.fold_shard` runs on the shard verl fetched for this rank, then
verl's update runs unchanged, and the mask's DP-global metrics join verl's as ``actor/stapo/*``. With
``policy_loss.lopti`` verl's update runs twice, on the low- then the high-probability tokens
(:mod:`stapo.verl_plugin.training.lopti`, whose ``TrainingWorker`` keeps the scheduler to one step per step).
"""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.device import get_device_id, get_device_name
from verl.workers.engine_workers import ActorRolloutRefWorker

from stapo.algorithm.masks import MaskSettings
from stapo.verl_plugin.training.lopti import STAPOTrainingWorker, two_phase_update
from stapo.verl_plugin.training.losses import METRIC_PREFIX, folded_mask_update, mask_settings
from stapo.verl_plugin.training.shard_mask import fold_shard

# verl prefixes the worker's metrics with "actor/": these arrive under METRIC_PREFIX (actor/stapo/*)
VERL_ACTOR_PREFIX = "actor/"
WORKER_METRIC_PREFIX = METRIC_PREFIX.removeprefix(VERL_ACTOR_PREFIX)


def engine_device() -> torch.device:
    """The device of this worker's engine (its DP group's collectives run there)."""
    name = get_device_name()
    return torch.device("cpu") if name == "cpu" else torch.device(name, get_device_id())


class STAPOActorWorker(ActorRolloutRefWorker):
    """``ActorRolloutRefWorker`` whose ``update_actor`` first folds the token mask into its shard."""

    _mask_settings: MaskSettings | None = None
    actor_worker_cls = STAPOTrainingWorker  # verl builds self.actor from it; the reference keeps verl's

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: TensorDict) -> TensorDict:
        if self._mask_settings is None:
            self._mask_settings = mask_settings(omega_conf_to_dataclass(self.config.actor))
        settings, metrics = self._mask_settings, {}
        group = self.actor.engine.get_data_parallel_group()
        folded = contextlib.nullcontext()
        if settings.folded:
            metrics = fold_shard(data, settings, group, engine_device())
        if settings.folded or settings.lopti:
            folded = folded_mask_update()  # the loss refuses a folded mask or a split it sees outside this span
        with folded:
            if settings.lopti:
                update = super().update_actor
                output = two_phase_update(data, settings.lopti_eta, update, self.actor, group, engine_device())
            else:
                output = super().update_actor(data)  # verl's own: profiler, routing replay, train_mini_batch
        if output is not None and metrics:
            reported = dict(tu.get(output, "metrics"))
            reported.update({WORKER_METRIC_PREFIX + key: value for key, value in metrics.items()})
            tu.assign_non_tensor(output, metrics=reported)
        return output
