"""The silenced-token log: its record format, which tokens a step keeps, the file, its summary.

One record per silenced token (the paper's word clouds, as data): the token, a few tokens of
context either side, its probability and entropy. Pure: takes token ids, the mask, per-token
statistics and a ``decode`` callable, so the trainer (``stapo.verl_plugin.run_log``, which reads
verl's batch), the S2T analysis and ``stapo demo`` all write and read the same thing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

LOG_NAME = "spurious_tokens.jsonl"
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


def spread_evenly(spurious: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """A copy of the mask keeping at most ``max_tokens`` of its tokens, evenly spread in batch order.

    The k silenced tokens (row-major order) are cut into ``max_tokens`` equal runs and the middle
    one of each run is kept: deterministic, and a capped step shows tokens from the whole batch
    (every prompt group, early and late positions), not only its first rows.
    """
    keep = torch.zeros(spurious.shape, dtype=torch.bool, device=spurious.device)
    keep.view(-1)[spread_positions(spurious, max_tokens)] = True
    return keep


def spread_positions(mask: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """The flat (row-major) positions :func:`spread_evenly` keeps, ascending.

    Without listing every True position: on a dense mask of a paper-size batch (31M tokens) that
    list alone is 250 MB. The ranks wanted are known from the count; blocks of the mask are counted,
    and only the blocks holding a wanted rank are searched.
    """
    flat = mask.reshape(-1).bool()
    count = int(torch.count_nonzero(flat))
    if max_tokens <= 0 or count == 0:
        return torch.zeros(0, dtype=torch.long, device=mask.device)
    if count <= max_tokens:
        return flat.nonzero().squeeze(1)
    ranks = (2 * torch.arange(max_tokens, device=flat.device) + 1) * count // (2 * max_tokens)
    return nth_true(flat, ranks)


def nth_true(flat: torch.Tensor, ranks: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Positions of the ``ranks``-th True values (0-based, ascending ranks) of a 1-D bool tensor."""
    padded = torch.nn.functional.pad(flat, (0, -flat.numel() % block)).view(-1, block)
    per_block = torch.count_nonzero(padded, dim=1)
    before = per_block.cumsum(0) - per_block  # True values before each block
    blocks = torch.searchsorted(before, ranks, right=True) - 1
    within = ranks - before[blocks]  # rank inside its block
    running = padded[blocks].cumsum(dim=1)  # one row per wanted rank: blocks x block, small
    offsets = (running > within.unsqueeze(1)).to(torch.uint8).argmax(dim=1)
    return blocks * block + offsets


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
