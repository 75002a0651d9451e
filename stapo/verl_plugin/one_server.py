"""verl's rollout client for a run with ONE rollout server: requests go straight to it, not through the load balancer.

verl's ``LLMServerClient.generate`` makes two Ray calls to the global load balancer around every request (acquire,
which returns the chosen server's actor handle, and release): 128 extra Ray calls a testbed step and 1,024 a
validation, all on the agent-loop worker's one event loop, whose per-request work is on the critical path once
the server has decoded a submission in one batch (BENCHMARKS.md, "agent-loop worker's hops"). With one server
there is nothing to balance and no session to keep sticky: ``OneServerClient`` asks the balancer once, checks it
holds exactly one server, and sends every later request to that server. Its in-flight counts then stay at zero,
which only a balancer choosing among several servers would read.

Off by default (``stapo.one_server_direct``); the CPU presets (one HF server; conf/model_preset/tiny.yaml and those
built on it) turn it on. A run whose balancer holds several servers, or adds servers later (elastic or fully async
rollout), keeps verl's client: the first request fails, naming the setting, if the balancer does not hold exactly one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from omegaconf import OmegaConf
from verl.workers.rollout.llm_server import LLMServerClient

SETTING = "stapo.one_server_direct"


class OneServerClient(LLMServerClient):
    """``LLMServerClient`` that takes its one server from the load balancer on the first request and keeps it."""

    def __init__(self, config, load_balancer_handle=None, **kwargs):
        super().__init__(config, load_balancer_handle=load_balancer_handle, **kwargs)
        self._one_server: asyncio.Task | None = None  # the first request's lookup, awaited by every request

    async def _acquire_server(self, request_id: str, **extra):
        if self._one_server is None:
            self._one_server = asyncio.ensure_future(self._find_one_server(request_id, **extra))
        return await self._one_server

    async def _find_one_server(self, request_id: str, **extra) -> tuple[str, Any]:
        servers = await self._load_balancer.get_all_servers.remote()
        if len(servers) != 1:
            raise RuntimeError(f"{SETTING}=true needs exactly one rollout server; the load balancer holds "
                               f"{len(servers)}: set {SETTING}=false")
        chosen = await super()._acquire_server(request_id, **extra)
        super()._release_server(chosen[0], request_id=request_id)
        return chosen

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        return None  # nothing was counted in


def client_for(config, client):
    """The client the agent-loop worker should use: ``client`` itself, or a ``OneServerClient`` on the same
    balancer when ``config`` asks for it and ``client`` is verl's plain client (a subclass, such as the fully
    async one, keeps its own routing)."""
    if not OmegaConf.select(config, SETTING, default=False) or type(client) is not LLMServerClient:
        return client
    direct = OneServerClient(client.config, load_balancer_handle=client._load_balancer)
    for name, value in vars(client).items():  # what verl set on it after construction (a trace tokenizer)
        direct.__dict__.setdefault(name, value)
    return direct
