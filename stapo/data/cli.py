"""`stapo data ...`: prepare the paper's data sets, or your own file (`custom`), in verl's parquet format.

Errors are one line on stderr (``stapo data: error: ...``) with exit code 2, a file system error included;
the summary of what was written goes to stdout. Nothing the user gave is overwritten: the input never, an
existing output only with ``--force`` (``stapo.data.outputs``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stapo.data.custom import NAME as CUSTOM
from stapo.data.custom import SPLITS, prepare_custom
from stapo.data.prepare import SOURCES, DataError, check_paper_outputs, prepare
from stapo.data.readers import SUFFIXES, read_rows

DEFAULT_OUT = Path.home() / "data" / "stapo"
# the flags that shape a custom file's rows; the paper's data sets keep the paper's prompt
CUSTOM_ONLY = ("system_prompt", "template", "split", "data_source")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stapo data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the data sets this command knows")
    prep = sub.add_parser(
        "prepare",
        help="convert a data set (from the hub, or from --input), or your own file (custom)",
        description="The paper's data sets: `stapo data prepare NAME [--input FILE] [--out DIR]` writes "
        "DIR/NAME/<split>.parquet. Your own file: `stapo data prepare custom --input FILE --question-field F "
        "--answer-field F --out DIR` writes DIR/<split>.parquet (recipe/stapo/examples/README.md shows a row "
        "and the reward hook).",
    )
    prep.add_argument(
        "names", nargs="+", help=f"one or more of: {', '.join(SOURCES)}, or 'all'; or '{CUSTOM}' (your own --input)"
    )
    prep.add_argument(
        "--out", type=Path, metavar="DIR",
        help=f"the paper's sets: written under DIR/NAME/ (default DIR {DEFAULT_OUT}); {CUSTOM}: DIR/<split>.parquet "
        "(required)",
    )
    prep.add_argument(
        "--input", type=Path, metavar="FILE",
        help=f"a local file ({', '.join(SUFFIXES)}) instead of the hub (one name only)",
    )
    prep.add_argument("--dedup", action="store_true", help="drop repeated questions (DAPO-Math-17k repeats each ~100x)")
    prep.add_argument(
        "--force", action="store_true", help="replace outputs that already exist (the input itself is never replaced)"
    )
    prep.add_argument("--limit", type=int, metavar="N", help="convert only the first N rows")
    prep.add_argument(
        "--question-field", metavar="F",
        help=f"column holding the question (default: auto-detect; required for {CUSTOM})",
    )
    prep.add_argument(
        "--answer-field", metavar="F", help=f"column holding the answer (default: auto-detect; required for {CUSTOM})"
    )
    prep.add_argument("--strict", action="store_true", help="fail if any row is skipped")
    prep.add_argument("--system-prompt", metavar="TEXT", help=f"{CUSTOM}: a system message before the user turn")
    prep.add_argument(
        "--template",
        metavar="TEXT",
        help=f"{CUSTOM}: the user turn, with {{question}} where the question goes (default: the question as is)",
    )
    prep.add_argument(
        "--split", choices=SPLITS, help=f"{CUSTOM}: the output file DIR/<split>.parquet (default train)"
    )
    prep.add_argument(
        "--data-source", metavar="NAME",
        help=f"{CUSTOM}: the rows' data_source, shared by the train and test files (default: the input file's name "
        "without a split word such as train or test, or its folder's name when nothing else is left)",
    )
    return parser


def fail(message: str) -> int:
    print(f"stapo data: error: {' '.join(message.split())}", file=sys.stderr)  # one line, whatever the message
    return 2


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("out", "input"):
        if getattr(args, flag, None) is not None:
            setattr(args, flag, getattr(args, flag).expanduser())
    if args.action == "list":
        for source in SOURCES.values():
            print(f"{source.name:<15} {source.hub_id} (split {source.split}) -> {source.out_split}.parquet")
        print(f"{CUSTOM:<15} your own --input file ({', '.join(SUFFIXES)}) -> <split>.parquet")
        return 0
    if args.limit is not None and args.limit < 1:
        return fail("--limit must be >= 1")
    if CUSTOM in args.names:
        return _prepare_custom(args)
    given = [f"--{flag.replace('_', '-')}" for flag in CUSTOM_ONLY if getattr(args, flag) is not None]
    if given:
        return fail(f"{', '.join(given)} apply to `{CUSTOM}` only (the paper's data sets keep the paper's prompt)")
    names = list(SOURCES) if args.names == ["all"] else args.names
    unknown = [name for name in names if name not in SOURCES]
    if unknown:
        return fail(f"unknown data set(s) {unknown}; known: {', '.join(SOURCES)} (or 'all'), or '{CUSTOM}'")
    if args.input is not None and len(names) != 1:
        return fail("--input converts one data set; name exactly one")
    status = 0
    try:
        if args.input is not None:
            read_rows(args.input)  # a missing or unreadable input is said first
        for name in names:  # every refusal of an output before the first data set is written
            check_paper_outputs(name, args.out or DEFAULT_OUT, args.input, args.force)
        for name in names:
            summary = prepare(
                name, args.out or DEFAULT_OUT, args.input, args.dedup, args.limit, args.question_field,
                args.answer_field, args.force,
            )
            status = max(status, _report(summary, args.strict))
    except (DataError, OSError) as error:
        return fail(_one_line(error))
    return _strict_status(status)


def _prepare_custom(args) -> int:
    if args.names != [CUSTOM]:
        return fail(f"`{CUSTOM}` converts one file; name it alone")
    needed = {"--input FILE": args.input, "--question-field F": args.question_field,
              "--answer-field F": args.answer_field, "--out DIR": args.out}
    missing = [flag for flag, value in needed.items() if value is None]
    if missing:
        return fail(f"`{CUSTOM}` needs {' and '.join(missing)} (stapo data prepare {CUSTOM} {' '.join(needed)})")
    try:
        summary = prepare_custom(
            args.input, args.out, args.question_field, args.answer_field, args.split or "train", args.data_source,
            args.system_prompt, args.template, args.dedup, args.limit, args.force,
        )
    except (DataError, OSError) as error:
        return fail(_one_line(error))
    return _strict_status(_report(summary, args.strict))


def _one_line(error: Exception) -> str:
    """A refusal as it is; a file system error (unreadable input, a write that failed) as its path and reason."""
    if isinstance(error, OSError):
        return f"{error.filename or '?'}: {error.strerror or error}"
    return str(error)


def _report(summary: dict, strict: bool) -> int:
    """The summary on stdout, then what a user may not expect: the data_source chosen for them, repeated
    questions kept, skipped rows; 1 when --strict and rows were skipped."""
    print(json.dumps(summary))
    if summary.get("data_source_from") and summary["data_source_from"] != "--data-source":
        print(f"  data_source: {summary['data_source']!r} (from {summary['data_source_from']}; --data-source NAME "
              "sets another: give a task's train and test files the same one)")
    if summary.get("duplicates"):
        print(f"  repeated questions kept: {summary['duplicates']} (rows whose question an earlier row has; --dedup "
              "drops them)")
    if summary["skipped"]:
        print(f"  skipped rows (see {Path(summary['output']).with_suffix('')}.skipped.jsonl): {summary['skipped']}")
        return 1 if strict else 0
    return 0


def _strict_status(status: int) -> int:
    if status:
        print("stapo data: --strict: rows were skipped (counted above), so the exit code is 1", file=sys.stderr)
    return status
