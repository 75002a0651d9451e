"""The demo's task: arithmetic word problems, generated deterministically, with a held-out split.

Two- and three-digit additions and multiplications, phrased as short word problems, with the
paper's prompt suffix (answer in ``\\boxed{}``). The split is decided by a hash of the problem
itself (operation and operands), so a held-out problem never appears in training, whatever the
seed or the row counts. Rows are in verl's RL parquet format (see ``stapo.data.synthetic``).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from stapo.data.synthetic import INSTRUCTION

DATA_SOURCE = "stapo/arithmetic"
HELD_OUT_PERCENT = 20  # share of the problem space reserved for the held-out split

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo")
_ITEMS = ("apples", "stamps", "marbles", "books", "coins", "shells", "pencils", "cards")
_ADD = (
    "{name} has {a} {items} and gets {b} more. How many {items} does {name} have now?",
    "A shop sold {a} {items} on Monday and {b} {items} on Tuesday. How many {items} did it sell in total?",
    "There are {a} {items} in one box and {b} {items} in another. How many {items} are there altogether?",
)
_MUL = (
    "{name} buys {a} bags with {b} {items} in each bag. How many {items} does {name} buy?",
    "A library has {a} shelves and each shelf holds {b} {items}. How many {items} are there?",
    "{name} packs {b} {items} into each of {a} boxes. How many {items} are packed?",
)


def _operands(rng: random.Random, op: str) -> tuple[int, int]:
    if op == "+":  # two- or three-digit addends
        return rng.randint(10, 999), rng.randint(10, 999)
    # a two- or three-digit number times a one- or two-digit one: hard but not hopeless for 135M
    return rng.randint(10, 999), rng.randint(2, 12)


def split_of(op: str, a: int, b: int) -> str:
    """``train`` or ``heldout``: a stable function of the problem, independent of any seed."""
    digest = hashlib.sha256(f"{op}|{a}|{b}".encode()).digest()
    return "heldout" if digest[0] * 100 // 256 < HELD_OUT_PERCENT else "train"


def make_problem(rng: random.Random) -> tuple[str, int, int, str, str]:
    """(op, a, b, question, answer)."""
    op = rng.choice("+*")
    a, b = _operands(rng, op)
    template = rng.choice(_ADD if op == "+" else _MUL)
    question = template.format(name=rng.choice(_NAMES), items=rng.choice(_ITEMS), a=a, b=b)
    return op, a, b, question, str(a + b if op == "+" else a * b)


def make_rows(count: int, split: str, seed: int = 0) -> list[dict]:
    """``count`` distinct problems of ``split`` ("train" or "heldout")."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(f"stapo-arithmetic-{seed}-{split}")
    rows, seen = [], set()
    while len(rows) < count:
        op, a, b, question, answer = make_problem(rng)
        if split_of(op, a, b) != split or (op, a, b) in seen:
            continue
        seen.add((op, a, b))
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": len(rows), "question": question, "op": op},
            }
        )
    return rows


def write_parquet(out_dir: str | Path, train: int, heldout: int, seed: int = 0) -> tuple[Path, Path]:
    """``train.parquet`` and ``heldout.parquet`` under ``out_dir`` (written atomically)."""
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, count in (("train", train), ("heldout", heldout)):
        path = out_dir / f"{split}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        pd.DataFrame(make_rows(count, split, seed)).to_parquet(tmp)
        tmp.replace(path)
        paths.append(path)
    return paths[0], paths[1]
