"""A prompt group's samples put into TransferQueue in one call (stapo/verl_plugin/opt_in/group_puts.py).

Real parts: a local Ray with TransferQueue started as verl's task runner starts it, and verl's own
``AgentLoopWorkerTQ._agent_loop_postprocess`` building and putting each sample; only the worker's Ray actor is left
out (its state is set on a ``SharedLoopWorker`` object, as tests/unit/test_local_reward.py does). The rows one
grouped put stores are compared, field by field, with the rows verl's per-sample puts store for the same samples;
that whole testbed runs log the same numbers with it is docs/benchmarks-history.md's "a group's samples put at once"
(four runs,
every logged value hashed)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.trainer.ppo.v1 import agent_loop_tq

from benchmarks.tq_roundtrip import transfer_queue
from stapo.verl_plugin.opt_in import group_puts
from stapo.verl_plugin.preflight.run_checks import STAPOConfigError, validate_run_config
from stapo.verl_plugin.training.shared_agent_loops import SharedLoopWorker
from tests.recipe_config import config_for_verl

PARTITION = "val"
# response lengths of a group's samples: unequal (one jagged column), then equal (one stacked column)
GROUPS = {"unequal": (5, 1, 9), "equal": (4, 4)}


@pytest.fixture(scope="module")
def tq():
    with transfer_queue() as started:
        yield started


@pytest.fixture(scope="module")
def worker():
    """The state verl's ``_agent_loop_postprocess`` reads (no reward actors: the scores are the outputs' own)."""
    worker = object.__new__(SharedLoopWorker)
    worker.config = config_for_verl("model_preset=tiny")
    worker.processor = None
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    return worker


def sample(uid: str, session: int, length: int) -> tuple[AgentLoopOutput, dict]:
    generator = torch.Generator().manual_seed(1000 * session + length)
    prompt = torch.randint(3, 50, (6,), generator=generator).tolist()
    response = torch.randint(3, 50, (length,), generator=generator).tolist()
    output = AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=[1] * length,
                             response_logprobs=torch.randn(length, generator=generator).tolist(), num_turns=2,
                             reward_score=float(session), metrics=AgentLoopMetrics(),
                             extra_fields={"reward_extra_info": {"acc": session % 2}})
    kwargs = {"uid": uid, "session_id": session, "global_steps": 3, "index": 7, "data_source": "synthetic",
              "extra_info": {"index": 7}}
    return output, kwargs


async def postprocess_group(worker, uid: str, lengths: tuple[int, ...]) -> None:
    """What verl's ``_run_prompt`` does for a group's samples (validation: ``validate=True``), concurrently."""
    postprocess = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess
    samples = [sample(uid, i, n) for i, n in enumerate(lengths)]
    await asyncio.gather(*(postprocess(worker, output, True, **kwargs) for output, kwargs in samples))


async def listed(tq) -> dict[str, dict]:
    """The partition's keys and their tags."""
    return (await tq.async_kv_list(partition_id=PARTITION)).get(PARTITION, {})


def stored(tq, uid: str, count: int) -> list[dict]:
    keys = [f"{uid}_{i}_0" for i in range(count)]
    rows = tq.kv_batch_get(keys=keys, partition_id=PARTITION)
    return [{name: rows[name][i] for name in rows.keys()} for i in range(count)]


def assert_same_row(grouped: dict, alone: dict, uid: str, reference_uid: str) -> None:
    assert sorted(grouped) == sorted(alone)
    for name, value in grouped.items():
        expected = alone[name]
        if isinstance(value, torch.Tensor):
            assert value.dtype == expected.dtype and torch.equal(value, expected), name
        elif name == "uid":
            assert (value, expected) == (uid, reference_uid)
        else:
            assert value == expected, name


@pytest.mark.slow  # starts processes: out of make test-fast
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_groups_rows_are_stored_at_its_status_as_verls_per_sample_puts_store_them(tq, worker, monkeypatch, group):
    lengths = GROUPS[group]
    alone, grouped = f"alone-{group}", f"grouped-{group}"
    asyncio.run(postprocess_group(worker, alone, lengths))  # verl's puts, one a sample
    monkeypatch.setattr(agent_loop_tq, "tq", agent_loop_tq.tq)  # restored after the test
    monkeypatch.setattr(agent_loop_tq, "list_of_dict_to_tensordict", agent_loop_tq.list_of_dict_to_tensordict)
    proxy = group_puts.install(agent_loop_tq)
    assert group_puts.install(agent_loop_tq) is proxy  # once a process

    async def grouped_run():
        await postprocess_group(worker, grouped, lengths)
        await agent_loop_tq.tq.async_kv_put(key=grouped, partition_id=PARTITION, tag={"status": "running"})
        held = set(await listed(tq))
        await agent_loop_tq.tq.async_kv_put(key=grouped, partition_id=PARTITION, tag={"status": "finished"})
        return held, await listed(tq)

    held, after = asyncio.run(grouped_run())
    keys = [f"{grouped}_{i}_0" for i in range(len(lengths))]
    assert not set(keys) & held  # nothing stored before the group's terminal status
    assert (PARTITION, grouped) not in proxy.held
    assert set(keys) <= set(after) and after[grouped]["status"] == "finished"
    assert [after[key]["response_len"] for key in keys] == list(lengths)  # verl's tags, per sample
    for mine, verls in zip(stored(tq, grouped, len(lengths)), stored(tq, alone, len(lengths)), strict=True):
        assert_same_row(mine, verls, grouped, alone)


@pytest.mark.slow
def test_a_failed_group_puts_what_finished_before_its_status_and_other_puts_pass_through(tq, worker):
    from tensordict import TensorDict

    proxy = group_puts.GroupedPuts(tq, agent_loop_tq.list_of_dict_to_tensordict)

    async def run():
        rows = group_puts.Rows([{"uid": "failing", "x": torch.tensor([1, 2])}])
        await proxy.async_kv_batch_put(keys=["failing_0_0"], partition_id=PARTITION, fields=rows, tags=[{"a": 1}])
        direct = TensorDict({"x": torch.tensor([[5, 6]])}, batch_size=[1])
        await proxy.async_kv_batch_put(keys=["direct_0_0"], partition_id=PARTITION, fields=direct)
        before = set(await listed(tq))
        await proxy.async_kv_put(key="failing", partition_id=PARTITION, tag={"status": "failure"})
        return before

    before = asyncio.run(run())
    assert "direct_0_0" in before and "failing_0_0" not in before
    assert torch.equal(tq.kv_batch_get(keys=["failing_0_0"], partition_id=PARTITION)["x"][0], torch.tensor([1, 2]))
    assert proxy.held == {}


@pytest.mark.parametrize("value", ["yes", 1])
def test_a_bad_value_is_refused_before_ray_starts(value):
    config = config_for_verl("model_preset=tiny", f"stapo.tq_group_puts={value}")
    with pytest.raises(STAPOConfigError, match="stapo.tq_group_puts must be true or false"):
        validate_run_config(config)


def test_it_is_off_unless_asked_for():
    assert not group_puts.wanted(config_for_verl("model_preset=tiny"))
    assert not group_puts.wanted(config_for_verl("model_preset=testbed"))
    assert group_puts.wanted(config_for_verl("model_preset=testbed", "stapo.tq_group_puts=true"))
