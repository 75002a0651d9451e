"""A small synthetic math task in verl's parquet format, generated deterministically.

Rows are verl's RL rows (``stapo.data.rows``); answers are integers the model must put in
``\\boxed{}``.
"""

from __future__ import annotations

import random
from pathlib import Path

from stapo.data.rows import rl_row, write_rows

DATA_SOURCE = "stapo/synthetic_arithmetic"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def make_problem(rng: random.Random, max_operand: int) -> tuple[str, str]:
    """One question and its answer: additions, subtractions and small multiplications."""
    a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
    kind = rng.choice(("+", "-", "*"))
    if kind == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"What is {a} times {b}?", str(a * b)
    if kind == "-":
        a, b = max(a, b), min(a, b)
        return f"What is {a} minus {b}?", str(a - b)
    return f"What is {a} plus {b}?", str(a + b)


def make_rows(count: int, split: str, seed: int, max_operand: int = 50) -> list[dict]:
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(count):
        question, answer = make_problem(rng, max_operand)
        extra = {"split": split, "index": index, "question": question}
        rows.append(rl_row(DATA_SOURCE, f"{question} {INSTRUCTION}", answer, extra))
    return rows


def corpus_text(rows: list[dict]) -> list[str]:
    """Text a tokenizer for this task should cover: prompts and plausible answers."""
    texts = [row["prompt"][0]["content"] for row in rows]
    texts += [f"The answer is \\boxed{{{row['reward_model']['ground_truth']}}}." for row in rows]
    return texts


def write_parquet(out_dir: str | Path, train: int = 256, val: int = 64, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` (disjoint seeds per split) and return their paths."""
    out_dir = Path(out_dir)
    return (
        write_rows(out_dir / "train.parquet", make_rows(train, "train", seed)),
        write_rows(out_dir / "val.parquet", make_rows(val, "val", seed)),
    )
