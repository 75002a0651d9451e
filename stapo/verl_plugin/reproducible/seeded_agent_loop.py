"""The ``stapo_seeded`` agent loop: verl's single-turn loop that sends a per-request sampling seed.

Chosen with ``actor_rollout_ref.rollout.agent.default_agent_loop=stapo_seeded``; the seed comes
from ``stapo.verl_plugin.reproducible.seeding.seed_for_request``. For the CPU back-end's HF server it also
announces the request's group (the n samples of one prompt), which that server generates as one
batch; vLLM gets the seed only (its sampling parameters take no other key). A validation row tagged
with a further decoding setting (``stapo.val_decodings``, see ``val_decodings``) is sampled at that
setting's temperature and top-p. Everything else is verl's loop unchanged.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from stapo.verl_plugin.cpu.rollout import GROUP_PARAM, ROLLOUT_NAME
from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME, seed_for_request
from stapo.verl_plugin.training.val_decodings import DECODING_FIELD, sampling_of

SAMPLING_KEYS = ("temperature", "top_p", "top_k")


def group_size(rollout_config, sampling_params: dict[str, Any]) -> int | None:
    """How many samples verl draws for this request's prompt, or None when the loop cannot tell.

    verl's agent loop worker does not pass the group size or the train/validation flag to the loop;
    it does pass the sampling parameters, which are ``rollout.*`` in training and
    ``rollout.val_kwargs.*`` in validation. When exactly one of the two matches, its ``n`` is the
    group size; when both match and their ``n`` agree (validation sampled like training, e.g. the
    testbed preset), that ``n``. Otherwise (both match with different ``n``, neither matches: an
    unknown override) there is no group and each request is generated on its own, which is several
    times slower on a small model (its time is per decoding step, not per row) but just as
    reproducible. Greedy
    requests (temperature 0: validation by default, or a prompt verl marks ``__do_sample__=False``,
    whose n training samples then carry validation's settings) are never grouped.
    """
    if float(sampling_params.get("temperature", 1.0)) <= 0:
        return None

    def matches(source) -> bool:
        return all(sampling_params.get(key) == source.get(key) for key in SAMPLING_KEYS)

    train, val = matches(rollout_config), matches(rollout_config.val_kwargs)
    if train and val:
        same_n = int(rollout_config.n) == int(rollout_config.val_kwargs.n)
        return int(rollout_config.n) if same_n else None
    if not (train or val):
        return None
    return int(rollout_config.n if train else rollout_config.val_kwargs.n)


@register(AGENT_LOOP_NAME)
class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop with ``sampling_params['seed']`` set for each request (and a validation
    row's decoding setting, when it names one)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        rollout_seed = int(self.rollout_config.get("seed", 42))
        seeded = dict(sampling_params, seed=seed_for_request(rollout_seed, kwargs))
        if self.rollout_config.name == ROLLOUT_NAME and "session_id" in kwargs and "uid" in kwargs:
            # the group size from the settings verl chose (val_kwargs'), before a further decoding replaces them
            size = group_size(self.rollout_config, sampling_params)
            if size is not None and size > 1:
                seeded[GROUP_PARAM] = {"key": str(kwargs["uid"]), "size": size, "index": int(kwargs["session_id"])}
        if kwargs.get(DECODING_FIELD) is not None:
            seeded.update(sampling_of(str(kwargs[DECODING_FIELD])))
        return await super().run(seeded, **kwargs)
