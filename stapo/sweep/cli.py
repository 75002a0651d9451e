"""`stapo sweep`: a grid of Hydra overrides x seeds, each run in its own folder, then one comparison.

    stapo sweep --grid algo=stapo,grpo --seeds 1,2,3 --out sweeps/first -- \\
        model_preset=tiny trainer.total_training_steps=2

Runs go one after another through ``python -m recipe.stapo.main_stapo`` on this machine (the CPU
presets), or, with ``--launcher ray``, each as its own Ray job through ``launch/ray/submit.sh``
(``RAY_ADDRESS`` and the other settings of that script apply; ``--out`` must then be on storage the
cluster's nodes share). A run whose folder records a clean finish is skipped, so the same command
resumes an interrupted sweep; an unfinished run restarts from its last checkpoint (its own
``checkpoints/`` folder, ``trainer.resume_mode=auto``). After the runs, and with ``--compare-only``
at any time, ``OUT/comparison.md`` / ``.json`` and ``OUT/plots/`` are written from the run folders.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from stapo.sweep.grid import PlannedRun, parse_axis, parse_seeds, plan
from stapo.sweep.runs import SWEEP_RECORD, config_value, load_run, read_record, read_run_metrics

STEP_TIME = "timing_s/step"


def write_record(run: PlannedRun, **fields) -> None:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    record = {"cell": run.cell, "seed": run.seed, "cell_overrides": list(run.cell_overrides), **fields}
    tmp = run.run_dir / (SWEEP_RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(run.run_dir / SWEEP_RECORD)


def is_finished(run_dir: Path) -> bool:
    """A clean exit recorded by this command, or (a cluster job) metrics up to the configured last step."""
    if read_record(run_dir).get("returncode") == 0:
        return True
    total = config_value(run_dir, "trainer.total_training_steps")
    try:
        steps = read_run_metrics(run_dir)
    except FileNotFoundError:
        return False
    trained = [step for step, metrics in steps.items() if STEP_TIME in metrics]
    return isinstance(total, int) and bool(trained) and max(trained) >= total


def total_steps(overrides: list[str]) -> int:
    """trainer.total_training_steps from the overrides (progress display only; 0 when not given)."""
    for text in reversed(overrides):
        key, _, value = text.partition("=")
        if key.lstrip("+") == "trainer.total_training_steps" and value.isdigit():
            return int(value)
    return 0


def run_local(run: PlannedRun, common: list[str], echo: bool) -> int:
    from stapo.demo.train import run_trainer

    overrides = run.overrides(common)
    write_record(run, launcher="local", overrides=overrides, started_at=time.time())
    label = f"{run.cell} seed {run.seed}"
    result = run_trainer(overrides, run.run_dir, total_steps(overrides), label, echo=echo)
    write_record(
        run,
        launcher="local",
        overrides=overrides,
        returncode=result.returncode,
        seconds=round(result.seconds, 1),
        peak_rss_bytes=result.peak_rss_bytes,
        finished_at=time.time(),
    )
    return result.returncode


def submit_ray(run: PlannedRun, common: list[str], repo: Path) -> int:
    overrides = run.overrides(common)
    job_id = f"stapo-sweep-{run.run_dir.parent.name}-s{run.seed}-{int(time.time())}"[:120]
    env = dict(os.environ, STAPO_JOB_ID=job_id, STAPO_WAIT="0")
    command = ["bash", str(repo / "launch" / "ray" / "submit.sh"), *overrides]
    proc = subprocess.run(command, check=False, cwd=repo, env=env)
    write_record(
        run,
        launcher="ray",
        overrides=overrides,
        job_id=job_id,
        submit_returncode=proc.returncode,
        submitted_at=time.time(),
    )
    return proc.returncode


def compare(out_dir: Path, runs: list[PlannedRun], group_by: str | None, meta: dict) -> list[Path]:
    """The comparison of every planned run that has metrics; returns the files written."""
    from stapo.sweep.compare import write_comparison
    from stapo.sweep.runs import group_runs

    loaded = []
    for run in runs:
        try:
            loaded.append(load_run(run.run_dir, group_by))
        except FileNotFoundError:
            print(f"[sweep] {run.cell} seed {run.seed}: no metrics yet, left out of the comparison", flush=True)
    if not loaded:
        return []
    groups = group_runs(loaded)
    write_comparison(groups, out_dir, meta)
    written = [out_dir / "comparison.md", out_dir / "comparison.json"]
    try:
        from stapo.demo.plot import draw_groups

        written += draw_groups(groups, out_dir / "plots")
    except ImportError as error:  # matplotlib is optional for the table
        print(f"[sweep] no plots: {error}", flush=True)
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stapo sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="one axis of the grid (repeatable); KEY is any Hydra override key, e.g. algo",
    )
    parser.add_argument("--seeds", default="1", help="comma-separated seeds (data.seed and rollout seed), default 1")
    parser.add_argument("--out", type=Path, required=True, help="sweep folder: runs/, comparison.md/.json, plots/")
    parser.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="local: one after another here; ray: one Ray job each via launch/ray/submit.sh",
    )
    parser.add_argument("--compare-only", action="store_true", help="write the comparison from the run folders")
    parser.add_argument("--dry-run", action="store_true", help="print each run's command and stop")
    parser.add_argument("--resubmit", action="store_true", help="ray: submit again runs already submitted")
    parser.add_argument("--group-by", metavar="CONFIG_KEY", help="group runs by this config key instead of the cell")
    parser.add_argument("--echo", action="store_true", help="local: print the trainer's whole output")
    parser.add_argument("overrides", nargs="*", help="after --: Hydra overrides common to every run")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    axes = [parse_axis(text) for text in args.grid]
    runs = plan(axes, parse_seeds(args.seeds), args.out)
    common = list(args.overrides)
    meta = {"command": "stapo sweep " + shlex.join(argv), "grid": {a.key: list(a.values) for a in axes}}
    if args.dry_run:
        for run in runs:
            state = "done" if is_finished(run.run_dir) else "to run"
            print(f"[{state}] python -m recipe.stapo.main_stapo {shlex.join(run.overrides(common))}")
        return 0
    failed = []
    if not args.compare_only:
        from stapo.demo.train import repo_root

        repo = repo_root()
        for index, run in enumerate(runs, 1):
            head = f"[sweep] {index}/{len(runs)} {run.cell} seed {run.seed}"
            if is_finished(run.run_dir):
                print(f"{head}: finished before, skipped", flush=True)
                continue
            if args.launcher == "ray":
                if read_record(run.run_dir).get("job_id") and not args.resubmit:
                    print(f"{head}: submitted before ({read_record(run.run_dir)['job_id']}), skipped", flush=True)
                    continue
                print(f"{head}: submitting", flush=True)
                returncode = submit_ray(run, common, repo)
            else:
                print(f"{head}: running in {run.run_dir}", flush=True)
                returncode = run_local(run, common, args.echo)
            if returncode != 0:
                failed.append(run)
                print(f"{head}: exit code {returncode} (see {run.run_dir / 'trainer.log'})", flush=True)
    for path in compare(args.out, runs, args.group_by, meta):
        print(f"[sweep] wrote {path}", flush=True)
    if (args.out / "comparison.md").exists():
        print((args.out / "comparison.md").read_text(encoding="utf-8"))
    if args.launcher == "ray" and not args.compare_only:
        print(f"[sweep] jobs submitted; when they finish: stapo sweep {shlex.join(argv)} --compare-only")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
