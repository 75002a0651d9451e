"""The submission-ordered replay buffer: trajectories in dataloader order, whatever order they finished in."""

from __future__ import annotations

import random

import pytest
from omegaconf import OmegaConf

from stapo.verl_plugin.reproducible.replay_order import SAMPLER_NAME, SubmissionOrderReplayBuffer, trajectory_order
from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME, pin_reproducibility


def test_order_is_submission_then_session_then_output():
    prompts = ["f3a9-uid", "0b1c-uid", "77aa-uid"]  # submission order, not sorted
    expected = [f"{uid}_{session}_{index}" for uid in prompts for session in range(10) for index in range(2)]
    finished = expected[:]
    random.Random(0).shuffle(finished)
    assert [finished[i] for i in trajectory_order(finished, prompts)] == expected  # session 10 after 9


def test_a_trajectory_of_an_unknown_prompt_is_refused():
    with pytest.raises(KeyError, match="never submitted"):
        trajectory_order(["a_0_0", "b_0_0"], ["a"])


def _buffer(mode="sync"):
    return SubmissionOrderReplayBuffer(
        trainer_mode=mode,
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
    )


def test_buffer_selects_and_materialises_in_submission_order(monkeypatch):
    from verl.trainer.ppo.v1 import replay_buffer

    cleared = []  # no TransferQueue controller in a unit test (the e2e runs the real one): record the clear
    monkeypatch.setattr(replay_buffer.tq, "kv_clear", lambda **kw: cleared.append(kw))
    buffer = _buffer()
    submitted = ["c", "a", "b"]
    buffer.prompt_global_steps["train"] = {uid: 1 for uid in submitted}
    buffer.partitions["train"] = {f"{uid}_{s}_0": {"status": "success"} for uid in ("b", "c", "a") for s in (1, 0)}
    selected, snapshot, _ = buffer._select_prompt_uids("train", {"a", "b", "c"}, 2)
    assert selected == ["c", "a"]
    batch = buffer._materialize_batch("train", selected, snapshot)
    assert batch.keys == ["c_0_0", "c_1_0", "a_0_0", "a_1_0"]
    assert cleared == [{"partition_id": "train", "keys": ["c", "a"]}]


def test_buffer_is_sync_only():
    with pytest.raises(ValueError, match="sync replay buffer"):
        _buffer("async")


def _config(**extra):
    base = {
        "actor_rollout_ref": {"rollout": {"agent": {"default_agent_loop": "single_turn_agent"}}},
        "trainer": {"v1": {"sampler": {"custom_sampler": {"path": None, "name": None}}}},
    }
    config = OmegaConf.merge(base, extra)
    OmegaConf.set_struct(config, True)
    return config


def test_pin_sets_the_seeded_loop_and_the_ordered_buffer():
    config = _config()
    assert len(pin_reproducibility(config)) == 2
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_LOOP_NAME
    assert config.trainer.v1.sampler.custom_sampler.name == SAMPLER_NAME


def test_pin_keeps_what_the_user_chose():
    config = _config(
        actor_rollout_ref={"rollout": {"agent": {"default_agent_loop": "tool_agent"}}},
        algorithm={"filter_groups": {"enable": True}},
    )
    assert pin_reproducibility(config) == []
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent"
    assert config.trainer.v1.sampler.custom_sampler.name is None


def test_finished_rollouts_are_polled_often_enough_for_a_tiny_model():
    """verl's default 2 s poll would round every generation up to a multiple of 2 s."""
    from stapo.verl_plugin.reproducible.replay_order import POLL_INTERVAL_S

    assert _buffer().poll_interval == POLL_INTERVAL_S <= 0.1
