"""The ``stapo_seeded`` agent loop: verl's single-turn loop that sends a per-request sampling seed.

Chosen with ``actor_rollout_ref.rollout.agent.default_agent_loop=stapo_seeded``; the seed comes
from ``stapo.verl_plugin.seeding.seed_for_request``. Everything else is verl's loop unchanged.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from stapo.verl_plugin.seeding import AGENT_LOOP_NAME, seed_for_request


@register(AGENT_LOOP_NAME)
class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop with ``sampling_params['seed']`` set for each request."""

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        rollout_seed = int(self.rollout_config.get("seed", 42))
        seeded = dict(sampling_params, seed=seed_for_request(rollout_seed, kwargs))
        return await super().run(seeded, **kwargs)
