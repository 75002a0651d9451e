"""`stapo sweep`: a grid of Hydra overrides x seeds, each run in its own folder, then one comparison.

    stapo sweep --grid algo=stapo,grpo --seeds 1,2,3 --out sweeps/first -- \\
        model_preset=tiny trainer.total_training_steps=2

Runs go one after another through ``python -m recipe.stapo.main_stapo`` on this machine (the CPU
presets; ``--max-parallel N``: N at once, the same numbers, see ``run_local_sweep``), or, with
``--launcher ray``, each as its own Ray job through ``launch/ray/submit.sh``. A run
whose folder records a clean finish is skipped, so the same command resumes an interrupted sweep; an
unfinished run restarts from its last checkpoint (its own ``checkpoints/`` folder,
``trainer.resume_mode=auto``). Ctrl-C, or a SIGTERM to the sweep (``kill``, a scheduler's cancel), stops the
local runs in flight and exits 130; the runs of a Ray cluster's jobs keep running (``--launcher ray``).
After the runs, and with ``--compare-only`` at any time,
``OUT/comparison.md`` / ``.json`` and ``OUT/plots/`` are written from the run folders: mean ± standard
error per cell over seeds, then each cell's difference to ``--baseline`` (default the first cell) paired
by seed, the comparison that the shared seeds make sharper. Every run is read at the configured last
step; runs short of it are left out and listed (``--at-shared-step``: every run at the last step all
reached); a group with two runs of one seed is refused (stapo/runs/compare.py). A grid of two axes (an ablation such as
``--grid actor_rollout_ref.actor.policy_loss.tau_p=0.002,0.01 --grid
actor_rollout_ref.actor.policy_loss.entropy_quantile=0.5,0.75``) also gets one table per quantity with
the first axis down and the second across.

``--archive DIR`` copies each finished run's ``sweep_run.json``, ``config.yaml`` and gzipped metrics to
``DIR/runs/...`` (no checkpoints, logs or token samples): a folder to commit or carry. Copied into a sweep's
``--out`` on any machine, its runs count as finished, so a sweep longer than one sitting grows run by run:

    stapo sweep --grid algo=stapo,grpo --seeds 1,2,3 --out sweeps/long --archive results/long -- ...
    cp -r results/long/runs sweeps/long/    # later, elsewhere: then the same command runs only the rest

On a Ray cluster (started with launch/ray/start_head.sh and start_worker.sh, see launch/README.md):

    stapo sweep --launcher ray --address http://HEAD:8265 --max-parallel 2 \\
        --grid algo=stapo,grpo --seeds 1,2,3 --out /shared/sweeps/first -- \\
        model_preset=qwen3_8b trainer.nnodes=1 trainer.n_gpus_per_node=8

- ``--address``: the head's job API (the dashboard port; default ``$RAY_ADDRESS``). The cluster's token
  is found as submit.sh finds it (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``).
- The job's runtime env is launch/ray/runtime_env.yaml (``STAPO_RUNTIME_ENV`` names another); the
  repository is uploaded as its working dir, and the other settings of submit.sh apply.
- ``--out`` must be on storage that this machine and every node mount at the same path (NFS, Lustre,
  a PVC): each job's driver writes its run folder (metrics, config, checkpoints) at the absolute path
  the sweep gives it, and this command reads the progress and the comparison from there. A job that
  succeeds without leaving metrics here is reported as an error naming that requirement.
- ``--max-parallel N`` jobs are in flight at once (default 1): verl fails a job whose GPUs are taken,
  so raise it only to as many runs as the cluster holds together. The command waits for every job,
  printing each run's steps as they land in its folder; a failed job's message and log tail are
  printed and its log is kept as ``trainer.log`` in the run folder. Interrupted (Ctrl-C), the jobs
  keep running; the same command waits for them again instead of submitting them twice.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from stapo.rundir import read_machine
from stapo.runs.folder import (
    STEP_TIME,
    config_value,
    earlier_segments,
    load_run,
    read_record,
    read_run_metrics,
    write_record,
)
from stapo.runs.machine import machine_kind
from stapo.sweep.grid import Axis, PlannedRun, axis_label, found_seeds, parse_axis, parse_seeds, plan

DEFAULT_ADDRESS = "http://127.0.0.1:8265"


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


def has_metrics(run_dir: Path) -> bool:
    try:
        return bool(read_run_metrics(run_dir))
    except FileNotFoundError:
        return False


def total_steps(overrides: list[str]) -> int:
    """trainer.total_training_steps from the overrides (progress display only; 0 when not given)."""
    for text in reversed(overrides):
        key, _, value = text.partition("=")
        if key.lstrip("+") == "trainer.total_training_steps" and value.isdigit():
            return int(value)
    return 0


def run_local(run: PlannedRun, common: list[str], echo: bool, plan: tuple[int, int] | None = None,
              clock=None) -> int:
    """One run here; ``plan``: its (steps, test_freq) from its composed config (else the steps of the overrides),
    ``clock``: the sweep's :class:`~stapo.runs.progress.SweepClock`, for the overall ETA."""
    from stapo.runs.train import run_trainer

    overrides = run.overrides(common)
    segments = earlier_segments(run.run_dir)  # a resumed run's wall time counts every segment
    started_at = time.time()
    machine = machine_kind()
    write_record(run, launcher="local", overrides=overrides, started_at=started_at, segments_s=segments,
                 machine=machine)
    label = f"{run.cell} seed {run.seed}"
    steps, test_freq = plan or (total_steps(overrides), 0)
    result = run_trainer(overrides, run.run_dir, steps, label, echo=echo, test_freq=test_freq, sweep=clock)
    segments.append(round(result.seconds, 1))
    written = read_machine(run.run_dir)  # by the trainer's driver: the kind that built its model too
    write_record(
        run,
        launcher="local",
        overrides=overrides,
        returncode=result.returncode,
        seconds=round(sum(segments), 1),
        segments_s=segments,
        peak_rss_bytes=result.peak_rss_bytes,
        started_at=started_at,  # of the last segment
        finished_at=time.time(),
        machine=written.get("machine") or machine,  # of the last segment
        model_built_on=written.get("model_built_on"),
    )
    return result.returncode


class UnknownBaseline(Exception):
    """``--baseline`` names none of the groups the runs formed (only knowable after them with ``--group-by``)."""


def compare(
    out_dir: Path, runs: list[PlannedRun], group_by: str | None, meta: dict, baseline: str | None = None,
    axes: list[Axis] | None = None, at_shared_step: bool = False,
) -> list[Path]:
    """The comparison of every planned run that has metrics; returns the files written (none when no run
    has metrics). A grid of two ``axes`` (and no ``group_by``) also gets its ablation-style tables, the
    first axis down.

    Raises :class:`UnknownBaseline` after writing the comparison without its paired table, and
    ``stapo.runs.compare.ComparisonError`` (nothing written) for a comparison that would mislead."""
    from stapo.runs.compare import write_comparison_and_warn
    from stapo.runs.folder import group_runs

    loaded = []
    for run in runs:
        try:
            loaded.append(load_run(run.run_dir, group_by))
        except FileNotFoundError:
            print(f"[sweep] {run.cell} seed {run.seed}: no metrics yet, left out of the comparison", flush=True)
    if not loaded:
        return []
    groups = group_runs(loaded)

    def warn(warning: str) -> None:
        print(f"[sweep] warning: {warning}", flush=True)

    if baseline is not None and baseline not in groups:
        # the runs are kept, the table is written
        write_comparison_and_warn(groups, out_dir, meta, warn, paired=False, at_shared_step=at_shared_step)
        raise UnknownBaseline(
            f"--baseline {baseline!r} is none of the compared groups {sorted(groups)}: {out_dir / 'comparison.md'} "
            "has no paired table; rerun with --compare-only --baseline <one of them>"
        )
    grid = None
    if axes is not None and len(axes) == 2 and group_by is None:
        grid = tuple((axis_label(axis.key, axes), list(axis.values)) for axis in axes)
    document = write_comparison_and_warn(groups, out_dir, meta, warn, baseline=baseline, grid=grid,
                                         at_shared_step=at_shared_step)
    for run in document["unfinished"]:
        print(
            f"[sweep] warning: {run['group']} seed {run['seed']} stopped at step {run['last_step']}, short of step "
            f"{document['compared_at']}: left out of the comparison (--at-shared-step compares every run at the "
            "last step they all reached)",
            flush=True,
        )
    written = [out_dir / "comparison.md", out_dir / "comparison.json"]
    try:
        from stapo.runs.plot import draw_groups

        written += draw_groups(groups, out_dir / "plots")
    except ImportError as error:  # matplotlib is optional for the table
        print(f"[sweep] no plots: {error}", flush=True)
    return written


def run_all(args: argparse.Namespace, runs: list[PlannedRun], common: list[str],
            plans: dict[Path, tuple[int, int]] | None = None) -> list[PlannedRun]:
    """Every unfinished run, here (``--max-parallel`` at once) or as Ray jobs; returns the runs that failed."""
    from stapo.runs.train import repo_root

    todo, failed = [], []
    for index, run in enumerate(runs, 1):
        head = f"[sweep] {index}/{len(runs)} {run.cell} seed {run.seed}"
        if is_finished(run.run_dir):
            print(f"{head}: finished before, skipped", flush=True)
        else:
            todo.append((head, run))
    if todo and args.launcher == "local":
        failed += run_local_sweep(todo, common, args.echo, args.max_parallel, plans)
    elif todo:
        from stapo.sweep.ray_launcher import run_ray_sweep

        address = args.address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
        failed += run_ray_sweep(todo, common, repo_root(), address, args.max_parallel, args.poll)
    return failed


def run_local_sweep(
    todo: list[tuple[str, PlannedRun]], common: list[str], echo: bool, max_parallel: int,
    plans: dict[Path, tuple[int, int]] | None = None,
) -> list[PlannedRun]:
    """The runs on this machine in the plan's order, ``max_parallel`` trainer processes at a time; the failed
    ones. Each run's numbers are the same alone or beside another (the CPU trainer does not depend on the
    load, docs/reproducibility.md): running two at once only shares the cores (a CPU run keeps about 1.3 of
    them busy, so two on two cores finish a sweep sooner; the wall times then count the sharing). Each progress
    line ends with the sweep's overall ETA (``plans``: each run's steps and test_freq, from its composed config)."""
    import threading

    from stapo.runs.progress import SweepClock
    from stapo.runs.train import say

    interrupted = threading.Event()
    clock = SweepClock(len(todo), max_parallel)

    def one(head: str, run: PlannedRun) -> PlannedRun | None:
        if interrupted.is_set():  # taken from the queue as the sweep was being stopped
            return run
        eta = f" (sweep ETA {clock.eta()})" if clock.finished_seconds else ""
        say(f"{head}: running in {run.run_dir}{eta}")
        returncode = run_local(run, common, echo, (plans or {}).get(run.run_dir), clock)
        if returncode != 0:
            if not interrupted.is_set():
                say(f"{head}: exit code {returncode} (see {run.run_dir / 'trainer.log'})")
            return run
        return None

    if max_parallel == 1:  # an interrupt lands in the one run's watcher, which stops it
        results = [one(head, run) for head, run in todo]
    else:
        from concurrent.futures import ThreadPoolExecutor

        from stapo.runs.process import stop_running_children

        with ThreadPoolExecutor(max_workers=max_parallel) as pool:
            futures = [pool.submit(one, *item) for item in todo]
            try:
                results = [future.result() for future in futures]
            except KeyboardInterrupt:
                # only this thread sees Ctrl-C (or the SIGTERM stapo's entry point turns into one); the runs in
                # flight are in sessions of their own, so stop them here instead of waiting for them to end
                interrupted.set()
                for future in futures:
                    future.cancel()
                stopped = stop_running_children()
                while not all(future.done() for future in futures):  # a run started as the interrupt came
                    stopped += stop_running_children()
                    time.sleep(0.5)
                say(f"[sweep] interrupted: stopped the {stopped} run(s) in flight (their checkpoints are kept); "
                    "the same command resumes the sweep")
                raise
    return [run for run in results if run is not None]


def archive(runs: list[PlannedRun], out_dir: Path, archive_dir: Path) -> None:
    """``--archive``: each finished run's folder, as ``archive_run`` keeps it, at the same place under
    ``archive_dir`` as under ``out_dir``; an unfinished run is named and left out."""
    from stapo.runs.folder import archive_run

    kept = 0
    for run in runs:
        if not is_finished(run.run_dir):
            print(f"[sweep] {run.cell} seed {run.seed}: not finished, not archived", flush=True)
            continue
        archive_run(run.run_dir, archive_dir / run.run_dir.relative_to(out_dir.resolve()))
        kept += 1
    print(f"[sweep] archived {kept} finished run(s) to {archive_dir / 'runs'}", flush=True)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    from stapo.runs.compare import add_step_option

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
    parser.add_argument(
        "--seeds",
        help="comma-separated seeds (data.seed and rollout seed); default 1, or with --compare-only every seed "
        "that has a run folder under --out",
    )
    parser.add_argument("--out", type=Path, required=True, help="sweep folder: runs/, comparison.md/.json, plots/")
    parser.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="local: here, one after another (or --max-parallel at once); ray: one Ray job each via "
        "launch/ray/submit.sh",
    )
    parser.add_argument("--compare-only", action="store_true", help="write the comparison from the run folders")
    parser.add_argument(
        "--archive",
        type=Path,
        metavar="DIR",
        help="also copy each finished run's sweep_run.json, config.yaml and metrics (gzipped) to DIR/runs/..., "
        "the same layout as --out: small enough for git, and a sweep whose --out holds them skips those runs",
    )
    add_step_option(parser)
    parser.add_argument("--dry-run", action="store_true", help="print each run's command and stop")
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="skip the recipe's checks of every run before the first starts (each run still checks itself)",
    )
    parser.add_argument(
        "--address",
        help=f"ray: the head's job API, http://HEAD:8265 (default: $RAY_ADDRESS, else {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "--max-parallel",
        type=positive_int,
        default=1,
        metavar="N",
        help="runs at once, >= 1 (default 1). local: trainer processes on this machine (2 on a 2-core CPU finish "
        "a sweep of CPU runs sooner, same numbers); ray: jobs in flight (as many runs as the cluster's GPUs hold)",
    )
    parser.add_argument(
        "--poll", type=positive_float, default=10.0, metavar="S", help="ray: seconds between status polls (10)"
    )
    parser.add_argument("--group-by", metavar="CONFIG_KEY", help="group runs by this config key instead of the cell")
    parser.add_argument(
        "--baseline",
        metavar="GROUP",
        help="the group the paired differences are taken against, as named in the table (e.g. algo=grpo); "
        "default: the first",
    )
    parser.add_argument("--echo", action="store_true", help="local: print the trainer's whole output")
    parser.add_argument("overrides", nargs="*", help="after --: Hydra overrides common to every run")
    return parser


def check_cells(runs: list[PlannedRun], common: list[str], paths: bool) -> list:
    """The recipe's own checks (``stapo check``) on every run of the grid, before the first one starts: a cell
    the recipe would refuse (an unknown algorithm, a bad value) is refused now, naming the cell, instead of
    failing when its turn comes. ``paths``: also the model and data files (they are on this machine for a
    local sweep; on a cluster's nodes for ``--launcher ray``). The composed configs, in the order of ``runs``."""
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.check import check_run, compose_run

    configs = []
    for run in runs:
        try:
            configs.append(compose_run(run.overrides(common)))
            check_run(configs[-1], paths=paths, show_calls=False)  # a line a reward call, times the cells: too many
        except STAPOConfigError as error:
            raise STAPOConfigError(f"sweep cell {run.cell} seed {run.seed}: {error}") from None
    return configs


def absolute_paths(common: list[str], runs: list[PlannedRun]) -> tuple[list[str], list[PlannedRun]]:
    """The common and the cells' overrides with the relative paths of the files a run loads made absolute here
    (``stapo.check.absolute_file_overrides``, said once each), the cells' names and folders unchanged."""
    from stapo.check import absolute_file_overrides

    common, notes = absolute_file_overrides(common)
    planned = []
    for run in runs:
        cell, more = absolute_file_overrides(list(run.cell_overrides))
        notes += [note for note in more if note not in notes]
        planned.append(replace(run, cell_overrides=tuple(cell)))
    for note in notes:
        print(f"[sweep] {note}", flush=True)
    return common, planned


def main(argv: list[str]) -> int:
    from stapo.check import quiet_optional_engines

    quiet_optional_engines()  # each cell's check imports verl
    parser = build_parser()
    args = parser.parse_args(argv)
    axes = [parse_axis(text) for text in args.grid]
    if args.seeds is None and args.compare_only:
        seeds = found_seeds(axes, args.out)
        if not seeds:
            print(f"[sweep] error: no run folder of the grid's cells under {args.out / 'runs'}: nothing to compare "
                  "(is --out the sweep's folder, and --grid its grid?)", flush=True)
            return 2
    else:
        seeds = parse_seeds(args.seeds or "1")
    runs = plan(axes, seeds, args.out)
    cells = sorted({run.cell for run in runs})
    if args.baseline is not None and args.group_by is None and args.baseline not in cells:
        parser.error(f"--baseline must be one of the grid's cells {cells}, got {args.baseline!r}")
    if args.baseline is not None and args.group_by is not None:
        # groups are named <last part of the key>=<value>; the values are only known from the runs' configs
        prefix = args.group_by.rsplit(".", 1)[-1] + "="
        if not args.baseline.startswith(prefix) or args.baseline == prefix:
            parser.error(
                f"with --group-by {args.group_by} the groups are named {prefix}<value>, so --baseline must be "
                f"{prefix}<one of its values>, got {args.baseline!r}"
            )
    common = list(args.overrides)
    if args.launcher == "local":  # every cell starts in its own run folder: a relative file path means this folder's
        common, runs = absolute_paths(common, runs)
    meta = {"command": "stapo sweep " + shlex.join(argv), "grid": {a.key: list(a.values) for a in axes}}
    plans = {}
    if not args.compare_only and not args.no_check:
        from stapo.runs.train import progress_plan

        configs = check_cells(runs, common, paths=args.launcher == "local")
        plans = {run.run_dir: progress_plan(config) for run, config in zip(runs, configs, strict=True)}
    if args.dry_run:
        for run in runs:
            state = "done" if is_finished(run.run_dir) else "to run"
            print(f"[{state}] python -m recipe.stapo.main_stapo {shlex.join(run.overrides(common))}")
        return 0
    failed = [] if args.compare_only else run_all(args, runs, common, plans)
    if args.archive is not None:
        archive(runs, args.out, args.archive)
    from stapo.runs.compare import ComparisonError

    try:
        written = compare(args.out, runs, args.group_by, meta, args.baseline, axes, args.at_shared_step)
    except (UnknownBaseline, ComparisonError) as error:
        print(f"[sweep] error: {error}", flush=True)
        return 2
    if not written and args.compare_only:
        print(f"[sweep] error: none of the {len(runs)} planned runs under {args.out / 'runs'} has metrics: nothing "
              "compared", flush=True)
        return 2
    for path in written:
        print(f"[sweep] wrote {path}", flush=True)
    if (args.out / "comparison.md").exists():
        print((args.out / "comparison.md").read_text(encoding="utf-8"))
    if not args.compare_only and not failed:
        missing = [run for run in runs if not has_metrics(run.run_dir)]
        if missing and args.launcher == "ray":
            print(
                f"[sweep] error: {len(missing)} job(s) succeeded but their run folder has no finished metrics here, "
                f"e.g. {missing[0].run_dir}: --out must be on storage this machine and every node share",
                flush=True,
            )
            failed = missing
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
