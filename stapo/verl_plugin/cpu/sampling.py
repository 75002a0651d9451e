"""Seeded token sampling for the HF rollout: one KV cache per batch, one ``torch.Generator`` per sample.

Why not HF ``generate()`` on whatever batch arrived: it samples from the process-wide RNG, so a
request's tokens depend on every draw made before it, and a batched forward pass computes each row
with kernels chosen for the batch's shape (rows, padded width), so its logits can differ in the last
bits with the company it keeps. Here a forward pass holds a batch whose composition the caller fixes
independently of timing: the samples of ONE prompt (a GRPO group, or a single request), or every
request of a submission the trainer announced (a step's groups, a validation batch). Each distinct
prompt is encoded once, its KV cache selected for its rows, and each row is drawn from its own
generator. Rows stay in the batch until all finish, so a sample's tokens and log-probs are a function
of (weights, the batch's prompts and seeds, sampling parameters), never of arrival order or timing.
See docs/reproducibility.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

# the TokenOutput extra field (then verl's ``extra_fields`` of the row) holding a response's token stats
TOKEN_STATS_FIELD = "stapo_token_stats"


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


def sampling_probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Each row's distribution to draw from, ``(rows, vocab)``: temperature, then top-k/top-p (row by row: their
    cut-offs are per row), then one softmax over all rows (row-wise, so each row's probabilities are its own)."""
    if sampling.top_k or sampling.top_p < 1.0:
        scores = torch.stack([filter_logits(row, sampling) for row in logits])
    else:
        scores = logits / sampling.temperature
    return torch.softmax(scores, dim=-1)


def draw_tokens(logits: torch.Tensor, sampling: Sampling, generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of raw logits ``(rows, vocab)``, row ``r`` drawn from ``generators[r]``.

    The draw is the exponential race: with ``E_v ~ Exp(1)`` independent, ``argmax_v p_v / E_v`` is ``v`` with
    probability ``p_v``. It is what ``torch.multinomial(p, 1)`` computes on the CPU (torch 2.13: one
    ``exponential_`` over the row from its generator, a division, an argmax), so the tokens, and each generator's
    state after the draw, are a row-by-row ``multinomial``'s bit for bit (tests/unit/test_seeded_rollout.py), while
    only the noise, which needs the row's own generator, is drawn row by row: the division and the argmax run
    over all rows at once (the rows' distributions: :func:`sampling_probabilities`). At the testbed's vocabulary
    of 27 this draws a step's 512 rows in about a fifth of the time of a ``multinomial`` call a row; at the
    tailbed's 4,096 the noise itself (one exponential per row and vocabulary entry) takes as long either way
    (BENCHMARKS.md, section 8)."""
    if sampling.greedy:
        return logits.argmax(dim=-1).tolist()
    probs = sampling_probabilities(logits, sampling)
    race = torch.empty_like(probs)
    for row, generator in enumerate(generators):
        race[row].exponential_(1, generator=generator)
    return (probs / race).argmax(dim=-1).tolist()


def sample_group(
    model, prompt_ids: list[int], sampling: Sampling, seeds: list[int | None], eos_ids: list[int]
) -> list[tuple[list[int], list[float] | None, str, dict | None]]:
    """Generate one response per seed for the same prompt: ``[(tokens, log-probs or None, stop reason, token
    stats or None)]``.

    :func:`sample_batch` with every row on one prompt: the prompt is encoded once (batch of one) and its
    KV cache repeated for the rows. With one seed this is a plain KV-cache sampling loop.
    """
    return sample_batch(model, [prompt_ids] * len(seeds), sampling, seeds, eos_ids)


def _generators(sampling: Sampling, seeds: list[int | None]) -> list[torch.Generator | None]:
    generators: list[torch.Generator | None] = []
    for seed in seeds:
        if sampling.greedy:
            generators.append(None)
            continue
        if seed is None:
            raise ValueError("sampling with temperature > 0 needs a seed (the server draws one when none is sent)")
        generators.append(torch.Generator(device="cpu").manual_seed(int(seed)))
    return generators


def token_stats(log_probs: torch.Tensor, unused_from: int | None) -> tuple[list[float], list[float] | None]:
    """Of each row's distribution (log-probs over the vocabulary, ``(rows, vocab)``): the collision probability
    ``sum_v pi(v)^2``, which gives the exact logit-gradient norm ``sqrt(1 - 2p + sum_v pi(v)^2)`` of the sampled
    token (docs/algorithm.md section 5), and the mass on ids ``>= unused_from`` (tokens the task never needs;
    None without them). The actor's pass returns only log-probs and entropy; the rollout has the whole row."""
    probs = log_probs.exp()
    unused = None if unused_from is None else probs[:, unused_from:].sum(dim=-1).tolist()
    return probs.square().sum(dim=-1).tolist(), unused


class PreallocatedLayer(DynamicLayer):
    """A KV-cache layer whose keys and values live in buffers sized for the whole decode.

    HF's :class:`DynamicLayer` concatenates each new token onto the cache, copying every row's keys and values
    at every token (a third of a 512-row validation's decode on the CPU). Here a token's keys are written in
    place and attention reads a view of the filled part: the same values, so the same logits, bit for bit."""

    def __init__(self, layer: DynamicLayer, capacity: int):
        super().__init__()
        self.dtype, self.device, self.is_initialized = layer.dtype, layer.device, True
        batch, heads, filled, dim = layer.keys.shape
        self._key_buffer = layer.keys.new_empty(batch, heads, capacity, dim)
        self._value_buffer = layer.values.new_empty(batch, heads, capacity, dim)
        self._filled = 0
        self.update(layer.keys, layer.values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self._filled + key_states.shape[-2]
        self._key_buffer[:, :, self._filled : end] = key_states
        self._value_buffer[:, :, self._filled : end] = value_states
        self._filled = end
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values


def preallocate(cache, capacity: int) -> None:
    """Swap ``cache``'s growing layers for :class:`PreallocatedLayer` s of ``capacity`` positions (others, e.g.
    sliding-window layers, keep HF's own)."""
    cache.layers = [PreallocatedLayer(layer, capacity) if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]


@torch.no_grad()
def sample_batch(
    model, prompts: list[list[int]], sampling: Sampling, seeds: list[int | None], eos_ids: list[int],
    unused_from: int | None = None, on_row_done: Callable[[int, tuple], None] | None = None,
) -> list[tuple[list[int], list[float] | None, str, dict | None]]:
    """One response per row (``prompts[i]``, ``seeds[i]``), all rows decoded as one batch.

    Each distinct prompt is encoded once; prompts of different lengths are left-padded (masked, with the
    positions counted from each prompt's first token) and their KV caches selected for the rows, which
    then decode in lockstep. A row that has finished keeps its slot (its forward passes go on, unread) so
    the batch's shape never depends on what was sampled, and the distinct prompts are encoded in sorted
    order, so what a row computes depends on the batch's rows, never on their order. The log-probs are of
    the logits divided by the temperature, without top-k/p: the quantity verl's actor recomputes (it
    scales its logits by the rollout temperature), so verl's rollout-vs-actor metrics and rollout
    correction weights compare like with like (greedy requests: temperature 1). With log-probs, each row
    also gets its tokens' :func:`token_stats` of that same distribution (``collision``, and ``unused_mass``
    and ``unused_sampled``, the count of drawn ids ``>= unused_from``, when the model names its unused ids).

    Only the rows still decoding are drawn and scored at a step (each row's draw, softmax and statistics are its
    own, so the others' values are the same bit for bit); a finished row's slot is fed its last token. A row that
    ends with an end-of-sequence token is final at that step: ``on_row_done(row, result)``, when given, receives
    it then (the server answers that request while the batch decodes on), and the returned list holds the same.
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts for {len(seeds)} seeds: one of each per row")
    if not seeds:
        return []
    generators = _generators(sampling, seeds)
    rows = len(seeds)
    log_prob_temperature = 1.0 if sampling.greedy else sampling.temperature
    distinct = sorted({tuple(prompt) for prompt in prompts})
    position = {prompt: i for i, prompt in enumerate(distinct)}
    row_prompt = torch.tensor([position[tuple(prompt)] for prompt in prompts])
    lengths = torch.tensor([len(prompt) for prompt in distinct])
    width = int(lengths.max())
    padded = bool((lengths != width).any())
    if padded:  # left padding: every prompt's last token in the last column
        keep = torch.arange(width)[None, :] >= (width - lengths)[:, None]
        ids = torch.zeros(len(distinct), width, dtype=torch.long)
        ids[keep] = torch.tensor([token for prompt in distinct for token in prompt], dtype=torch.long)
        mask = keep.long()
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True)
        mask = mask[row_prompt]
    else:
        out = model(input_ids=torch.tensor(distinct, dtype=torch.long), use_cache=True)
    past = out.past_key_values
    logits = out.logits[:, -1].float()[row_prompt]
    if rows > 1 or len(distinct) > 1:
        past.batch_select_indices(row_prompt)
    preallocate(past, width + sampling.max_tokens)
    positions = lengths[row_prompt]
    tokens: list[list[int]] = [[] for _ in range(rows)]
    log_probs: list[list[float]] = [[] for _ in range(rows)]
    stats: list[dict] = [{"collision": [], **({"unused_mass": [], "unused_sampled": 0} if unused_from else {})}
                         for _ in range(rows)]
    stops = ["length"] * rows

    def result(row: int) -> tuple:
        if not sampling.logprobs:
            return tokens[row], None, stops[row], None
        return tokens[row], log_probs[row], stops[row], stats[row]

    active = list(range(rows))  # rows still decoding, in row order
    step_ids = torch.zeros(rows, 1, dtype=torch.long)  # each row's last token: a finished row's slot is fed it
    for step in range(sampling.max_tokens):
        subset = logits if len(active) == rows else logits[torch.tensor(active)]
        drawn = draw_tokens(subset, sampling, [generators[row] for row in active])
        if sampling.logprobs:
            step_log_probs = torch.log_softmax(subset / log_prob_temperature, dim=-1)
            chosen = step_log_probs.gather(1, torch.tensor(drawn)[:, None])[:, 0].tolist()
            collision, unused = token_stats(step_log_probs, unused_from)
        step_ids[active, 0] = torch.tensor(drawn, dtype=torch.long)
        decoding = []
        for k, (row, token) in enumerate(zip(active, drawn)):
            tokens[row].append(token)
            if sampling.logprobs:
                log_probs[row].append(chosen[k])
                stats[row]["collision"].append(collision[k])
                if unused is not None:
                    stats[row]["unused_mass"].append(unused[k])
                    stats[row]["unused_sampled"] += int(token >= unused_from)
            if token in eos_ids:
                stops[row] = "completed"
                if on_row_done is not None:
                    on_row_done(row, result(row))
            else:
                decoding.append(row)
        active = decoding
        if not active or step + 1 == sampling.max_tokens:
            break
        if padded:
            mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], dim=-1)
            out = model(input_ids=step_ids, attention_mask=mask, position_ids=(positions + step)[:, None],
                        past_key_values=past, use_cache=True)
        else:
            out = model(input_ids=step_ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1].float()
    return [result(row) for row in range(rows)]
