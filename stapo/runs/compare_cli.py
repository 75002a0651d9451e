"""`stapo compare`: the comparison a sweep writes, over any run folders, from one set or several.

    stapo compare results/ablation/runs results/centre/runs/algo-stapo results/centre/runs/algo-justrl \\
        --baseline algo=stapo --out results/ablation/against-centre

An ablation's cells set beside another set's runs of its centre and its floor, or the archived runs of two
sweeps made months apart: each path is a run folder (``stapo.run_dir``) or a folder holding run folders at any
depth (a sweep's ``--out``, an archive's ``runs/``). Runs are grouped as a sweep groups them (the cell in
``sweep_run.json``, else ``--group-by``'s config key, else the folder's name) and paired by seed with
``--baseline``; ``OUT/comparison.md`` and ``.json`` are the same tables as ``stapo sweep``'s (stapo/runs/compare.py),
with what each group's settings differ in from the baseline's and a warning when the runs were made on more
than one kind of machine (runs of one seed then do not pair bit for bit). Plots: ``stapo plot`` on the same
folders.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from stapo.runs.compare import ComparisonError, add_step_option, write_comparison_and_warn
from stapo.runs.folder import find_runs, group_runs, load_run


def warn(warning: str) -> None:
    print(f"[compare] warning: {warning}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stapo compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, or folders holding run folders")
    parser.add_argument("--out", type=Path, required=True, help="where comparison.md and comparison.json go")
    parser.add_argument("--baseline", metavar="GROUP",
                        help="the group the paired differences are taken against, as named in the table (default: "
                        "the first group found)")
    parser.add_argument("--group-by", metavar="CONFIG_KEY", help="group runs by this config key instead of the cell")
    add_step_option(parser)
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run_dirs = []
    for path in args.paths:
        if not path.exists():
            parser.error(f"{path}: does not exist")
        found = find_runs(path)
        if not found:
            parser.error(f"{path}: no run folder (one holding metrics.jsonl or a wandb offline run) in it")
        run_dirs += [run for run in found if run not in run_dirs]
    if args.group_by:
        from stapo.runs.plot import check_group_by

        check_group_by(parser, run_dirs, args.group_by)
    runs = [load_run(path, args.group_by) for path in run_dirs]
    groups = group_runs(runs)
    if args.baseline is not None and args.baseline not in groups:
        parser.error(f"--baseline must be one of the groups the runs form {sorted(groups)}, got {args.baseline!r}")
    meta = {"command": "stapo compare " + shlex.join(argv), "compared_runs": [str(path) for path in run_dirs]}
    try:
        write_comparison_and_warn(groups, args.out, meta, warn, baseline=args.baseline,
                                  at_shared_step=args.at_shared_step)
    except ComparisonError as error:
        print(f"stapo compare: error: {error}", file=sys.stderr)
        return 2
    print(f"[compare] {len(runs)} runs in {len(groups)} groups; wrote {args.out / 'comparison.md'} and "
          f"{args.out / 'comparison.json'}")
    print((args.out / "comparison.md").read_text(encoding="utf-8"))
    return 0
