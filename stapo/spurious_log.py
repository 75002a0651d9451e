"""Human-readable records of silenced tokens (the paper's word clouds, as data).

Pure: takes token ids, the mask and per-token statistics, and a ``decode`` callable, so it works
with any tokenizer and with tensors from the driver or from an analysis pass.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import torch


def spurious_records(
    response_ids: torch.Tensor,
    spurious: torch.Tensor,
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    decode: Callable[[list[int]], str],
    context: int = 6,
    step: int | None = None,
    lengths: list[int] | None = None,
) -> list[dict]:
    """One record per silenced token: the token, a few tokens either side, its p and H.

    ``lengths`` (valid tokens per row) keeps the padding after a response out of its context.
    """
    records = []
    for row, col in spurious.nonzero().tolist():
        ids = response_ids[row].tolist()[: None if lengths is None else lengths[row]]
        records.append(
            {
                "step": step,
                "sample": row,
                "position": col,
                "token": decode([ids[col]]),
                "before": decode(ids[max(0, col - context) : col]),
                "after": decode(ids[col + 1 : col + 1 + context]),
                "prob": float(torch.exp(log_prob[row, col])),
                "entropy": float(entropy[row, col]),
            }
        )
    return records


def most_frequent(records: Iterable[dict], top: int = 20) -> list[tuple[str, int]]:
    """The most often silenced token strings (whitespace-stripped, so ' 7' and '7' count together)."""
    return Counter(record["token"].strip() or record["token"] for record in records).most_common(top)


def append_jsonl(path: Path, records: Iterable[dict]) -> None:
    """Append and flush, so a killed run keeps what it logged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")  # ASCII: no raw U+2028 to split lines
        handle.flush()
