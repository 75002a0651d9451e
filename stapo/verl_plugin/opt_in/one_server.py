"""verl's rollout client for a run with ONE rollout server: requests go straight to it, not through the load balancer.

verl's ``LLMServerClient.generate`` makes two Ray calls to the global load balancer around every request (acquire,
which returns the chosen server's actor handle, and release): 128 extra Ray calls a testbed step and 1,024 a
validation, all on the agent-loop worker's one event loop, whose per-request work is on the critical path once
the server has decoded a submission in one batch (docs/benchmarks-history.md, "agent-loop worker's hops"). With one
server
there is nothing to balance and no session to keep sticky: ``OneServerClient`` asks the balancer once, checks it
holds exactly one server, and sends every later request to that server. Its in-flight counts then stay at zero,
which only a balancer choosing among several servers would read.

Off by default (``stapo.one_server_direct``); the CPU presets (conf/model_preset/tiny.yaml and those built on it)
turn it on. When the balancer holds several servers (the same presets on two nodes or two rollout replicas: one
server each), the client says so once and goes on as verl's, through the balancer for every request, so the
setting never stops a run. A run that adds servers later (fully async rollout) keeps verl's client subclass.
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
        # the first request's lookup, awaited by every request: the one server, or None when there are several
        self._one_server: asyncio.Task | None = None

    async def _acquire_server(self, request_id: str, **extra):
        if self._one_server is None:
            self._one_server = asyncio.ensure_future(self._find_one_server(request_id, **extra))
        chosen = await self._one_server
        return chosen if chosen is not None else await super()._acquire_server(request_id, **extra)

    async def _find_one_server(self, request_id: str, **extra) -> tuple[str, Any] | None:
        servers = await self._load_balancer.get_all_servers.remote()
        if len(servers) != 1:
            print(f"[stapo] {SETTING}=true: the load balancer holds {len(servers)} rollout servers; requests go "
                  "through it as in verl", flush=True)
            return None
        chosen = await super()._acquire_server(request_id, **extra)
        super()._release_server(chosen[0], request_id=request_id)
        return chosen

    @property
    def balanced(self) -> bool:
        """True once the first request found several servers (every request then goes through the balancer)."""
        return self._one_server is not None and self._one_server.done() and self._one_server.result() is None

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        if self.balanced:
            super()._release_server(server_id, request_id=request_id)
        # with one server nothing was counted in


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
