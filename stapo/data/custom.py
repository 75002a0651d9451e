"""`stapo data prepare custom`: a user's own JSON / JSONL / parquet / CSV file in verl's RL row format.

The user names the question and answer fields; the prompt is the question as it is, or placed in a
template (``{question}`` marks where), after an optional system message. Rows go through the same
validation as the paper's data sets (``stapo.data.prepare.extract``: missing, ambiguous or overlong
questions and answers are skipped, counted by reason and listed in ``<split>.skipped.jsonl``), and
the output is ``<out>/<split>.parquet``, the file ``data.train_files`` / ``data.val_files`` take.
The row format and the reward hook that reads it: recipe/stapo/examples/README.md.
"""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

from stapo.data.prepare import convert, skip_counts, write_split
from stapo.data.readers import DataError, fields_of, read_rows
from stapo.data.rows import rl_row

NAME = "custom"
SPLITS = ("train", "test")
PLACEHOLDER = "{question}"


def check_template(template: str | None) -> None:
    """A template must say where the question goes; one without ``{question}`` would train every row on one
    prompt."""
    if template is not None and PLACEHOLDER not in template:
        raise DataError(f"--template must contain {PLACEHOLDER} where the question goes, got {template!r}")


def user_turn(question: str, template: str | None) -> str:
    """The user message: the question, or the template with ``{question}`` replaced (other braces, such as
    ``\\boxed{}``, stay as written)."""
    return question if template is None else template.replace(PLACEHOLDER, question)


def prepare_custom(
    input_path: Path,
    out_dir: Path,
    question_field: str,
    answer_field: str,
    split: str = "train",
    data_source: str | None = None,
    system_prompt: str | None = None,
    template: str | None = None,
    dedup: bool = False,
    limit: int | None = None,
) -> dict:
    """Write ``<out_dir>/<split>.parquet`` (+ skipped rows and a summary) and return the summary.

    ``data_source`` (default: the input file's name without its suffix) is the row's ``data_source``: what a
    reward function receives first and what verl groups validation metrics by."""
    if split not in SPLITS:
        raise DataError(f"--split must be one of {list(SPLITS)}, got {split!r}")
    check_template(template)
    input_path = Path(input_path)
    source = data_source or input_path.stem
    found: set[str] = set()
    rows = fields_of(read_rows(input_path), found)
    if limit is not None:
        rows = islice(rows, limit)

    def build(question: str, answer: str, extra: dict[str, Any]) -> dict[str, Any]:
        return rl_row(source, user_turn(question, template), answer, extra, system=system_prompt)

    out, skipped = convert(rows, NAME, split, str(input_path), dedup, question_field, answer_field, build)
    absent = [f"{flag} {field!r}" for flag, field in (("--question-field", question_field),
                                                      ("--answer-field", answer_field)) if field not in found]
    if absent:
        raise DataError(f"{input_path}: no field {' or '.join(absent)}; the rows have fields {sorted(found)}")
    if not out:
        raise DataError(f"{input_path}: no usable row among {len(skipped)} (skipped: {skip_counts(skipped)})")
    about = {"name": NAME, "source": str(input_path), "data_source": source}
    return write_split(Path(out_dir), split, out, skipped, about, dedup)
