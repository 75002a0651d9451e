"""The demo's task: arithmetic problems, generated deterministically, with a held-out split.

Additions and multiplications, half phrased as short word problems, half as bare questions, at
three levels: ``easy`` (operands up to 30, times tables up to 12), ``medium`` (two-digit)
and ``hard`` (two- and three-digit). SmolLM2-135M-Instruct sampled at temperature 0.7 gets about a
quarter of ``easy`` right and almost none of ``hard``: the demo trains on ``easy`` so that groups
have mixed outcomes and there is something to learn in minutes.

The prompt asks for the answer in ``\\boxed{}`` without the paper's "reason step by step", which
makes the 135M model ramble past any short length limit. The split is decided by a hash of the
problem itself (operation and operands), so a held-out problem never appears in training, whatever
the seed or the row counts. Rows are in verl's RL parquet format (``stapo.data.rows``).
"""

from __future__ import annotations

import functools
import hashlib
import random
from pathlib import Path

from stapo.data.rows import rl_row, write_rows

DATA_SOURCE = "stapo/arithmetic"
HELD_OUT_PERCENT = 20  # share of the problem space reserved for the held-out split
INSTRUCTION = "Put your final answer within \\boxed{}."
# level: (addend range, multiplicand range, multiplier range)
LEVELS = {
    "easy": ((1, 30), (2, 12), (2, 12)),
    "medium": ((10, 99), (10, 99), (2, 9)),
    "hard": ((10, 999), (10, 999), (2, 12)),
}

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo")
_ITEMS = ("apples", "stamps", "marbles", "books", "coins", "shells", "pencils", "cards")
_ADD = (
    "{name} has {a} {items} and gets {b} more. How many {items} does {name} have now?",
    "A shop sold {a} {items} on Monday and {b} {items} on Tuesday. How many {items} did it sell in total?",
    "There are {a} {items} in one box and {b} {items} in another. How many {items} are there altogether?",
)
_BARE = {"+": "What is {a} + {b}?", "*": "What is {a} times {b}?"}
_MUL = (
    "{name} buys {a} bags with {b} {items} in each bag. How many {items} does {name} buy?",
    "A library has {a} shelves and each shelf holds {b} {items}. How many {items} are there?",
    "{name} packs {b} {items} into each of {a} boxes. How many {items} are packed?",
)


def _operands(rng: random.Random, op: str, level: str) -> tuple[int, int]:
    addends, multiplicands, multipliers = LEVELS[level]
    if op == "+":
        return rng.randint(*addends), rng.randint(*addends)
    return rng.randint(*multiplicands), rng.randint(*multipliers)


def canonical(op: str, a: int, b: int) -> tuple[str, int, int]:
    """One key per problem: both operations commute, so 3 x 4 and 4 x 3 are the same problem."""
    return op, min(a, b), max(a, b)


def split_of(op: str, a: int, b: int) -> str:
    """``train`` or ``heldout``: a stable function of the problem, independent of any seed."""
    digest = hashlib.sha256("{}|{}|{}".format(*canonical(op, a, b)).encode()).digest()
    return "heldout" if digest[0] * 100 // 256 < HELD_OUT_PERCENT else "train"


def make_problem(rng: random.Random, level: str = "easy") -> tuple[str, int, int, str, str]:
    """(op, a, b, question, answer)."""
    op = rng.choice("+*")
    a, b = _operands(rng, op, level)
    templates = _ADD if op == "+" else _MUL
    template = _BARE[op] if rng.random() < 0.5 else rng.choice(templates)
    question = template.format(name=rng.choice(_NAMES), items=rng.choice(_ITEMS), a=a, b=b)
    return op, a, b, question, str(a + b if op == "+" else a * b)


def make_rows(count: int, split: str, seed: int = 0, level: str = "easy") -> list[dict]:
    """``count`` distinct problems of ``split`` ("train" or "heldout") at ``level``."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    space = problem_space(level, split)
    if count > space:
        raise ValueError(f"{count} {split} problems asked at level {level!r}, which has only {space}")
    rng = random.Random(f"stapo-arithmetic-{seed}-{split}-{level}")
    rows, seen = [], set()
    while len(rows) < count:
        op, a, b, question, answer = make_problem(rng, level)
        key = canonical(op, a, b)
        if split_of(op, a, b) != split or key in seen:
            continue
        seen.add(key)
        extra = {"split": split, "index": len(rows), "question": question, "op": op, "level": level}
        rows.append(rl_row(DATA_SOURCE, f"{question} {INSTRUCTION}", answer, extra))
    return rows


@functools.cache
def problem_space(level: str, split: str) -> int:
    """How many distinct problems ``split`` has at ``level`` (so an impossible count fails fast)."""
    addends, multiplicands, multipliers = LEVELS[level]
    problems = {
        canonical("+", a, b) for a in range(addends[0], addends[1] + 1) for b in range(addends[0], addends[1] + 1)
    }
    problems |= {
        canonical("*", a, b)
        for a in range(multiplicands[0], multiplicands[1] + 1)
        for b in range(multipliers[0], multipliers[1] + 1)
    }
    return sum(1 for op, a, b in problems if split_of(op, a, b) == split)


def write_parquet(
    out_dir: str | Path, train: int, heldout: int, seed: int = 0, level: str = "easy"
) -> tuple[Path, Path]:
    """``train.parquet`` and ``heldout.parquet`` under ``out_dir`` (written atomically)."""
    out_dir = Path(out_dir)
    return (
        write_rows(out_dir / "train.parquet", make_rows(train, "train", seed, level)),
        write_rows(out_dir / "heldout.parquet", make_rows(heldout, "heldout", seed, level)),
    )
