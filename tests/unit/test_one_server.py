"""Requests straight to the one rollout server (stapo/verl_plugin/opt_in/one_server.py): verl's own load balancer
(``GlobalRequestLoadBalancer``, its real class, called through tests/actor_shim.py, which answers ``.remote`` as
an actor does, counting the calls) is asked once, then every request goes to its server with no balancer call; with
two servers (the CPU presets on two nodes) the client says so and balances every request as verl's does; the
setting chooses the client.
The server is a stand-in that records requests (the HF server needs a Ray cluster); a whole run with it is
tests/e2e/test_paired.py (its GRPO run on the CPU presets' direct client equals, bit for bit, its STAPO run
through verl's balancer)."""

from __future__ import annotations

import asyncio

import pytest
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.router import GlobalRequestLoadBalancer

from stapo.verl_plugin.opt_in import one_server
from stapo.verl_plugin.preflight.run_checks import STAPOConfigError, validate_run_config
from tests.actor_shim import AsActor
from tests.recipe_config import config_for_verl


class Server:
    """Records each request's prompt; answers with the prompt reversed, after yielding to the event loop once so that
    concurrent requests are in flight together, as on a real server (without it each request is acquired and
    released before the next, every choice is a tie and verl's balancer picks at random: 1 run in 128 sent all 8 to
    one server)."""

    def __init__(self):
        self.prompts = []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.prompts.append(list(prompt_ids))
        await asyncio.sleep(0)
        return TokenOutput(token_ids=prompt_ids[::-1], log_probs=None, extra_fields={"global_steps": 3})


@pytest.fixture
def config():
    return config_for_verl("model_preset=tiny", "stapo.one_server_direct=true")


def balancer_with(servers):
    return AsActor(GlobalRequestLoadBalancer(servers={name: AsActor(server) for name, server in servers.items()}))


def test_the_balancer_is_asked_once_then_every_request_goes_to_its_server(config):
    server = Server()
    balancer = balancer_with({"only": server})
    client = one_server.client_for(config, LLMServerClient(config, load_balancer_handle=balancer))
    assert type(client) is one_server.OneServerClient

    async def requests():
        return await asyncio.gather(*(
            client.generate(f"r{i}", prompt_ids=[i, i + 1], sampling_params={"temperature": 1.0}) for i in range(6)))

    outputs = asyncio.run(requests())
    assert [out.token_ids for out in outputs] == [[i + 1, i] for i in range(6)]
    assert sorted(server.prompts) == [[i, i + 1] for i in range(6)]
    assert outputs[0].extra_fields["min_global_steps"] == 3  # verl's generate still finishes each output
    assert balancer.calls.count("acquire_server") == 1 and balancer.calls.count("release_server") == 1
    assert balancer.calls.count("get_all_servers") == 1 and len(balancer.calls) == 5  # + two field queries
    assert balancer.obj.get_inflight_count("only") == 0
    asyncio.run(requests())
    assert len(balancer.calls) == 5 and len(server.prompts) == 12

    verls = LLMServerClient(config, load_balancer_handle=balancer_with({"only": Server()}))
    asyncio.run(verls.generate("r", prompt_ids=[1], sampling_params={}))
    assert verls._load_balancer.calls.count("acquire_server") == 1  # verl's: two balancer calls every request


def test_with_two_servers_every_request_goes_through_the_balancer_as_in_verl(config, capsys):
    servers = {"a": Server(), "b": Server()}
    balancer = balancer_with(servers)
    client = one_server.client_for(config, LLMServerClient(config, balancer))

    async def requests():
        return await asyncio.gather(*(
            client.generate(f"r{i}", prompt_ids=[i], sampling_params={}) for i in range(8)))

    assert [out.token_ids for out in asyncio.run(requests())] == [[i] for i in range(8)]
    assert client.balanced
    assert "stapo.one_server_direct=true: the load balancer holds 2 rollout servers" in capsys.readouterr().out
    assert balancer.calls.count("acquire_server") == 8 and balancer.calls.count("release_server") == 8
    assert balancer.calls.count("get_all_servers") == 1
    assert servers["a"].prompts and servers["b"].prompts  # the balancer spread them, as it does for verl's client
    assert sorted(servers["a"].prompts + servers["b"].prompts) == [[i] for i in range(8)]
    assert balancer.obj.get_inflight_count("a") == balancer.obj.get_inflight_count("b") == 0


def test_the_setting_chooses_the_client(config):
    plain = LLMServerClient(config, load_balancer_handle=balancer_with({"only": Server()}))
    plain.tokenizer = "set by verl's worker after construction"
    direct = one_server.client_for(config, plain)
    assert direct._load_balancer is plain._load_balancer and direct.tokenizer == plain.tokenizer
    off = config_for_verl("model_preset=tiny", "stapo.one_server_direct=false")
    assert one_server.client_for(off, plain) is plain
    # off in the trainer's defaults (a GPU preset), on in the CPU presets (one HF server)
    assert one_server.client_for(config_for_verl("model_preset=qwen3_1p7b"), plain) is plain
    for preset in ("tiny", "testbed", "tailbed"):
        assert config_for_verl(f"model_preset={preset}").stapo.one_server_direct is True
    fully_async = FullyAsyncLLMServerClient(config, load_balancer_handle=plain._load_balancer)
    assert one_server.client_for(config, fully_async) is fully_async  # keeps its own routing


@pytest.mark.parametrize("value", ["yes", 0])
def test_a_bad_value_is_refused_before_ray_starts(value):
    with pytest.raises(STAPOConfigError, match=r"stapo.one_server_direct must be true or false"):
        validate_run_config(config_for_verl("model_preset=tiny", f"stapo.one_server_direct={value}"))
