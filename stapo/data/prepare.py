"""Converters to verl's parquet format for the paper's training set and its six benchmarks.

Sources: the usual hub data sets (on a machine with internet) or a local file (``stapo.data.readers``);
``stapo.data.custom`` converts a user's own file with the same validation.
Every row is validated; nothing is dropped silently: skipped rows are counted by reason, printed,
and written next to the output as ``<split>.skipped.jsonl`` (file, row, reason), with the counts
in ``<split>.summary.json``; rows repeating an earlier question are counted too (``--dedup`` drops them).
Local files are read lazily, so DAPO-Math-17k's 1.8M rows stream. What is written never replaces the
input, nor an existing file without ``--force`` (``stapo.data.outputs``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

from stapo.data.outputs import check_outputs, split_files, write_together, writing
from stapo.data.readers import DataError, read_rows
from stapo.data.rows import rl_row, to_parquet

__all__ = ["SOURCES", "SUFFIX", "DataError", "check_paper_outputs", "convert", "extract", "prepare", "read_rows",
           "write_split"]

SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
QUESTION_FIELDS = ("problem", "question", "Problem", "Question", "prompt")
ANSWER_FIELDS = ("answer", "final_answer", "Answer", "ground_truth", "expected_answer")
# a full worked solution is a last resort: its final \boxed{} answer becomes the ground truth
SOLUTION_FIELDS = ("solution", "Solution")
MAX_QUESTION_CHARS = 20_000
MAX_ANSWER_CHARS = 1_000


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


def load_hub_rows(source: Source) -> Iterator[dict[str, Any]]:  # pragma: no cover - needs the internet
    from datasets import load_dataset

    return iter(load_dataset(source.hub_id, source.hub_config, split=source.split))


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
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list, tuple)):
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        if value.is_integer():
            value = int(value)
    text = str(value).strip()
    return text or None


def _user_turn(prompt: Any) -> str | None:
    """The last user message of a chat-format prompt (verl rows, DAPO-Math-17k)."""
    messages = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    user = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not user or not isinstance(user[-1], str):
        return None
    return _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", user[-1])).strip()


def extract(
    row: Any, question_field: str | None = None, answer_field: str | None = None
) -> tuple[str | None, str | None, str]:
    """(question, answer, reason) from a raw row; reason is "" when both are usable."""
    from stapo.reward import last_boxed

    if not isinstance(row, dict):
        return None, None, "not a JSON object" if row is not None else "empty line"
    prompt = row.get("prompt")
    if question_field is None and (isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist")):
        question = _user_turn(prompt)
        reward_model = row.get("reward_model") if isinstance(row.get("reward_model"), dict) else {}
        answer = _as_text(reward_model.get("ground_truth")) or _as_text(_first(row, ANSWER_FIELDS, answer_field))
    else:
        raw_question = _first(row, QUESTION_FIELDS, question_field)
        question = raw_question.strip() if isinstance(raw_question, str) else None
        answer = _as_text(_first(row, ANSWER_FIELDS, answer_field))
        if answer is None and answer_field is None:
            solution = _first(row, SOLUTION_FIELDS, None)
            if isinstance(solution, str):
                answer = last_boxed(solution)
                if answer is None:
                    return question, None, "no answer field and no \\boxed{} answer in the solution"
    if not question:
        return None, answer, "missing question"
    if len(question) > MAX_QUESTION_CHARS:
        return question, answer, f"question longer than {MAX_QUESTION_CHARS} characters"
    if answer:
        wrapped = re.fullmatch(r"\$+([^$]*)\$+", answer)  # OlympiadBench writes "$12$"
        answer = wrapped.group(1).strip() if wrapped else answer
    if not answer:
        return question, None, "missing or ambiguous answer"
    if len(answer) > MAX_ANSWER_CHARS:
        return question, answer, f"answer longer than {MAX_ANSWER_CHARS} characters"
    return question, answer, ""


RowBuilder = Callable[[str, str, dict[str, Any]], dict[str, Any]]


def paper_row(name: str) -> RowBuilder:
    """The paper's row for data set ``name``: the question followed by the boxed-answer instruction."""

    def build(question: str, answer: str, extra: dict[str, Any]) -> dict[str, Any]:
        return rl_row(f"stapo/{name}", f"{question}\n\n{SUFFIX}", answer, {**extra, "benchmark": name})

    return build


class Converted(NamedTuple):
    """What :func:`convert` made of a file's rows."""

    rows: list[dict]  # verl rows
    skipped: list[dict]  # {"file", "row", "reason"}; the row is 1-based, as in the file
    duplicates: int  # rows kept although their question repeats an earlier kept row's (0 with dedup)


def convert(
    rows: Iterable[Any],
    name: str,
    split: str,
    origin: str,
    dedup: bool = False,
    question_field: str | None = None,
    answer_field: str | None = None,
    build: RowBuilder | None = None,
) -> Converted:
    """The rows converted, the skipped ones recorded, the repeated questions counted (or, with ``dedup``,
    skipped), white space ignored when comparing questions.

    ``build(question, answer, extra_info)`` makes a row (default: the paper's, :func:`paper_row`)."""
    build = build or paper_row(name)
    out, skipped, seen, duplicates = [], [], set(), 0
    for number, row in enumerate(rows, start=1):
        question, answer, reason = extract(row, question_field, answer_field)
        if not reason:
            key = " ".join(question.split())
            if key in seen and dedup:
                reason = "duplicate question"
            elif key in seen:
                duplicates += 1
            seen.add(key)
        if reason:
            skipped.append({"file": origin, "row": number, "reason": reason})
            continue
        out.append(build(question, answer, {"split": split, "index": len(out), "source_row": number}))
    return Converted(out, skipped, duplicates)


def refuse_empty(origin: str, converted: Converted) -> None:
    """A file with no row says so (not "no field" or "no usable row among 0")."""
    if not converted.rows and not converted.skipped:
        raise DataError(f"{origin} is empty: it has no rows")


def check_paper_outputs(name: str, out_dir: Path, input_path: Path | None, force: bool) -> None:
    """The refusals of ``stapo.data.outputs`` for data set ``name`` (before anything is read or written)."""
    if name not in SOURCES:
        raise DataError(f"unknown data set {name!r}; known: {', '.join(SOURCES)}")
    inputs = [Path(input_path)] if input_path is not None else []
    check_outputs(Path(out_dir), Path(out_dir) / name, SOURCES[name].out_split, inputs, force)


def prepare(
    name: str,
    out_dir: Path,
    input_path: Path | None = None,
    dedup: bool = False,
    limit: int | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
    force: bool = False,
) -> dict:
    """Write ``<out_dir>/<name>/<split>.parquet`` (+ skipped rows) and return a summary; an existing output is
    replaced only with ``force``, the input never."""
    if name not in SOURCES:
        raise DataError(f"unknown data set {name!r}; known: {', '.join(SOURCES)}")
    source = SOURCES[name]
    if input_path is not None:
        rows, origin = read_rows(Path(input_path)), str(input_path)  # a bad input is said first
    check_paper_outputs(name, out_dir, input_path, force)  # before a download
    if input_path is None:
        try:
            rows, origin = load_hub_rows(source), source.hub_id
        except Exception as error:  # offline, gated, renamed: say what to do instead
            raise DataError(
                f"{source.hub_id} (split {source.split}): could not load from the hub ({type(error).__name__}: "
                f"{error}); fetch it on a machine with internet and pass the file with --input"
            ) from None
    if limit is not None:
        rows = islice(rows, limit)
    converted = convert(rows, name, source.out_split, origin, dedup, question_field, answer_field)
    refuse_empty(origin, converted)
    if not converted.rows:
        raise DataError(f"{origin}: no usable row among {len(converted.skipped)} (skipped: "
                        f"{skip_counts(converted.skipped)})")
    return write_split(Path(out_dir) / name, source.out_split, converted, {"name": name, "source": origin}, dedup)


def skip_counts(skipped: list[dict]) -> dict[str, int]:
    """Skipped rows counted by reason."""
    return dict(Counter(record["reason"] for record in skipped))


def write_split(folder: Path, split: str, converted: Converted, about: dict[str, Any], dedup: bool) -> dict:
    """``<folder>/<split>.parquet``, ``<split>.skipped.jsonl`` (file, row, reason) and ``<split>.summary.json``
    (``about`` followed by the counts), written together (``stapo.data.outputs.write_together``); the summary is
    returned."""
    parquet, skipped_file, summary_file = split_files(folder, split)
    summary = {
        **about,
        "output": str(parquet),
        "rows_in": len(converted.rows) + len(converted.skipped),
        "rows_out": len(converted.rows),
        "skipped": skip_counts(converted.skipped),
        "duplicates": converted.duplicates,
        "dedup": dedup,
    }
    skipped_text = "".join(json.dumps(record) + "\n" for record in converted.skipped)
    try:
        write_together({
            parquet: lambda tmp: to_parquet(converted.rows, tmp),
            skipped_file: lambda tmp: tmp.write_text(skipped_text, encoding="utf-8"),
            summary_file: lambda tmp: tmp.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8"),
        })
    except OSError as error:
        raise writing(folder, error) from None
    return summary
