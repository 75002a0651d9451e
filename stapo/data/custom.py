"""`stapo data prepare custom`: a user's own JSON / JSONL / parquet / CSV file in verl's RL row format.

The user names the question and answer fields; the prompt is the question as it is, or placed in a
template (``{question}`` marks where), after an optional system message. Rows go through the same
validation as the paper's data sets (``stapo.data.prepare.extract``: missing, ambiguous or overlong
questions and answers are skipped, counted by reason and listed in ``<split>.skipped.jsonl``), and
the output is ``<out>/<split>.parquet``, the file ``data.train_files`` / ``data.val_files`` take.
The row format and the reward hook that reads it: recipe/stapo/examples/README.md.

The rows' ``data_source`` is what verl groups validation metrics by and what a reward receives first, so
the train and test files of one task must share it: by default it is the input's name with a split word
(train, test, val, valid, validation, dev) and a hub shard suffix (``-00000-of-00001``) removed, or the
folder's name when nothing else is left (``gsm/train.jsonl`` and ``gsm/test.jsonl`` are both ``gsm``).
"""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path
from typing import Any

from stapo.data.outputs import check_outputs
from stapo.data.prepare import convert, refuse_empty, skip_counts, write_split
from stapo.data.readers import DataError, fields_of, read_rows
from stapo.data.rows import rl_row

NAME = "custom"
SPLITS = ("train", "test")
PLACEHOLDER = "{question}"
SPLIT_WORDS = ("train", "test", "val", "valid", "validation", "dev")
_SHARD = re.compile(r"-\d+-of-\d+$")  # the hub's parquet shards: train-00000-of-00001
_SPLIT_AT_END = re.compile(rf"(?:^|[._\-\s]+)(?:{'|'.join(SPLIT_WORDS)})$", re.IGNORECASE)


def check_template(template: str | None) -> None:
    """A template must say where the question goes; one without ``{question}`` would train every row on one
    prompt."""
    if template is not None and PLACEHOLDER not in template:
        raise DataError(f"--template must contain {PLACEHOLDER} where the question goes, got {template!r}")


def default_data_source(path: Path) -> tuple[str, str]:
    """(the name, where it comes from) shared by a task's split files: the file's name without a split word,
    else the folder's name."""
    stem = _SHARD.sub("", Path(path).stem)
    name = _SPLIT_AT_END.sub("", stem)
    if name == stem:
        return stem, "the input file's name"
    if name:
        return name, f"the input file's name without {stem[len(name):].lstrip('._- ')!r}"
    folder = Path(path).resolve().parent.name
    return (folder, "the input's folder") if folder else (stem, "the input file's name")


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
    force: bool = False,
) -> dict:
    """Write ``<out_dir>/<split>.parquet`` (+ skipped rows and a summary) and return the summary; an existing
    output is replaced only with ``force``, the input never.

    ``data_source`` (default: :func:`default_data_source`) is the row's ``data_source``: what a reward function
    receives first and what verl groups validation metrics by."""
    if split not in SPLITS:
        raise DataError(f"--split must be one of {list(SPLITS)}, got {split!r}")
    check_template(template)
    input_path = Path(input_path)
    source, origin = (data_source, "--data-source") if data_source else default_data_source(input_path)
    found: set[str] = set()
    rows = fields_of(read_rows(input_path), found)
    check_outputs(Path(out_dir), Path(out_dir), split, [input_path], force)
    if limit is not None:
        rows = islice(rows, limit)

    def build(question: str, answer: str, extra: dict[str, Any]) -> dict[str, Any]:
        return rl_row(source, user_turn(question, template), answer, extra, system=system_prompt)

    converted = convert(rows, NAME, split, str(input_path), dedup, question_field, answer_field, build)
    refuse_empty(str(input_path), converted)
    absent = [f"{flag} {field!r}" for flag, field in (("--question-field", question_field),
                                                      ("--answer-field", answer_field)) if field not in found]
    if absent:
        raise DataError(f"{input_path}: no field {' or '.join(absent)}; the rows have fields {sorted(found)}")
    if not converted.rows:
        raise DataError(f"{input_path}: no usable row among {len(converted.skipped)} (skipped: "
                        f"{skip_counts(converted.skipped)})")
    about = {"name": NAME, "source": str(input_path), "data_source": source, "data_source_from": origin}
    return write_split(Path(out_dir), split, converted, about, dedup)
