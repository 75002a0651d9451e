"""The testbed's task: multi-operand addition solved column by column, with a held-out split.

A problem is a bare expression (``347+85+12``); its worked solution adds one column at a time from
the right, each column's digits then the carry in, and boxes the sum::

    7+5+2+0=14;4+8+1+1=14;3+0+0+1=4;\\boxed{444}

The chain of thought gives a small model room to reason in tokens (a wrong carry is a visible,
local slip), and the boxed answer is checked by the paper's strict reward (``stapo.reward.boxed``).
Difficulty is the number of operands and their digit counts (``Difficulty``).

The split is a hash of the problem itself (its operands as a multiset, since addition commutes), so
a held-out problem never appears in training whatever the seed or the row counts, and every stream
of problems is a deterministic function of (split, seed, difficulty). Rows are verl's RL parquet
rows (``stapo.data.rows``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from stapo.data.rows import rl_row, write_rows

DATA_SOURCE = "stapo/addition"
HELD_OUT_PERCENT = 10  # share of the problem space reserved for the held-out split
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Difficulty:
    """``operands`` numbers, each with ``min_digits`` to ``max_digits`` digits (uniform)."""

    operands: int = 3
    min_digits: int = 2
    max_digits: int = 3

    def __post_init__(self) -> None:
        if self.operands < 2 or not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"need operands >= 2 and 1 <= min_digits <= max_digits, got {self}")


def worked_solution(operands: tuple[int, ...]) -> str:
    """The column-by-column chain of thought ending in the boxed sum."""
    digits = [str(number)[::-1] for number in operands]
    carry, steps = 0, []
    for column in range(max(len(d) for d in digits)):
        column_digits = [int(d[column]) if column < len(d) else 0 for d in digits]
        total = sum(column_digits) + carry
        steps.append("+".join(map(str, column_digits)) + f"+{carry}={total}")
        carry = total // 10
    return ";".join(steps) + f";\\boxed{{{sum(operands)}}}"


def question(operands: tuple[int, ...]) -> str:
    return "+".join(map(str, operands))


def split_of(operands: tuple[int, ...]) -> str:
    """``train`` or ``heldout``: a stable function of the problem, independent of any seed."""
    key = "+".join(map(str, sorted(operands)))
    return "heldout" if hashlib.sha256(key.encode()).digest()[0] * 100 // 256 < HELD_OUT_PERCENT else "train"


def _number(rng: random.Random, difficulty: Difficulty) -> int:
    digits = rng.randint(difficulty.min_digits, difficulty.max_digits)
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


def problems(split: str, seed: int = 0, difficulty: Difficulty = Difficulty(), distinct: bool = True) -> Iterator:
    """Endless stream of ``split``'s problems (operand tuples); a longer read extends a shorter one."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"stapo-addition-{seed}-{split}-{difficulty.operands}-{difficulty.min_digits}-"
                        f"{difficulty.max_digits}")
    seen: set[tuple[int, ...]] = set()
    while True:
        operands = tuple(_number(rng, difficulty) for _ in range(difficulty.operands))
        if split_of(operands) != split:
            continue
        if distinct:
            key = tuple(sorted(operands))
            if key in seen:
                continue
            seen.add(key)
        yield operands


def make_rows(count: int, split: str, seed: int = 0, difficulty: Difficulty = Difficulty()) -> list[dict]:
    """``count`` distinct problems of ``split`` as verl RL rows (the user turn is the bare expression)."""
    rows = []
    for index, operands in enumerate(islice(problems(split, seed, difficulty), count)):
        extra = {"split": split, "index": index, "operands": list(operands), "solution": worked_solution(operands)}
        rows.append(rl_row(DATA_SOURCE, question(operands), str(sum(operands)), extra))
    return rows


def write_parquet(
    out_dir: str | Path, train: int, heldout: int, seed: int = 0, difficulty: Difficulty = Difficulty()
) -> tuple[Path, Path]:
    """``train.parquet`` and ``heldout.parquet`` under ``out_dir`` (written atomically)."""
    out_dir = Path(out_dir)
    return (
        write_rows(out_dir / "train.parquet", make_rows(train, "train", seed, difficulty)),
        write_rows(out_dir / "heldout.parquet", make_rows(heldout, "heldout", seed, difficulty)),
    )
