"""The agent-loop worker that builds each single-turn loop once (stapo/verl_plugin/training/shared_agent_loops.py): the
recipe's config chooses it, it builds a shareable loop once and serves every request with it, and any other loop
is built per request by verl's own path. The worker here is not a Ray actor and its loops do not reach a server
(their ``run`` and the TransferQueue put are captured); that the whole path samples what verl's per-request path
samples, bit for bit, is tests/e2e/test_paired.py (its STAPO run uses verl's own manager, the GRPO run this one).
"""

from __future__ import annotations

import asyncio

import hydra.utils
import pytest
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.import_utils import load_class_from_fqn

from stapo.models.tiny import build_tiny_model
from stapo.verl_plugin.reproducible.seeded_agent_loop import SeededSingleTurnAgentLoop
from stapo.verl_plugin.training.shared_agent_loops import (
    MANAGER_PATH,
    SHAREABLE_LOOPS,
    SharedLoopManager,
    SharedLoopWorker,
)
from tests.recipe_config import config_for_verl


def test_the_recipe_chooses_the_shared_loop_manager_and_verl_loads_it():
    config = config_for_verl("model_preset=tiny")
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == MANAGER_PATH
    manager = load_class_from_fqn(MANAGER_PATH, "AgentLoopManager")
    assert manager is SharedLoopManager and issubclass(manager, AgentLoopManagerTQ)
    assert config_for_verl("actor_rollout_ref.rollout.agent.agent_loop_manager_class=null") \
        .actor_rollout_ref.rollout.agent.agent_loop_manager_class is None
    assert issubclass(SharedLoopWorker, AgentLoopWorker)


@pytest.fixture
def worker(tmp_path, monkeypatch):
    """A SharedLoopWorker's state as its constructor sets it, without the Ray actor and TransferQueue client."""
    config = config_for_verl("model_preset=tiny")
    worker = object.__new__(SharedLoopWorker)
    worker.config, worker.llm_client, worker.processor, worker.tools = config, object(), None, []
    worker.tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path))
    worker.hf_model_type, worker.dataset_cls, worker.shared_loops = "qwen3", RLHFDataset, {}
    built, served = [], []
    instantiate = hydra.utils.instantiate

    def counted(*args, **kwargs):
        built.append(instantiate(*args, **kwargs))
        return built[-1]

    async def run(self, sampling_params, **kwargs):
        await asyncio.sleep(0)  # let the other requests start: they run concurrently in the worker
        served.append((self, kwargs["session_id"]))
        return kwargs["session_id"]

    async def postprocess(output, validate, **kwargs):
        return ("put", output)

    monkeypatch.setattr(hydra.utils, "instantiate", counted)
    monkeypatch.setattr(SingleTurnAgentLoop, "run", run)
    monkeypatch.setattr(ToolAgentLoop, "run", run)
    monkeypatch.setattr(worker, "_agent_loop_postprocess", postprocess)
    return worker, built, served


def requests(worker, agent_name: str, n: int):
    trajectory = {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False}

    async def all_of_them():
        return await asyncio.gather(*(
            worker._run_agent_loop({"temperature": 1.0}, trajectory, agent_name=agent_name, trace=False,
                                   session_id=i, raw_prompt=[], global_steps=1, index=0, uid="u")
            for i in range(n)))
    return asyncio.run(all_of_them())


@pytest.mark.parametrize("agent_name", sorted(SHAREABLE_LOOPS))
def test_a_shareable_loop_is_built_once_and_serves_every_request(worker, agent_name):
    worker, built, served = worker
    assert requests(worker, agent_name, 8) == [("put", i) for i in range(8)]
    assert requests(worker, agent_name, 3) == [("put", i) for i in range(3)]
    assert len(built) == 1 and all(loop is built[0] for loop, _ in served) and len(served) == 11
    expected = SeededSingleTurnAgentLoop if agent_name == "stapo_seeded" else SingleTurnAgentLoop
    assert type(built[0]) is expected and built[0].tokenizer is worker.tokenizer
    assert worker.shared_loops == {agent_name: built[0]}


def test_another_loop_is_built_per_request_by_verls_path(worker):
    worker, built, served = worker
    assert "tool_agent" not in SHAREABLE_LOOPS
    assert requests(worker, "tool_agent", 4) == [("put", i) for i in range(4)]
    assert len(built) == 4 and len({id(loop) for loop, _ in served}) == 4 and worker.shared_loops == {}
    assert all(type(loop) is ToolAgentLoop for loop in built)
