"""Rewards scored in the agent-loop worker (stapo/verl_plugin/opt_in/local_reward.py): verl's own ``_compute_score``
runs with the local handle in place of a reward-loop actor and gives what verl's ``RewardLoopWorker`` gives on
the row as Ray delivers it (pickled), for right, wrong and answerless responses, concurrently; the row's
``extra_info`` that verl's reward manager writes into stays the caller's; the setting is read as documented
and refused with a reward model before Ray starts. No Ray cluster here (the reference pickles the row as Ray
would); that a whole run with the local reward logs what verl's actors give, bit for bit, is
tests/e2e/test_paired.py (its GRPO run uses the CPU presets' local reward, its STAPO run verl's manager and
reward actors)."""

from __future__ import annotations

import asyncio
import pickle

import pytest
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

from stapo.models.tiny import build_tiny_model
from stapo.verl_plugin.opt_in import local_reward
from stapo.verl_plugin.preflight.run_checks import STAPOConfigError, validate_run_config
from stapo.verl_plugin.training.shared_agent_loops import SharedLoopWorker
from tests.actor_shim import AsActor
from tests.recipe_config import config_for_verl

# (response text, ground truth): the tiny preset's reward (stapo.reward.synthetic) gives +1 when the answer's
# last digit appears, acc from the last \boxed{}
RESPONSES = [("so \\boxed{42}", "42"), ("maybe 7", "42"), ("", "3"), ("\\boxed{13} or 3", "13"), ("no", "9")]


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    config = config_for_verl("model_preset=tiny", "stapo.reward_in_agent_loop=true")
    config.actor_rollout_ref.model.path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return config


@pytest.fixture(scope="module")
def tokenizer(config):
    return AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)


def worker_with(config, tokenizer, handles):
    """A SharedLoopWorker's state that verl's ``_compute_score`` reads, without the Ray actor."""
    worker = object.__new__(SharedLoopWorker)
    worker.config, worker.processor, worker.tokenizer = config, None, tokenizer
    worker.mm_processor_kwargs = {}
    worker.reward_loop_worker_handles = handles
    return worker


def output_and_kwargs(tokenizer, text: str, truth: str, index: int):
    prompt = tokenizer.encode("what is it?")
    response = tokenizer.encode(text) if text else []
    output = AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=[1] * len(response),
                             num_turns=2, metrics=AgentLoopMetrics())
    kwargs = {"data_source": "synthetic", "reward_model": {"ground_truth": truth, "style": "rule"},
              "extra_info": {"index": index}, "raw_prompt": [{"role": "user", "content": "what is it?"}],
              "uid": f"u{index}", "session_id": 0, "global_steps": 1, "index": index}
    return output, kwargs


class RowsSeen:
    """The reward-loop actor's side: keeps each row as Ray would deliver it (pickled), to rebuild verl's path."""

    def __init__(self):
        self.rows = []

    def compute_score(self, data) -> dict:
        self.rows.append(pickle.loads(pickle.dumps(data)))
        return {"reward_score": 0.0, "reward_extra_info": {}}


def test_verls_compute_score_gives_what_verls_reward_worker_gives(config, tokenizer):
    local = local_reward.reward_handles(config, ["verl's actor handles"])
    assert len(local) == 1 and isinstance(local[0], local_reward.LocalRewardHandle)
    seen = AsActor(RowsSeen())
    requests = [output_and_kwargs(tokenizer, text, truth, i) for i, (text, truth) in enumerate(RESPONSES)]

    async def score_all(handles):
        worker = worker_with(config, tokenizer, handles)
        outputs = [output.model_copy(deep=True) for output, _ in requests]
        await asyncio.gather(*(worker._compute_score([out], kwargs=kw) for out, (_, kw) in zip(outputs, requests)))
        return outputs

    ours = asyncio.run(score_all(local))
    asyncio.run(score_all([seen]))
    assert seen.calls == ["compute_score"] * len(RESPONSES)

    async def reference():
        actor = RewardLoopWorker(config)  # what the actor runs on the row Ray unpickles
        return [await actor.compute_score(row) for row in seen.obj.rows]

    expected = asyncio.run(reference())
    assert [out.reward_score for out in ours] == [r["reward_score"] for r in expected] == [1.0, -1.0, -1.0, 1.0, -1.0]
    assert [out.extra_fields["reward_extra_info"] for out in ours] == [r["reward_extra_info"] for r in expected]
    assert [info["acc"] for info in (r["reward_extra_info"] for r in expected)] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert local[0].worker is not None  # built once, on the first request, and kept
    # verl's naive manager writes num_turns and rollout_reward_scores into the row's extra_info: a copy's, as
    # over Ray, never the request's own (which the worker then stores in TransferQueue with the trajectory)
    assert "num_turns" in seen.obj.rows[0].non_tensor_batch["extra_info"][0]
    assert all(kw["extra_info"] == {"index": i} for i, (_, kw) in enumerate(requests))


def test_the_setting_chooses_the_handles(config):
    actors = ["verl's actor handles"]
    assert local_reward.reward_handles(config, None) is None  # verl scores on the driver: nothing to replace
    off = config.copy()
    off.stapo.reward_in_agent_loop = False
    assert local_reward.reward_handles(off, actors) is actors
    # off in the trainer's defaults (a GPU preset), on in the CPU presets (one server, a rule)
    assert local_reward.reward_handles(config_for_verl("model_preset=qwen3_1p7b"), actors) is actors
    for preset in ("tiny", "testbed", "tailbed"):
        assert config_for_verl(f"model_preset={preset}").stapo.reward_in_agent_loop is True
    with_model = config.copy()
    with_model.reward.reward_model.enable = True
    assert local_reward.reward_handles(with_model, actors) is actors


@pytest.mark.parametrize("value", ["yes", 1, "null"])
def test_a_bad_value_is_refused_before_ray_starts(value):
    with pytest.raises(STAPOConfigError, match=r"stapo.reward_in_agent_loop must be true or false"):
        validate_run_config(config_for_verl("model_preset=tiny", f"stapo.reward_in_agent_loop={value}"))


def test_with_a_reward_model_it_is_refused_before_ray_starts():
    with pytest.raises(STAPOConfigError, match=r"reward.reward_model.enable=true .* set it to false"):
        validate_run_config(config_for_verl("model_preset=tiny", "stapo.reward_in_agent_loop=true",
                                            "reward.reward_model.enable=true"))


def test_the_cpu_presets_start_no_reward_loop_actor_and_zero_needs_the_setting():
    """reward.num_workers=0 on the CPU presets: the agent-loop worker scores, no idle reward-loop process is started.
    Zero without stapo.reward_in_agent_loop would leave verl's agent loop an empty list to pick a scorer from."""
    for preset in ("tiny", "testbed", "tailbed", "smollm2"):
        assert config_for_verl(f"model_preset={preset}").reward.num_workers == 0
    validate_run_config(config_for_verl("model_preset=tiny"))
    validate_run_config(
        config_for_verl("model_preset=tiny", "stapo.reward_in_agent_loop=false", "reward.num_workers=1"))
    for off in ("stapo.reward_in_agent_loop=false", "actor_rollout_ref.rollout.agent.agent_loop_manager_class=null"):
        with pytest.raises(STAPOConfigError, match=r"^reward.num_workers must be an integer >= 1, got 0 \(0 only with "
                                                   r"stapo.reward_in_agent_loop=true and the recipe's agent-loop "
                                                   r"manager, actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                                                   r"stapo.verl_plugin.training.shared_agent_loops.SharedLoopManager\)$"):
            validate_run_config(config_for_verl("model_preset=tiny", off))
    for bad in ("-1", "true", "'2'"):
        with pytest.raises(STAPOConfigError, match=r"^reward.num_workers must be an integer >= 0, got"):
            validate_run_config(config_for_verl("model_preset=tiny", f"reward.num_workers={bad}"))
    assert config_for_verl("model_preset=qwen3_1p7b").reward.num_workers >= 1  # verl's own on the GPU presets
