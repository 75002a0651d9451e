"""verl's RL row and the one parquet writer every data module of this project uses.

A row holds what verl's RL dataset and reward manager read: ``data_source``, ``prompt`` (chat
messages), ``ability``, ``reward_model.ground_truth`` and ``extra_info``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stapo.files import write_atomically


def rl_row(
    data_source: str, prompt: str, ground_truth: str, extra_info: dict[str, Any], system: str | None = None
) -> dict[str, Any]:
    """One single-turn row: the user's ``prompt`` (after a ``system`` message when given), the answer the rule
    reward compares with."""
    messages = [{"role": "system", "content": system}] if system else []
    return {
        "data_source": data_source,
        "prompt": [*messages, {"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def to_parquet(rows: list[dict], path: Path) -> None:
    """verl's rows as one parquet file at ``path``, written in place (callers write to a temporary name)."""
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path)


def write_rows(path: Path, rows: list[dict]) -> Path:
    """One parquet file of verl's rows, written whole (``stapo.files.write_atomically``: readers never see half a
    file, and writers side by side do not collide)."""
    return write_atomically(path, lambda tmp: to_parquet(rows, tmp))
