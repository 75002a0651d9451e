"""A rule-based reward scored in the agent-loop worker's own process instead of over one Ray call a sample.

verl's agent-loop worker scores every finished sample by calling a reward-loop actor
(``RewardLoopWorker.compute_score.remote(data)``, a one-row DataProto pickled each way): 64 calls a testbed
step and 512 a validation, each a round trip through Ray's object store that costs more than the rule it
runs (docs/benchmarks-history.md, "the agent-loop worker's hops"). When the reward is a rule (no reward
model), the same ``RewardLoopWorker`` class built inside the agent-loop worker gives the same scores with no
hop: ``LocalRewardHandle`` stands where verl expects an actor handle, so verl's own ``_compute_score`` runs
unchanged and only the transport goes. The row's Python objects are copied first (``by_value``), as Ray's
pickling would copy them, so a reward manager that writes into the row's ``extra_info`` (verl's naive one does)
cannot reach the trajectory the worker then stores.

Off by default (``stapo.reward_in_agent_loop``); the CPU presets (conf/model_preset/tiny.yaml and those built on it)
turn it on. A reward slow enough to want its own processes (a sandbox, a slow verifier) keeps verl's actors; a reward
model always does.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from omegaconf import OmegaConf

SETTING = "stapo.reward_in_agent_loop"
# the agent-loop manager whose workers call ``reward_handles`` (stapo/verl_plugin/training/shared_agent_loops.py), the
# only one that scores in its worker; its path is here so that the run checks read it without importing verl's agent
# loops (seconds of imports on every `stapo check`)
SCORING_MANAGER_PATH = "stapo.verl_plugin.training.shared_agent_loops.SharedLoopManager"


def reward_handles(config, actor_handles: list | None) -> list | None:
    """What the agent-loop worker should call for rewards: verl's ``actor_handles``, or one local handle when
    ``config`` asks for it and verl streams rewards at all (``actor_handles`` not None). Never with a reward
    model, whose scores come from a server: the run checks refuse that pair before Ray starts."""
    if actor_handles is None or not OmegaConf.select(config, SETTING, default=False):
        return actor_handles
    if OmegaConf.select(config, "reward.reward_model.enable", default=False):
        return actor_handles
    return [LocalRewardHandle(config)]


class _LocalMethod:
    """``method.remote(*args)`` as an actor method answers it: an awaitable of the result."""

    def __init__(self, handle: LocalRewardHandle):
        self.handle = handle

    def remote(self, data):
        return self.handle.score(by_value(data))


def by_value(data):
    """``data`` as the reward actor would receive it through Ray, for what a reward manager may write into: its
    non-tensor columns (``extra_info``, ``reward_model``: the request's own dicts) and ``meta_info`` copied, its
    tensors shared (built by verl's ``_compute_score`` for this call alone, read and never written by a reward
    manager). A deep copy of the whole DataProto pickles its TensorDict: in a profile of a testbed validation it cost
    more than the reward."""
    return dataclasses.replace(data, non_tensor_batch=copy.deepcopy(data.non_tensor_batch),
                               meta_info=copy.deepcopy(data.meta_info))


class LocalRewardHandle:
    """In place of a ``RewardLoopWorker`` actor handle: verl's ``RewardLoopWorker`` built in this process on
    its first request (inside the worker's event loop, which its reward manager keeps for its executors)."""

    def __init__(self, config):
        self.config = config
        self.worker: Any = None
        self.compute_score = _LocalMethod(self)

    async def score(self, data) -> dict:
        if self.worker is None:
            from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

            self.worker = RewardLoopWorker(self.config)
        return await self.worker.compute_score(data)
