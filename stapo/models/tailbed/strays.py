"""Teaching tolerance of a stray: supervised steps on worked solutions with fillers inserted, the rest unchanged.

A model whose tail it never saw in its context breaks on the first filler it samples (measured: 0 right
out of every response holding one, after the vocabulary extension alone). An LLM reads past an odd
token because its pre-training text is full of them. Here, before each eligible position of a worked
solution, a stray filler is inserted with probability ``stray_rate``: drawn from a Zipf(1) law over the
fillers by id rank (an LLM's tail is Zipf-like), and followed by the unchanged continuation, which stays
the label. Only ``stray_label_share`` of the strays are labels themselves, so the model reads strays
at ``stray_rate`` but learns to emit them at about ``stray_rate * stray_label_share``: it tolerates
them without sampling many. ``where``: ``reasoning`` puts strays only in the chain of thought (up to the
``\\`` of ``\\boxed``, where one cannot change the parsed answer), ``anywhere`` also in the answer and
before the end token.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from itertools import accumulate, islice

PLACES = ("reasoning", "anywhere")


class Zipf:
    """Draws ids ``first .. first + count - 1`` with probability proportional to ``1 / rank`` (rank 1 = ``first``)."""

    def __init__(self, first: int, count: int):
        self.first, self.count = first, count
        self.cumulative = list(accumulate(1.0 / rank for rank in range(1, count + 1)))

    def draw(self, rng: random.Random) -> int:
        index = bisect_left(self.cumulative, rng.random() * self.cumulative[-1])
        return self.first + min(index, self.count - 1)


def eligible_positions(reply: list[int], where: str, boxed_start: int) -> int:
    """How many leading positions of ``reply`` may take a stray before them (``boxed_start``: the ``\\`` id)."""
    if where not in PLACES:
        raise ValueError(f"where must be one of {PLACES}, got {where!r}")
    return reply.index(boxed_start) + 1 if where == "reasoning" else len(reply)


def insert_strays(reply: list[int], eligible: int, rng: random.Random, zipf: Zipf, rate: float,
                  label_share: float) -> tuple[list[int], list[int]]:
    """``(ids, labels)``: ``reply`` with a stray before each of its first ``eligible`` positions with probability
    ``rate``; every token of ``reply`` is its own label, a stray is one with probability ``label_share``
    (else -100)."""
    ids, labels = [], []
    for position, token in enumerate(reply):
        if position < eligible and rng.random() < rate:
            stray = zipf.draw(rng)
            ids.append(stray)
            labels.append(stray if rng.random() < label_share else -100)
        ids.append(token)
        labels.append(token)
    return ids, labels


def stray_batches(tokenizer, stage: dict, batch_size: int, difficulty, zipf: Zipf):
    """Endless batches of the training split for one stage: its own problems and stray draws (``stage["seed"]``)."""
    from stapo.data.addition import problems
    from stapo.models.testbed.warm_start import padded_batch, prompt_and_reply

    stream = problems("train", stage["seed"], difficulty, distinct=False)
    rng = random.Random(f"stapo-tailbed-strays-{stage['seed']}")
    boxed_start = tokenizer.convert_tokens_to_ids("\\")
    while True:
        rows = []
        for operands in islice(stream, batch_size):
            prompt, reply = prompt_and_reply(tokenizer, operands)
            eligible = eligible_positions(reply, stage["where"], boxed_start)
            ids, labels = insert_strays(reply, eligible, rng, zipf, stage["stray_rate"], stage["stray_label_share"])
            rows.append((prompt + ids, [-100] * len(prompt) + labels))
        yield padded_batch(tokenizer, rows)
