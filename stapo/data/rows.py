"""verl's RL row and the one parquet writer every data module of this project uses.

A row holds what verl's RL dataset and reward manager read: ``data_source``, ``prompt`` (chat
messages), ``ability``, ``reward_model.ground_truth`` and ``extra_info``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Callable


def rl_row(data_source: str, prompt: str, ground_truth: str, extra_info: dict[str, Any]) -> dict[str, Any]:
    """One single-turn math row: the user's ``prompt``, the answer the rule reward compares with."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def write_atomically(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` beside ``path``, then rename ``tmp`` over it: readers never see half a file.

    The temporary name is the writer's own (process id and a random part): the runs of a sweep start side by
    side and each prepares the same shared data folder; with one shared temporary name the second rename found
    the file already moved (a sweep's first run failed so on a fresh machine). Each writer renames a whole file
    of the same content over the name; the last one wins."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_rows(path: Path, rows: list[dict]) -> Path:
    """One parquet file of verl's rows, written atomically (``write_atomically``)."""
    import pandas as pd

    return write_atomically(path, pd.DataFrame(rows).to_parquet)
