"""verl's TransferQueue agent-loop worker, with one agent-loop object per agent name instead of one per request.

verl's ``AgentLoopWorker._run_agent_loop`` builds the agent loop anew for every request through
``hydra.utils.instantiate``, which merges the worker's tokenizer, server client and configs into a config
and builds a Continuous Token builder each time (about 10 ms a request), 64 times a step and 512 times a
validation; built once, a testbed validation took 5-12 s less and a step was not told apart (docs/benchmarks-history.md,
"agent loops built once per worker").
Every argument of that call comes from the worker, not from the request, so a loop that keeps no
per-request state on itself can serve all of a worker's requests: the loops in ``SHAREABLE_LOOPS`` are
verl's single-turn loop and the seeded one built on it, whose ``run`` works on locals only (the builder
holds constants). Any other loop (a multi-turn or tool loop may keep a conversation on itself) is built
per request, as verl does.

Chosen by ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (conf/stapo_trainer.yaml), which
verl's v1 task runner reads; the requests, their order and what they sample are unchanged.
"""

from __future__ import annotations

from typing import Any

import hydra
import ray
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.utils.rollout_trace import rollout_trace_attr

from stapo.verl_plugin.opt_in import group_puts, local_reward, one_server
from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME

# agent loops whose instance holds nothing of a request: one instance serves a worker's requests
SHAREABLE_LOOPS = frozenset({AGENT_LOOP_NAME, "single_turn_agent"})
MANAGER_PATH = local_reward.SCORING_MANAGER_PATH


class SharedLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's ``AgentLoopWorkerTQ`` whose shareable agent loops are built once, on their first request; when the
    config asks, it sends requests straight to the one rollout server (``one_server``), scores rule-based
    rewards in its own process (``local_reward``) and puts each prompt group's samples in one call (``group_puts``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shared_loops: dict[str, Any] = {}
        client = one_server.client_for(self.config, self.llm_client)
        if client is not self.llm_client:
            self.llm_client = client
            print(f"[stapo] requests go straight to the rollout server when it is the only one "
                  f"({one_server.SETTING}=true)", flush=True)
        handles = local_reward.reward_handles(self.config, self.reward_loop_worker_handles)
        if handles is not self.reward_loop_worker_handles:
            self.reward_loop_worker_handles = handles
            print(f"[stapo] rewards scored in the agent-loop worker ({local_reward.SETTING}=true)", flush=True)
        if group_puts.wanted(self.config):
            from verl.trainer.ppo.v1 import agent_loop_tq

            group_puts.install(agent_loop_tq)
            print(f"[stapo] a prompt group's samples go to TransferQueue in one put ({group_puts.SETTING}=true)",
                  flush=True)

    def shared_loop(self, agent_name: str):
        """The one instance of ``agent_name``, built with the arguments verl's worker passes every time."""
        if agent_name not in self.shared_loops:
            self.shared_loops[agent_name] = hydra.utils.instantiate(
                config=_agent_loop_registry[agent_name],
                trainer_config=DictConfigWrap(config=self.config),
                server_manager=self.llm_client,
                tokenizer=self.tokenizer,
                processor=self.processor,
                hf_model_type=self.hf_model_type,
                dataset_cls=self.dataset_cls,
                data_config=DictConfigWrap(self.config.data),
                tools=ToolListWrap(self.tools),
            )
            print(f"[stapo] agent loop {agent_name}: one instance serves this worker's requests", flush=True)
        return self.shared_loops[agent_name]

    async def _run_agent_loop(
        self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *, agent_name: str, trace: bool = True,
        **kwargs,
    ):
        if agent_name not in SHAREABLE_LOOPS or agent_name not in _agent_loop_registry:
            return await super()._run_agent_loop(
                sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs
            )
        with rollout_trace_attr(
            step=trajectory["step"],
            sample_index=trajectory["sample_index"],
            rollout_n=trajectory["rollout_n"],
            validate=trajectory["validate"],
            name="agent_loop",
            trace=trace,
        ):
            output = await self.shared_loop(agent_name).run(sampling_params, **kwargs)
            return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)


class SharedLoopManager(AgentLoopManagerTQ):
    """verl's ``AgentLoopManagerTQ`` with ``SharedLoopWorker`` actors."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(SharedLoopWorker)
