"""Converters to verl's parquet format for the paper's training set and its six benchmarks.

Sources: the usual hub data sets (on a machine with internet) or a local JSONL / parquet file.
Every row is validated; nothing is dropped silently: skipped rows are counted by reason, printed,
and written next to the output as ``<split>.skipped.jsonl`` (file, row, reason).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
QUESTION_FIELDS = ("problem", "question", "Problem", "Question", "prompt")
ANSWER_FIELDS = ("answer", "final_answer", "Answer", "ground_truth", "solution")


@dataclass(frozen=True)
class Source:
    """Where a data set lives on the hub and which split the paper uses."""

    name: str
    hub_id: str
    split: str
    out_split: str
    hub_config: str | None = None


SOURCES = {
    s.name: s
    for s in (
        Source("dapo_math_17k", "BytedTsinghua-SIA/DAPO-Math-17k", "train", "train"),
        Source("aime24", "HuggingFaceH4/aime_2024", "train", "test"),
        Source("aime25", "yentinglin/aime_2025", "train", "test"),
        Source("amc23", "math-ai/amc23", "test", "test"),
        Source("math500", "HuggingFaceH4/MATH-500", "test", "test"),
        Source("minerva", "math-ai/minervamath", "test", "test"),
        Source("olympiadbench", "math-ai/olympiadbench", "test", "test"),
    )
}

# DAPO-Math-17k ships verl rows whose prompt wraps the question in DAPO's own instructions
_DAPO_PREFIX = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.DOTALL)
_DAPO_SUFFIX = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")


class DataError(ValueError):
    """A file cannot be converted at all (missing, unreadable, no usable fields)."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    if path.suffix in (".jsonl", ".json"):
        rows = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}: row {number} is not valid JSON ({error.msg})") from None
        return rows
    raise DataError(f"{path}: unsupported file type {path.suffix!r} (use .jsonl or .parquet)")


def load_hub_rows(source: Source) -> list[dict[str, Any]]:  # pragma: no cover - needs the internet
    from datasets import load_dataset

    return list(load_dataset(source.hub_id, source.hub_config, split=source.split))


def _first(row: dict, fields: tuple[str, ...], override: str | None):
    if override is not None:
        return row.get(override)
    for field in fields:
        if row.get(field) is not None:
            return row[field]
    return None


def _as_text(value: Any) -> str | None:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        value = value[0] if len(value) == 1 else None  # several answers: ambiguous
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


def extract(row: dict, question_field: str | None = None, answer_field: str | None = None) -> tuple[str | None, str | None, str]:
    """(question, answer, reason) from a raw row; reason is "" when both are usable."""
    if isinstance(row.get("prompt"), (list, tuple)) or hasattr(row.get("prompt"), "tolist"):
        messages = row["prompt"].tolist() if hasattr(row["prompt"], "tolist") else row["prompt"]
        user = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        question = _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", user[-1])) if user else None
        answer = _as_text((row.get("reward_model") or {}).get("ground_truth"))
    else:
        question = _as_text(_first(row, QUESTION_FIELDS, question_field))
        answer = _as_text(_first(row, ANSWER_FIELDS, answer_field))
    if not question:
        return None, answer, "missing question"
    if not answer:
        return question, None, "missing or ambiguous answer"
    return question.strip(), answer, ""


def convert(
    rows: list[dict],
    name: str,
    split: str,
    origin: str,
    dedup: bool = False,
    question_field: str | None = None,
    answer_field: str | None = None,
) -> tuple[list[dict], list[dict]]:
    """(verl rows, skipped records); the row index in skipped records is 1-based, as in the file."""
    out, skipped, seen = [], [], set()
    for number, row in enumerate(rows, start=1):
        question, answer, reason = extract(row, question_field, answer_field)
        if not reason and dedup:
            key = " ".join(question.split())
            reason = "duplicate question" if key in seen else ""
            seen.add(key)
        if reason:
            skipped.append({"file": origin, "row": number, "reason": reason})
            continue
        out.append(
            {
                "data_source": f"stapo/{name}",
                "prompt": [{"role": "user", "content": f"{question}\n\n{SUFFIX}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": len(out), "source_row": number, "benchmark": name},
            }
        )
    return out, skipped


def prepare(
    name: str,
    out_dir: Path,
    input_path: Path | None = None,
    dedup: bool = False,
    limit: int | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
) -> dict:
    """Write ``<out_dir>/<name>/<split>.parquet`` (+ skipped rows) and return a summary."""
    import pandas as pd

    if name not in SOURCES:
        raise DataError(f"unknown data set {name!r}; known: {', '.join(SOURCES)}")
    source = SOURCES[name]
    if input_path is not None:
        rows, origin = read_rows(input_path), str(input_path)
    else:
        rows, origin = load_hub_rows(source), source.hub_id
    if limit is not None:
        rows = rows[:limit]
    out, skipped = convert(rows, name, source.out_split, origin, dedup, question_field, answer_field)
    if not out:
        raise DataError(f"{origin}: no usable row among {len(rows)} ({dict(Counter(s['reason'] for s in skipped))})")
    target = Path(out_dir) / name
    target.mkdir(parents=True, exist_ok=True)
    parquet = target / f"{source.out_split}.parquet"
    tmp = parquet.with_suffix(".parquet.tmp")
    pd.DataFrame(out).to_parquet(tmp)
    tmp.replace(parquet)
    with (target / f"{source.out_split}.skipped.jsonl").open("w", encoding="utf-8") as handle:
        for record in skipped:
            handle.write(json.dumps(record) + "\n")
    return {
        "name": name,
        "output": str(parquet),
        "rows_in": len(rows),
        "rows_out": len(out),
        "skipped": dict(Counter(record["reason"] for record in skipped)),
    }
