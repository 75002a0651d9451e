"""A rollout back-end that generates with HF ``generate()``: verl's rollout protocol, no vLLM.

Pieces, in verl's own terms (hybrid mode: actor and rollout share the worker processes):
- ``HFServerAdapter`` lives in each actor worker (verl's ``get_rollout_class``); after every update
  verl hands it the actor's weights and it forwards them to its replica's server.
- ``HFReplica`` (verl's ``RolloutReplica``) launches one ``HFGenerationServer`` Ray actor per
  replica; the agent loop sends token-in/token-out ``generate`` requests to it.
- ``HFGenerationServer`` generates the n samples of a prompt together (one batch whose composition
  is fixed by the group, never by timing) from per-request seeds (reproducible, see
  docs/reproducibility.md) and returns raw-logit log-probs, so rollout and actor log-probs can be
  compared. When the trainer announces a submission's row count (``announce_submissions``, one
  server only), every request of the submission decodes in ONE batch instead: a step's 8 groups, or
  a validation's 64, cost one forward per token instead of one per group. Either way each request is
  answered as soon as its own row ends, while the batch decodes on (the tokens do not change).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import secrets
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from stapo.models.generation import generation_ids
from stapo.models.qwen3 import UNUSED_FROM_KEY
from stapo.verl_plugin.cpu import ROLLOUT_NAME
from stapo.verl_plugin.cpu.sampling import TOKEN_STATS_FIELD, Sampling, sample_batch
from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME

logger = logging.getLogger(__name__)

# sampling_params entry the stapo_seeded agent loop adds for this server only: {"key", "size", "index"}
GROUP_PARAM = "stapo_group"
# the n requests of a group are created together by verl's agent loop worker; one that has not
# arrived after this long never will (a per-prompt n the agent loop could not see), so fail loudly
GROUP_WAIT_S = 300.0
# stapo.hf_rollout_batch: a trainer submission's requests as one batch, or each prompt's group on its own
BATCH_CHOICES = ("submission", "group")


@dataclass
class _PendingGroup:
    """The requests of one prompt's group that have arrived, by sample index."""

    size: int
    prompt_ids: list[int]
    sampling: Sampling
    seeds: dict[int, int | None] = field(default_factory=dict)
    futures: dict[int, asyncio.Future] = field(default_factory=dict)
    complete: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _PendingBatch:
    """An announced submission: its row count and the requests that have arrived, in arrival order."""

    rows: int
    requests: list[tuple[list[int], Sampling, int | None, asyncio.Future]] = field(default_factory=list)


def _resolve(future: asyncio.Future, result: tuple) -> None:
    """A row's result on its request's future, once (a row that ended early was handed over already)."""
    if not future.done():
        future.set_result(result)


def batch_order(requests: list[tuple[list[int], Sampling, int | None, Any]]) -> list[int]:
    """The rows' decode order: by sampling settings, prompt and seed, so never by arrival (ties are the same
    request twice, whose results are equal)."""
    def key(i: int):
        prompt, sampling, seed, _ = requests[i]
        return dataclasses.astuple(sampling), prompt, -1 if seed is None else seed

    return sorted(range(len(requests)), key=key)


def server_name(replica_rank: int, suffix: str = "") -> str:
    """Named actor shared by the replica (creates it) and the adapter (sends weights to it)."""
    job = ray.get_runtime_context().get_job_id()
    return f"stapo_hf_rollout_{job}_{replica_rank}{suffix}"


class HFGenerationServer:
    """One replica's generation server: an HF causal LM on CPU.

    The samples of one prompt (a group, announced by the ``stapo_seeded`` agent loop in
    ``sampling_params["stapo_group"]``) are generated together once all of them have arrived: the
    prompt is encoded once and the rows decode as one batch, each from its own ``torch.Generator``
    seeded from ``sampling_params["seed"]``. A request without a group is a group of one. Groups run
    in a pool of threads with one intra-op thread each, so what a group computes does not depend on
    timing, on which groups run beside it, or on the machine's core count. Requests without a seed
    get a fresh random one (logged once).
    """

    def __init__(
        self, model_path: str, response_length: int, prompt_length: int, dtype: str = "float32", threads: int = 0
    ):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)  # one thread per request: kernels reduce in the same order everywhere
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=getattr(torch, dtype), attn_implementation="sdpa"
        ).eval()
        self.response_length = response_length
        self.prompt_length = prompt_length
        self.eos_ids = generation_ids(self.model.generation_config).eos_ids
        # ids the task never needs (a testbed's filler tokens), as the model's config declares them
        self.unused_from = getattr(self.model.config, UNUSED_FROM_KEY, None)
        self.global_steps = None
        self.weight_version = 0
        self.threads = threads if threads > 0 else max(1, min(4, os.cpu_count() or 1))
        self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="stapo_hf")
        self._warned_unseeded = False
        self._groups: dict[str, _PendingGroup] = {}
        self._batches: deque[_PendingBatch] = deque()

    async def launch_server(self):
        return True

    async def get_server_address(self):
        return "127.0.0.1", 0

    async def load_weights(self, state: dict[str, torch.Tensor]) -> int:
        """Replace the weights with the actor's; refuses names the model does not have."""
        own = self.model.state_dict(keep_vars=True)  # includes tied names such as lm_head.weight
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"rollout model has no parameters named {unknown[:5]} (of {len(unknown)})")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        self.weight_version += 1
        return len(state)

    async def get_weight_version(self) -> int:
        return self.weight_version

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def expect_batch(self, rows: int) -> None:
        """The next ``rows`` requests are one submission: decode them as one batch (see the module docstring)."""
        if rows < 1:
            raise ValueError(f"HF rollout: a submission of {rows} rows")
        self._batches.append(_PendingBatch(int(rows)))

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs):
        params = dict(sampling_params)
        group = params.pop(GROUP_PARAM, None)
        sampling = self.sampling(prompt_ids, params)
        seed = self._seed(request_id, params.get("seed"), sampling)
        if self._batches:
            tokens, log_probs, stop, stats = await self._generate_in_batch(list(prompt_ids), sampling, seed)
        elif group is None or int(group["size"]) == 1:
            tokens, log_probs, stop, stats = (await self._sample([list(prompt_ids)], sampling, [seed]))[0]
        else:
            tokens, log_probs, stop, stats = await self._generate_in_group(group, list(prompt_ids), sampling, seed)
        extra = {"global_steps": self.global_steps, **({TOKEN_STATS_FIELD: stats} if stats is not None else {})}
        return TokenOutput(token_ids=tokens, log_probs=log_probs, stop_reason=stop, extra_fields=extra)

    async def _sample(
        self, prompts: list[list[int]], sampling: Sampling, seeds: list[int | None],
        futures: list[asyncio.Future] | None = None,
    ) -> list[tuple]:
        """``sample_batch`` (one row per prompt and seed) in the server's thread pool (one intra-op thread each,
        see the class docstring). With ``futures`` (one a row), each row's result is set on its future as soon as
        the row ends, while the batch decodes on: the agent loop post-processes that sample meanwhile, on another
        core. The tokens are the same either way; only when they are handed over changes."""
        loop = asyncio.get_running_loop()
        on_row_done = None
        if futures is not None:
            def on_row_done(row: int, result: tuple) -> None:  # runs in the pool's thread
                loop.call_soon_threadsafe(_resolve, futures[row], result)

        run = (sample_batch, self.model, prompts, sampling, seeds, self.eos_ids, self.unused_from, on_row_done)
        results = await loop.run_in_executor(self._pool, *run)
        for future, result in zip(futures or (), results):
            _resolve(future, result)
        return results

    def _seed(self, request_id: str, seed: int | None, sampling: Sampling) -> int | None:
        if seed is None and not sampling.greedy:
            seed = secrets.randbits(63)
            if not self._warned_unseeded:
                self._warned_unseeded = True
                logger.warning(
                    "HF rollout: a request came without sampling_params['seed'] (request %s); it is sampled "
                    "from a random seed and the run is not reproducible. The stapo_seeded agent loop "
                    "(actor_rollout_ref.rollout.agent.default_agent_loop=stapo_seeded) sends one.",
                    request_id,
                )
        return seed

    async def _generate_in_group(self, group: dict, prompt_ids: list[int], sampling: Sampling, seed: int | None):
        """Wait for the group's other requests, generate all of them as one batch, return this one's result."""
        key, size, index = str(group["key"]), int(group["size"]), int(group["index"])
        pending = self._groups.setdefault(key, _PendingGroup(size, prompt_ids, sampling))
        if (size, prompt_ids, sampling) != (pending.size, pending.prompt_ids, pending.sampling):
            raise ValueError(f"HF rollout group {key}: its requests differ in prompt, sampling or group size")
        if not 0 <= index < size or index in pending.futures:
            raise ValueError(f"HF rollout group {key}: sample index {index} is outside [0, {size}) or came twice")
        future = pending.futures[index] = asyncio.get_running_loop().create_future()
        pending.seeds[index] = seed
        if len(pending.futures) < size:
            try:  # the timeout covers the wait for the siblings only, not the generation itself
                await asyncio.wait_for(pending.complete.wait(), timeout=GROUP_WAIT_S)
            except asyncio.TimeoutError:
                self._groups.pop(key, None)
                raise RuntimeError(
                    f"HF rollout group {key}: {len(pending.futures)} of {size} requests arrived in "
                    f"{GROUP_WAIT_S:.0f} s; the group size the agent loop announced does not match the requests "
                    "verl sent"
                ) from None
            return await future
        del self._groups[key]
        pending.complete.set()
        order = sorted(pending.futures)
        try:
            await self._sample([prompt_ids] * len(order), sampling, [pending.seeds[i] for i in order],
                               [pending.futures[i] for i in order])
        except Exception as exc:  # every waiting member of the group sees the failure; this one raises it
            for i in order:
                if pending.futures[i] is not future and not pending.futures[i].done():
                    pending.futures[i].set_exception(exc)
            raise
        return await future

    async def _generate_in_batch(self, prompt_ids: list[int], sampling: Sampling, seed: int | None):
        """Join the announced submission; its last request decodes all of them (one batch per sampling
        setting, in :func:`batch_order`) and hands every request its row."""
        batch = self._batches[0]
        future = asyncio.get_running_loop().create_future()
        batch.requests.append((prompt_ids, sampling, seed, future))
        if len(batch.requests) < batch.rows:
            try:  # the timeout covers the wait for the submission's other requests only
                return await asyncio.wait_for(asyncio.shield(future), timeout=GROUP_WAIT_S)
            except asyncio.TimeoutError:
                if self._batches and self._batches[0] is batch:
                    self._batches.popleft()
                raise RuntimeError(
                    f"HF rollout: {len(batch.requests)} of the {batch.rows} requests the trainer announced arrived in "
                    f"{GROUP_WAIT_S:.0f} s"
                ) from None
        self._batches.popleft()
        try:  # batch_order puts the rows of one sampling setting together: one batch each
            for setting, same in itertools.groupby(batch_order(batch.requests), key=lambda i: batch.requests[i][1]):
                rows = list(same)
                await self._sample([batch.requests[i][0] for i in rows], setting, [batch.requests[i][2] for i in rows],
                                   [batch.requests[i][3] for i in rows])
        except Exception as exc:  # every waiting request of the submission sees the failure
            for *_, waiting in batch.requests:
                if not waiting.done():
                    waiting.set_exception(exc)
            raise
        return await future

    def sampling(self, prompt_ids: list[int], params: dict[str, Any]) -> Sampling:
        """verl's sampling params with vLLM's max-token rule (response_length, and the context budget)."""
        max_tokens = params.get("max_tokens", params.get("max_new_tokens"))
        limit = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_tokens = max(1, min(int(max_tokens), limit) if max_tokens is not None else limit)
        top_k = int(params.get("top_k", -1) or -1)
        return Sampling(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=max(0, top_k),
            max_tokens=max_tokens,
            logprobs=bool(params.get("logprobs", False)),
        )

    # lifecycle calls verl makes on every rollout server: nothing to free on a CPU
    async def wake_up(self):
        return None

    async def sleep(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        return None

    async def resume_generation(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class HFReplica(RolloutReplica):
    """verl's replica for the HF server; hybrid mode only (the CPU recipe colocates everything)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        server_cls = ray.remote(HFGenerationServer)
        server = server_cls.options(
            name=server_name(self.replica_rank, self.name_suffix),
            max_concurrency=self.max_concurrency,
            num_cpus=0,
        ).remote(
            model_path=self.model_config.get("local_path", None) or self.model_config.path,
            response_length=self.config.response_length,
            prompt_length=self.config.prompt_length,
            dtype=self.config.dtype if self.config.dtype in ("float32", "bfloat16", "float16") else "float32",
        )
        await server.launch_server.remote()
        self.servers.append(server)
        self._server_handle = server
        self._server_address = "127.0.0.1:0"


def announce_submissions(agent_loop_manager, config) -> bool:
    """Driver side: before verl's agent loop manager dispatches a submission (a step's prompts, a validation
    batch), tell the HF server how many requests it will get, so it decodes them as one batch.

    Only with ``stapo.hf_rollout_batch=submission`` (the default) and one server: with several, verl's load
    balancer splits a submission by timing. Returns whether
    the manager was wrapped. The count is one request per sample: ``__rollout_n__`` per prompt where the batch
    has it, else ``rollout.n`` (``val_kwargs.n`` for validation).
    """
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != ROLLOUT_NAME or rollout.agent.default_agent_loop != AGENT_LOOP_NAME:
        return False  # another loop may send several requests a sample (multi-turn, tools)
    if (config.get("stapo", None) or {}).get("hf_rollout_batch", BATCH_CHOICES[0]) != "submission":
        return False
    try:
        server = ray.get_actor(server_name(0))
    except ValueError:
        return False
    try:
        ray.get_actor(server_name(1))
        return False
    except ValueError:
        pass
    dispatch = agent_loop_manager.generate_sequences

    def generate_sequences(prompts):
        if "__rollout_n__" in prompts.keys():
            counts = prompts["__rollout_n__"]
            rows = sum(int(n) for n in (counts.tolist() if hasattr(counts, "tolist") else counts))
        else:
            validate = "validate" in prompts.keys() and bool(getattr(prompts["validate"], "data", prompts["validate"]))
            rows = len(prompts) * int(rollout.val_kwargs.n if validate else rollout.n)
        ray.get(server.expect_batch.remote(rows))
        return dispatch(prompts)

    agent_loop_manager.generate_sequences = generate_sequences
    return True


class HFServerAdapter(BaseRollout):
    """Runs in each actor worker: passes the actor's weights to this rank's generation server."""

    def __init__(self, config, model_config, device_mesh, *args, **kwargs):
        super().__init__(config, model_config, device_mesh, *args, **kwargs)
        self.replica_rank = device_mesh["dp"].get_local_rank() if device_mesh is not None else 0
        self.is_leader = device_mesh is None or (
            device_mesh["infer_tp"].get_local_rank() == 0 and device_mesh["infer_pp"].get_local_rank() == 0
        )
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the HF CPU rollout takes full named tensors, not {wire_format!r}")
        # every rank iterates: producing the tensors may involve collectives (FSDP full tensors)
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if self.is_leader:
            await self._server_handle().load_weights.remote(state)
        global_steps = kwargs.get("global_steps")
        if self.is_leader and global_steps is not None:
            await self._server_handle().set_global_steps.remote(global_steps)
