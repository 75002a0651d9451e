"""Seeded token sampling for the HF rollout: one request, one ``torch.Generator``, one KV cache.

Why not HF ``generate()`` on a batch: it samples from the process-wide RNG, so a request's tokens
depend on every draw made before it, and a batched forward pass computes each row with kernels
chosen for the batch's shape (rows, padded width), so its logits can differ in the last bits with
the company it keeps. Here each request is computed on its own (batch of one, no padding) and
sampled from its own generator: its tokens and log-probs are a function of (weights, prompt,
sampling parameters, seed) only. See docs/reproducibility.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters verl's agent loop sends, normalised (vLLM's conventions)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k (verl sends -1 for that)
    max_tokens: int = 16
    logprobs: bool = False

    def __post_init__(self):
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"rollout top_p={self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"rollout top_k={self.top_k}: must be -1 (off) or a positive integer")
        if self.max_tokens < 1:
            raise ValueError(f"rollout max_tokens={self.max_tokens}: must be at least 1")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def filter_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), in the order and with the ties of HF's warpers.

    ``logits`` is one row (vocab,). Removed tokens get -inf; at least one token always stays.
    """
    scores = logits / sampling.temperature
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - sampling.top_p)
        remove[-1] = False  # the most likely token stays
        scores = scores.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    return scores


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """One token from one row of raw logits: argmax when greedy, else a draw from ``generator``."""
    if sampling.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(filter_logits(logits, sampling), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def sample_request(
    model, prompt_ids: list[int], sampling: Sampling, seed: int | None, eos_ids: list[int]
) -> tuple[list[int], list[float] | None, str]:
    """Generate one response with a KV cache; returns (tokens, raw-logit log-probs or None, stop reason).

    The log-probs are of the unfiltered logits (temperature 1, no top-k/p): the quantity verl's actor
    recomputes, so rollout and actor log-probs can be compared exactly.
    """
    generator = None
    if not sampling.greedy:
        if seed is None:
            raise ValueError("sampling with temperature > 0 needs a seed (the server draws one when none is sent)")
        generator = torch.Generator(device="cpu")
        generator.manual_seed(int(seed))
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    past = None
    tokens: list[int] = []
    log_probs: list[float] = []
    stop = "length"
    for _ in range(sampling.max_tokens):
        out = model(input_ids=input_ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        token = next_token(logits, sampling, generator)
        tokens.append(token)
        if sampling.logprobs:
            log_probs.append(float(torch.log_softmax(logits, dim=-1)[token]))
        if token in eos_ids:
            stop = "completed"
            break
        input_ids = torch.tensor([[token]], dtype=torch.long)
    return tokens, (log_probs if sampling.logprobs else None), stop
