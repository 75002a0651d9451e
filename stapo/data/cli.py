"""`stapo data ...`: prepare the paper's data sets in verl's parquet format."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stapo.data.prepare import SOURCES, DataError, prepare


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stapo data", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the data sets this command knows")
    prep = sub.add_parser("prepare", help="convert a data set (from the hub, or from --input)")
    prep.add_argument("names", nargs="+", help=f"one or more of: {', '.join(SOURCES)}, or 'all'")
    prep.add_argument(
        "--out", type=Path, default=Path.home() / "data" / "stapo", help="output root (default ~/data/stapo)"
    )
    prep.add_argument("--input", type=Path, help="a local .jsonl or .parquet file instead of the hub (one name only)")
    prep.add_argument("--dedup", action="store_true", help="drop repeated questions (DAPO-Math-17k repeats each ~100x)")
    prep.add_argument("--limit", type=int, help="convert only the first N rows")
    prep.add_argument("--question-field", help="column holding the question (default: auto-detect)")
    prep.add_argument("--answer-field", help="column holding the answer (default: auto-detect)")
    prep.add_argument("--strict", action="store_true", help="fail if any row is skipped")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "list":
        for source in SOURCES.values():
            print(f"{source.name:<15} {source.hub_id} (split {source.split}) -> {source.out_split}.parquet")
        return 0
    if args.limit is not None and args.limit < 1:
        print("stapo data: error: --limit must be >= 1")
        return 2
    names = list(SOURCES) if args.names == ["all"] else args.names
    unknown = [name for name in names if name not in SOURCES]
    if unknown:
        print(f"stapo data: error: unknown data set(s) {unknown}; known: {', '.join(SOURCES)} (or 'all')")
        return 2
    if args.input is not None and len(names) != 1:
        print("stapo data: error: --input converts one data set; name exactly one")
        return 2
    status = 0
    for name in names:
        try:
            summary = prepare(
                name, args.out, args.input, args.dedup, args.limit, args.question_field, args.answer_field
            )
        except DataError as error:
            print(f"stapo data: error: {error}")
            return 2
        print(json.dumps(summary))
        if summary["skipped"]:
            print(f"  skipped rows (see {Path(summary['output']).with_suffix('')}.skipped.jsonl): {summary['skipped']}")
            if args.strict:
                status = 1
    if status:
        print("stapo data: --strict: rows were skipped (counted above), so the exit code is 1", file=sys.stderr)
    return status
