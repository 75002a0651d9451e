"""A rollout back-end that generates with HF ``generate()``: verl's rollout protocol, no vLLM.

Pieces, in verl's own terms (hybrid mode: actor and rollout share the worker processes):
- ``HFServerAdapter`` lives in each actor worker (verl's ``get_rollout_class``); after every update
  verl hands it the actor's weights and it forwards them to its replica's server.
- ``HFReplica`` (verl's ``RolloutReplica``) launches one ``HFGenerationServer`` Ray actor per
  replica; the agent loop sends token-in/token-out ``generate`` requests to it.
- ``HFGenerationServer`` batches concurrent requests, samples with the model's own logits and
  returns raw-logit log-probs, so rollout and actor log-probs can be compared exactly.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

logger = logging.getLogger(__name__)

ROLLOUT_NAME = "stapo_hf"
BATCH_WINDOW_S = 0.05  # how long the server waits for more requests before a batched generate


def server_name(replica_rank: int, suffix: str = "") -> str:
    """Named actor shared by the replica (creates it) and the adapter (sends weights to it)."""
    job = ray.get_runtime_context().get_job_id()
    return f"stapo_hf_rollout_{job}_{replica_rank}{suffix}"


class HFGenerationServer:
    """One replica's generation server: an HF causal LM on CPU, fed by a request queue."""

    def __init__(self, model_path: str, response_length: int, prompt_length: int, dtype: str = "float32"):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=getattr(torch, dtype), attn_implementation="sdpa"
        ).eval()
        self.response_length = response_length
        self.prompt_length = prompt_length
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        pad = self.model.generation_config.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.global_steps = None
        self.weight_version = 0
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None

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

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs):
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._serve())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((list(prompt_ids), dict(sampling_params), future))
        return await future

    async def _serve(self):
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(BATCH_WINDOW_S)
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            groups: dict[tuple, list] = {}
            for item in batch:
                groups.setdefault(self._sampling_key(item[0], item[1]), []).append(item)
            for key, items in groups.items():
                try:
                    outputs = await asyncio.to_thread(self._generate_batch, [i[0] for i in items], key)
                    for (_, _, future), output in zip(items, outputs):
                        future.set_result(output)
                except Exception as error:  # every waiting request learns why, nothing hangs
                    for _, _, future in items:
                        if not future.done():
                            future.set_exception(error)

    def _sampling_key(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple:
        max_tokens = params.get("max_tokens", params.get("max_new_tokens"))
        limit = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_tokens = max(1, min(int(max_tokens), limit) if max_tokens is not None else limit)
        top_k = int(params.get("top_k", -1) or -1)
        return (
            float(params.get("temperature", 1.0)),
            float(params.get("top_p", 1.0)),
            top_k if top_k > 0 else 0,
            max_tokens,
            bool(params.get("logprobs", False)),
        )

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], key: tuple) -> list[TokenOutput]:
        temperature, top_p, top_k, max_tokens, want_logprobs = key
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k}
        if temperature <= 0:
            sampling = {"do_sample": False}
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_tokens,
            eos_token_id=self.eos_ids or None,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=want_logprobs,
            **sampling,
        )
        new_tokens = out.sequences[:, width:]
        log_probs = None
        if want_logprobs:  # raw-logit log-probs, the quantity the actor recomputes
            logits = torch.stack(out.logits, dim=1).float()
            log_probs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        results = []
        for row in range(len(prompts)):
            tokens = new_tokens[row].tolist()
            length, stop = len(tokens), "length"
            for index, token in enumerate(tokens):
                if token in self.eos_ids:
                    length, stop = index + 1, "completed"
                    break
            results.append(
                TokenOutput(
                    token_ids=tokens[:length],
                    log_probs=log_probs[row, :length].tolist() if log_probs is not None else None,
                    stop_reason=stop,
                    extra_fields={"global_steps": self.global_steps},
                )
            )
        return results

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
