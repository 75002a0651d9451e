"""Entropy in the update forward: what ``source: current`` costs over ``source: old``.

``source: old`` reads the entropy the old-log-prob pass computes anyway (verl's ``compute_log_prob``
always computes it); the update forward only needs the log-probs. ``source: current`` sets
``calculate_entropy=true`` for the update, and verl's FSDP engine then also runs
``entropy_from_logits`` (or its chunked variant) on the full-vocabulary logits, keeps its graph, and
backpropagates through it (``ppo_loss`` subtracts ``entropy_coeff * entropy``, with coefficient 0
in STAPO's recipe, so the gradient is zero but still computed).

All variants: forward + backward from a ``(tokens, 151936)`` logits leaf, fp32, to a loss over the
log-probs. Interleaved; medians. Variants:

- ``logp``: ``verl.utils.torch_functional.logprobs_from_logits`` only (``source: old``).
- ``logp+H``: + ``entropy_from_logits`` with its graph, ``- 0 * mean(H)`` in the loss (verl default).
- ``logp+H chunked``: + ``entropy_from_logits_with_chunking`` (``entropy_from_logits_with_chunking:
  true``), chunk size ``chunk`` (verl's default is 2048 rows).
- ``logp+H ckpt``: + ``torch.utils.checkpoint`` around ``entropy_from_logits``
  (``entropy_checkpointing: true``): the softmax is recomputed in backward instead of kept.
- ``logp+H no-grad``: entropy under ``torch.no_grad`` (what STAPO's detection needs: it detaches the
  entropy). Not a verl option: shown as the lower bound of what the current-source entropy must cost.
- ``logp+H detached``: what ``STAPOLossFn`` does with ``entropy_coeff == 0``: verl's engine computes
  the entropy with its graph, the wrapper replaces it in the model-output dict by a detached copy, so
  the softmax behind it is released before the backward pass.

verl compiles the entropy function with ``torch.compile`` by default on GPU (``use_torch_compile``);
these eager figures are what the CPU back-end runs.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from verl.utils.torch_functional import (
    entropy_from_logits,
    entropy_from_logits_with_chunking,
    logprobs_from_logits,
)

from benchmarks.common import fmt_bytes, fmt_num, fmt_peak, interleaved, md_row, measure_memory

VOCAB = 151936
VARIANTS = ("logp", "logp+H", "logp+H chunked", "logp+H ckpt", "logp+H no-grad", "logp+H detached")


def _entropy(variant: str, logits: torch.Tensor, chunk: int):
    if variant == "logp+H":
        return entropy_from_logits(logits)
    if variant == "logp+H detached":
        model_output = {"entropy": entropy_from_logits(logits)}  # as verl's engine hands it over
        model_output["entropy"] = model_output["entropy"].detach()  # stapo.verl_plugin.training.losses.STAPOLossFn
        return model_output["entropy"]
    if variant == "logp+H chunked":
        return entropy_from_logits_with_chunking(logits, chunk_size=chunk)
    if variant == "logp+H ckpt":
        return torch.utils.checkpoint.checkpoint(entropy_from_logits, logits, use_reentrant=False)
    if variant == "logp+H no-grad":
        with torch.no_grad():
            return entropy_from_logits(logits)
    return None


def _prepare(variant: str, tokens: int, vocab: int, chunk: int, device: torch.device):
    def prepare():
        g = torch.Generator(device=device).manual_seed(0)
        logits = (2.0 * torch.randn(tokens, vocab, generator=g, device=device)).requires_grad_(True)
        labels = torch.randint(0, vocab, (tokens,), generator=g, device=device)
        advantages = torch.randn(tokens, generator=g, device=device)

        def run():
            log_prob = logprobs_from_logits(logits, labels, inplace_backward=variant == "logp")
            loss = -(advantages * log_prob).mean()
            entropy = _entropy(variant, logits, chunk)
            if entropy is not None and entropy.requires_grad:
                loss = loss - 0.0 * entropy.mean()  # verl: policy_loss -= entropy_coeff * entropy_loss
            loss.backward()

        return run

    return prepare


def run(
    tokens: int = 1024,
    vocab: int = VOCAB,
    chunk: int = 256,
    repeats: int = 5,
    device: torch.device | str = "cpu",
    memory: bool = True,
) -> list[dict]:
    device = torch.device(device)
    prepared = {v: _prepare(v, tokens, vocab, chunk, device) for v in VARIANTS}
    times = interleaved(prepared, repeats, device)
    mem = {v: measure_memory(prepared[v], device) for v in VARIANTS} if memory else {}
    base = times["logp"].median
    rows = []
    for variant in VARIANTS:
        samples = times[variant]
        row = {
            "bench": "entropy",
            "variant": variant,
            "tokens": tokens,
            "vocab": vocab,
            "chunk": chunk,
            "median_ms": 1000 * samples.median,
            "ms_per_1k_tokens": 1000 * samples.median * 1000 / tokens,
            "spread": samples.spread,
            "ratio_vs_logp": samples.median / base,
        }
        if variant in mem:
            row["peak_tensor_bytes"] = mem[variant].peak_tensor_bytes
            row["cuda_peak_bytes"] = mem[variant].cuda_peak_bytes
            row["logits_bytes"] = tokens * vocab * 4
        rows.append(row)
    if mem:
        for row in rows:
            row["mem_ratio_vs_logp"] = row["peak_tensor_bytes"] / mem["logp"].peak_tensor_bytes
    return rows


# ---------------------------------------------------------------- its section of BENCHMARKS.md

NAME = "entropy"
TITLE = "3. Entropy in the update forward (`source: current`) at vocabulary 151,936"
SIZES = {"quick": dict(tokens=64, chunk=16, repeats=2), "full": dict(tokens=256, chunk=64, repeats=5)}


def measure(device, **size) -> list[dict]:
    return run(device=device, **size)


def render(rows: list[dict]) -> str:
    first = rows[0]
    lines = [
        f"{first['tokens']:,} tokens x vocabulary {first['vocab']:,}, "
        f"fp32 logits ({fmt_bytes(first.get('logits_bytes'))}), chunk size {first['chunk']} for the chunked variant.",
        "",
        "| variant | median ms | ms per 1k tokens | spread | ratio vs logp | peak tensor memory | memory vs logp |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            md_row(
                r["variant"],
                fmt_num(r["median_ms"]),
                fmt_num(r["ms_per_1k_tokens"]),
                fmt_num(r["spread"]),
                fmt_num(r["ratio_vs_logp"], 3),
                fmt_peak(r),
                fmt_num(r.get("mem_ratio_vs_logp"), 3),
            )
        )
    return "\n".join(lines)
