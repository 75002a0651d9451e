"""The few places where verl 0.9.1 assumes an accelerator and offers no registry to say otherwise.

Each patch replaces one module attribute, is applied only when the CPU back-end is active, and
names the verl line it stands in for. Nothing here edits verl's files.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch


def init_gloo_process_group(timeout_second=None, backend=None):
    """Stands in for verl.utils.distributed.initialize_global_process_group_ray (~line 83) where
    verl.workers.engine_workers calls it without a backend (~line 89): it then builds
    ``cpu:gloo,cpu:gloo`` on a CPU device and torch rejects the duplicate. The checkpoint engine
    passes ``backend="cpu:gloo"`` itself (checkpoint_engine/base.py ~351) and needs no patch."""
    if torch.distributed.is_initialized():
        return
    torch.distributed.init_process_group(
        backend="gloo",
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        timeout=timedelta(seconds=timeout_second) if timeout_second is not None else None,
        init_method=os.environ.get("DIST_INIT_METHOD", None),
    )


def _unpinned_offload_policy(policy_cls):
    """verl's FSDP2 reference engine hard-codes CPUOffloadPolicy(pin_memory=True) (fsdp/transformer_impl.py
    ~line 462); pinning needs an accelerator."""

    def make(*args, **kwargs):
        kwargs["pin_memory"] = False
        return policy_cls(*args, **kwargs)

    return make


# One logsumexp call covers at most this many logits (64 MiB of float32): on a 151k vocabulary about 110 rows,
# on the testbed's 27 tokens every row of a micro-batch at once.
LOGSUMEXP_CHUNK_ELEMENTS = 1 << 24


def logprobs_of_labels(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """Stands in for verl.utils.torch_functional.logprobs_from_logits where the FSDP engine imports it
    (fsdp/transformer_impl.py ~line 65). Without flash-attn's fused cross-entropy verl falls back to
    logprobs_from_logits_v2 (~line 173), which calls logsumexp once per row to bound a GPU's peak memory; with
    remove-padding the rows are the micro-batch's tokens, so a forward made thousands of calls and as many
    autograd nodes (a testbed step's update 1.25 -> 1.03 s without them, docs/benchmarks-history.md). Here rows go in
    chunks of at most LOGSUMEXP_CHUNK_ELEMENTS logits. Each row is still reduced on its own, so values and
    gradients equal v2's bit for bit with one thread (tested); with several threads v2 splits one row's
    reduction across them and this does not. ``inplace_backward`` belongs to flash-attn's kernel: unused."""
    vocab = logits.shape[-1]
    flat, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    rows = max(1, LOGSUMEXP_CHUNK_ELEMENTS // max(1, vocab))
    picked = []
    for chunk, chunk_labels in zip(flat.split(rows), flat_labels.split(rows), strict=True):
        index = chunk_labels.unsqueeze(-1)
        if chunk.dtype in (torch.float32, torch.float64):
            picked.append(chunk.gather(-1, index).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
        else:  # v2's choice for half precision: logsumexp is unstable there
            picked.append(torch.log_softmax(chunk, dim=-1).gather(-1, index).squeeze(-1))
    return torch.cat(picked).view(labels.shape)  # split() yields one empty chunk for no rows, so never empty


def patch_engine_workers(engine_workers) -> None:
    """verl.workers.engine_workers, right after its import (a hook of stapo.verl_plugin.cpu)."""
    engine_workers.initialize_global_process_group_ray = init_gloo_process_group


def patch_fsdp_engine(transformer_impl) -> None:
    """verl's FSDP engine module, right after its import: it has imported the engine registry by then."""
    from verl.workers.engine.base import EngineRegistry

    if not getattr(transformer_impl, "_stapo_cpu_patched", False):
        transformer_impl.CPUOffloadPolicy = _unpinned_offload_policy(transformer_impl.CPUOffloadPolicy)
        transformer_impl.logprobs_from_logits = logprobs_of_labels
        transformer_impl._stapo_cpu_patched = True

    # the FSDP engines register for cuda/npu only (transformer_impl.py ~1143, ~1594)
    for model_type, engine_cls in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        registered = EngineRegistry._engines.get(model_type, {})
        if "cpu" not in registered.get("fsdp2", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine_cls)


def apply() -> None:
    """Both patches now (importing the two modules): for a process that wants them without the hooks."""
    from verl.workers import engine_workers
    from verl.workers.engine.fsdp import transformer_impl

    patch_engine_workers(engine_workers)
    patch_fsdp_engine(transformer_impl)
