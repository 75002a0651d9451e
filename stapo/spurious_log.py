"""The silenced-token log: its record format, the file, its summary (the selection of a capped step is
``stapo.algorithm.token_sample.spread_positions``).

One record per silenced token (the paper's word clouds, as data): the token, a few tokens of
context either side, its probability and entropy; a custom weight rule's down-weighted tokens (weight below 1)
go to their own file in the same format, with the weight. Pure: takes token ids, the mask, per-token
statistics and a ``decode`` callable, so the trainer (``stapo.verl_plugin.training.diagnostic_outputs``, which reads
verl's batch), the S2T analysis and ``stapo demo`` all write and read the same thing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

LOG_NAME = "spurious_tokens.jsonl"
# a custom weight rule's tokens below weight 1 (stapo.algorithm.custom_rule): the same records, with the weight
DOWNWEIGHTED_NAME = "downweighted_tokens.jsonl"
SUMMARY_NAME = "spurious_summary.md"


def spurious_records(
    response_ids: torch.Tensor,
    spurious: torch.Tensor,
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    decode: Callable[[list[int]], str],
    context: int,
    step: int | None = None,
    lengths: list[int] | None = None,
) -> list[dict]:
    """One record per silenced token: the token, a few tokens either side, its p and H.

    ``lengths`` (valid tokens per row) keeps the padding after a response out of its context.
    """
    records = []
    for row, col in spurious.nonzero().tolist():
        # only the token and its context are read (a long-CoT row holds 15k ids)
        start = max(0, col - context)
        end = col + 1 + context if lengths is None else min(col + 1 + context, lengths[row])
        window = response_ids[row, start:end].tolist()
        records.append(
            {
                "step": step,
                "sample": row,
                "position": col,
                "token": decode([window[col - start]]),
                "before": decode(window[: col - start]),
                "after": decode(window[col - start + 1 :]),
                "prob": float(torch.exp(log_prob[row, col])),
                "entropy": float(entropy[row, col]),
            }
        )
    return records


def valid_lengths(response_mask: torch.Tensor) -> list[int]:
    """Per row, one past the last valid token (0 for an empty row): where the padding starts."""
    positions = torch.arange(1, response_mask.shape[1] + 1, device=response_mask.device)
    return (response_mask.bool() * positions).amax(dim=1).tolist()


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


def read_records(path: Path) -> list[dict]:
    """The records of a log file; a torn last line (a killed run) is skipped."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").split("\n"):  # not splitlines(): U+2028 may be in text
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # also the empty string after the last newline
            continue
    return records


def write_summary(run_dir: Path, top: int = 15) -> list[tuple[str, int]]:
    """``spurious_summary.md`` beside a run's log (the most often silenced tokens, as a table)."""
    path = Path(run_dir) / LOG_NAME
    if not path.exists():
        return []
    records = read_records(path)
    frequent = most_frequent(records, top)
    lines = [f"# Silenced tokens: {len(records)} logged", "", "| token | times |", "|---|---|"]
    lines += [f"| `{token!s}` | {count} |" for token, count in frequent]
    (Path(run_dir) / SUMMARY_NAME).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return frequent
