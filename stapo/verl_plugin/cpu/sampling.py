"""Seeded token sampling for the HF rollout: one prompt, one KV cache, one ``torch.Generator`` per sample.

Why not HF ``generate()`` on whatever batch arrived: it samples from the process-wide RNG, so a
request's tokens depend on every draw made before it, and a batched forward pass computes each row
with kernels chosen for the batch's shape (rows, padded width), so its logits can differ in the last
bits with the company it keeps. Here a forward pass only ever holds the samples of ONE prompt (a
GRPO group, or a single request): the prompt is encoded once, its KV cache is repeated for the
group's rows, and each row is drawn from its own generator. The batch's composition is then fixed
by the group itself (same prompt, same seeds, rows in sample order, finished rows kept until all
finish), never by timing, so a sample's tokens and log-probs are a function of (weights, prompt,
sampling parameters, the group's seeds). See docs/reproducibility.md.
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
def sample_group(
    model, prompt_ids: list[int], sampling: Sampling, seeds: list[int | None], eos_ids: list[int]
) -> list[tuple[list[int], list[float] | None, str]]:
    """Generate one response per seed for the same prompt: ``[(tokens, log-probs or None, stop reason)]``.

    The prompt is encoded once (batch of one) and its KV cache repeated for the rows; the rows then
    decode in lockstep as one batch. A row that has finished keeps its slot (its further tokens are
    discarded) so the batch's shape never depends on what was sampled. The log-probs are of the
    logits divided by the temperature, without top-k/p: the quantity verl's actor recomputes (it
    scales its logits by the rollout temperature), so verl's rollout-vs-actor metrics and rollout
    correction weights compare like with like (greedy requests: temperature 1). With one seed this is
    a plain KV-cache sampling loop.
    """
    if not seeds:
        return []
    generators: list[torch.Generator | None] = []
    for seed in seeds:
        if sampling.greedy:
            generators.append(None)
            continue
        if seed is None:
            raise ValueError("sampling with temperature > 0 needs a seed (the server draws one when none is sent)")
        generators.append(torch.Generator(device="cpu").manual_seed(int(seed)))
    rows = len(seeds)
    log_prob_temperature = 1.0 if sampling.greedy else sampling.temperature
    out = model(input_ids=torch.tensor([prompt_ids], dtype=torch.long), use_cache=True)
    past = out.past_key_values
    logits = out.logits[:, -1].float().expand(rows, -1)  # every row starts from the same prompt
    if rows > 1:
        past.batch_repeat_interleave(rows)
    tokens: list[list[int]] = [[] for _ in range(rows)]
    log_probs: list[list[float]] = [[] for _ in range(rows)]
    stops = ["length"] * rows
    for step in range(sampling.max_tokens):
        drawn = []
        for row in range(rows):
            token = next_token(logits[row], sampling, generators[row])
            drawn.append(token)
            if stops[row] == "completed":
                continue  # finished earlier: the slot stays, the draw is discarded
            tokens[row].append(token)
            if sampling.logprobs:
                log_probs[row].append(float(torch.log_softmax(logits[row] / log_prob_temperature, dim=-1)[token]))
            if token in eos_ids:
                stops[row] = "completed"
        if all(stop == "completed" for stop in stops) or step + 1 == sampling.max_tokens:
            break
        out = model(input_ids=torch.tensor(drawn, dtype=torch.long)[:, None], past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1].float()
    return [(tokens[row], log_probs[row] if sampling.logprobs else None, stops[row]) for row in range(rows)]

