"""Per-request sampling seeds: the same config and seed give the same rollouts, whatever the timing.

verl 0.9.1's single-turn agent loop sends each request with a fresh ``uuid4`` id and no seed, and
``actor_rollout_ref.rollout.full_determinism=true`` gives every request the SAME vLLM seed
(``replica_rank + rollout.seed``, vllm_async_server.py ~line 627), so the n samples of a prompt
would be identical. The ``stapo_seeded`` agent loop below is verl's single-turn loop plus one
entry, ``sampling_params["seed"]``, derived from what identifies a request in verl's v1 trainer
(``AgentLoopWorkerTQ._run_prompt`` passes these to the loop): the rollout seed
``actor_rollout_ref.rollout.seed``, the step (``global_steps``), the prompt (dataset ``index`` and
a hash of ``raw_prompt``: the batch ``uid`` is a fresh uuid4 every run) and the sample
(``session_id`` in [0, n)). vLLM takes the key as its per-request ``SamplingParams.seed``; the CPU
back-end's HF server seeds a ``torch.Generator`` with it. See docs/reproducibility.md.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

AGENT_LOOP_NAME = "stapo_seeded"
SEED_BITS = 63  # vLLM and torch.Generator both take a non-negative int64
# default_agent_loop values that pin_reproducibility replaces with the seeded loop (unset, or verl's default)
REPLACED_AGENT_LOOPS = (None, "single_turn_agent")


def request_seed(rollout_seed: int, step: int, prompt_key: str, sample: int | str) -> int:
    """A 63-bit seed from (rollout seed, step, prompt, sample index): stable across runs and machines."""
    payload = json.dumps([int(rollout_seed), int(step), str(prompt_key), str(sample)]).encode()
    digest = hashlib.blake2b(payload, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << SEED_BITS) - 1)


def prompt_key(index: Any, raw_prompt: Any) -> str:
    """The dataset row and a hash of its messages (two datasets may both have an index 3)."""
    text = json.dumps(_plain(raw_prompt), sort_keys=True, default=str)
    return f"{_plain(index)}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def seed_for_request(rollout_seed: int, kwargs: dict[str, Any]) -> int:
    """The seed of one agent-loop call, from the per-sample fields verl passes to ``AgentLoopBase.run``.

    verl's v1 (TransferQueue) trainer passes ``session_id``; its older DataProto path repeats each
    prompt n times and passes the row's ``priority`` (its position in the batch) instead.
    """
    missing = [key for key in ("global_steps", "raw_prompt") if key not in kwargs]
    if missing:
        raise KeyError(f"the {AGENT_LOOP_NAME} agent loop needs {missing} from verl's agent loop worker")
    if "session_id" in kwargs:
        sample = f"s{int(kwargs['session_id'])}"
    elif "priority" in kwargs:
        sample = f"r{int(kwargs['priority'])}"
    else:
        raise KeyError(f"the {AGENT_LOOP_NAME} agent loop needs session_id or priority to tell samples apart")
    key = prompt_key(kwargs.get("index", 0), kwargs["raw_prompt"])
    return request_seed(rollout_seed, _plain(kwargs["global_steps"]), key, sample)


def _plain(value: Any) -> Any:
    """numpy scalars/arrays and tensordict wrappers to plain Python (json and int need them)."""
    value = getattr(value, "data", value) if type(value).__name__ in ("NonTensorData",) else value
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


SWITCH_KEY = "stapo.seeded_rollouts"  # false: verl's own agent loop and replay order (conf/stapo_trainer.yaml)


def seeded_rollouts(config) -> bool:
    """``stapo.seeded_rollouts`` (absent: true); anything but a boolean is refused in one line."""
    from omegaconf import OmegaConf

    from stapo.algorithm.validation import STAPOConfigError

    value = OmegaConf.select(config, SWITCH_KEY, default=True)
    if not isinstance(value, bool):
        raise STAPOConfigError(f"{SWITCH_KEY} must be true or false (got {value!r})")
    return value


def pin_reproducibility(config) -> list[str]:
    """Driver side: the seeded agent loop and the submission-ordered replay buffer, unless chosen otherwise.

    Sets ``actor_rollout_ref.rollout.agent.default_agent_loop`` when it is verl's default
    ``single_turn_agent``, and ``trainer.v1.sampler.custom_sampler`` when none is set and the run
    uses neither DAPO group filtering nor failed-group refill (verl hands a custom sampler neither).
    With ``stapo.seeded_rollouts=false`` it changes nothing: verl's own loop and replay order run.
    Returns the settings it changed, as ``key=value`` strings.
    """
    from omegaconf import OmegaConf

    from stapo.verl_plugin.reproducible.replay_order import SAMPLER_NAME, SAMPLER_PATH

    changed = []
    if not seeded_rollouts(config):
        return changed
    agent_key = "actor_rollout_ref.rollout.agent.default_agent_loop"
    if OmegaConf.select(config, agent_key) in REPLACED_AGENT_LOOPS:
        OmegaConf.update(config, agent_key, AGENT_LOOP_NAME, force_add=True)
        changed.append(f"{agent_key}={AGENT_LOOP_NAME}")
    sampler_key = "trainer.v1.sampler.custom_sampler"
    custom = OmegaConf.select(config, sampler_key) or {}
    dapo = bool(OmegaConf.select(config, "algorithm.filter_groups.enable", default=False))
    refill = bool(OmegaConf.select(config, "trainer.v1.sampler.sync_refill_failed_groups", default=False))
    if not (custom.get("path") or custom.get("name")) and not dapo and not refill:
        OmegaConf.update(config, f"{sampler_key}.path", SAMPLER_PATH, force_add=True)
        OmegaConf.update(config, f"{sampler_key}.name", SAMPLER_NAME, force_add=True)
        changed.append(f"{sampler_key}.name={SAMPLER_NAME}")
    return changed
