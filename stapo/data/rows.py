"""verl's RL row and the one parquet writer every data module of this project uses.

A row holds what verl's RL dataset and reward manager read: ``data_source``, ``prompt`` (chat
messages), ``ability``, ``reward_model.ground_truth`` and ``extra_info``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stapo.files import write_atomically


def rl_row(data_source: str, prompt: str, ground_truth: str, extra_info: dict[str, Any]) -> dict[str, Any]:
    """One single-turn math row: the user's ``prompt``, the answer the rule reward compares with."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def write_rows(path: Path, rows: list[dict]) -> Path:
    """One parquet file of verl's rows, written whole (``stapo.files.write_atomically``: readers never see half a
    file, and writers side by side do not collide)."""
    import pandas as pd

    return write_atomically(path, pd.DataFrame(rows).to_parquet)
