"""``python -m benchmarks.startup [--pairs N] [--before-tree DIR] [--json OUT]``: the start-up of a tiny trainer
run, with vLLM imported by its processes as before (``STAPO_HIDE_VLLM=0``) and hidden from them (the default for a
run on the HF server, stapo/verl_plugin/cpu: ``hide_unused_vllm``); or, with ``--before-tree DIR`` (a checkout of an
earlier commit, e.g. ``git worktree add --detach DIR REV``), that checkout's code ("before") against this one's
("after"), vLLM hidden in both: DIR goes first on PYTHONPATH, so the driver and every Ray worker import its
``stapo`` and ``recipe`` instead of the installed ones. ``--as-user`` leaves ``STAPO_HIDE_VLLM`` out of every run's
environment, as a user runs the recipe (the recipe decides; before 09608cf its driver never hid vLLM itself).

Each run is ``python -m recipe.stapo.main_stapo model_preset=tiny algo=stapo`` for 2 steps without checkpoints, the
whole recipe (driver, Ray, every worker). Pairs run in the order kept, hidden, hidden, kept, ... (so neither side
always goes first on a machine that warms up). For each run: the seconds from the command to verl's first step line
and to its exit, the load average before it, and every logged value but the machine's (time, throughput, memory),
to show that hiding vLLM changes no number the run computes; and the CPU seconds of the run's whole process tree
(driver, Ray's own processes, every worker: each process's CPU time at the last half-second sample it was seen
alive, so slightly less than the truth) with the Ray workers still idle at the end (started, never used). Needs
vLLM installed (the CPU set-up has it) to measure anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.testbed_timings import logged_values
from stapo.runs.process import process_tree, run_recipe_process

FLAG = "STAPO_HIDE_VLLM"
OVERRIDES = ["model_preset=tiny", "algo=stapo", "trainer.total_training_steps=2", "trainer.save_freq=-1",
             "trainer.logger=[console]"]
SIDES = {"kept": "0", "hidden": "1"}


def side_settings(side: str, before_tree: Path | None, as_user: bool = False) -> tuple[dict[str, str], Path | None]:
    """The environment and working folder of a run on ``side``."""
    if before_tree is None:
        return {FLAG: SIDES[side]}, None
    env = {} if as_user else {FLAG: "1"}
    if side == "after":
        return env, None
    return {**env, "PYTHONPATH": f"{before_tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}, before_tree


class TreeCPU:
    """CPU seconds of a process and its descendants, sampled: each process's latest user + system time, and the
    name it had when last seen (Ray renames a worker ``ray::IDLE`` until an actor or task takes it)."""

    def __init__(self):
        self.root: int | None = None
        self.seen: dict[int, tuple[float, str]] = {}

    def sample(self) -> None:
        if self.root is None:
            return
        for proc in process_tree(self.root):
            try:
                times, name = proc.cpu_times(), " ".join(proc.cmdline())[:60] or proc.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            self.seen[proc.pid] = (times.user + times.system, name)

    def totals(self) -> dict:
        return {"cpu_s": round(sum(cpu for cpu, _ in self.seen.values()), 1), "processes": len(self.seen),
                "idle_workers": sum(name.startswith("ray::IDLE") for _, name in self.seen.values())}


def one_run(side: str, before_tree: Path | None = None, as_user: bool = False) -> dict:
    """One run of the recipe on ``side`` ("kept"/"hidden", or "before"/"after"); its timings and logged values."""
    lines: list[str] = []
    first_step: list[float] = []
    tree = TreeCPU()
    load = os.getloadavg()[0]
    started = time.monotonic()

    def keep(line: str, proc) -> None:
        tree.root = proc.pid
        lines.append(line)
        if not first_step and "step:1 - " in line:
            first_step.append(time.monotonic() - started)

    with tempfile.TemporaryDirectory(prefix="startup-") as folder:
        env, cwd = side_settings(side, before_tree, as_user)
        run = run_recipe_process([*OVERRIDES, f"trainer.default_local_dir={folder}/ckpt"], on_line=keep,
                                 on_tick=lambda _elapsed: tree.sample(), timeout=900, env=env, cwd=cwd)
    log = "".join(lines)
    return {
        "side": side,
        "rc": run.returncode,
        "load_before": round(load, 2),
        "first_step_s": round(first_step[0], 1) if first_step else None,
        "wall_s": round(run.seconds, 1),
        "hidden_in_runtime_env": f"'{FLAG}': '1'" in log,
        **tree.totals(),
        "logged": logged_values(log),
    }


def summary(runs: list[dict], sides: tuple[str, str] = tuple(SIDES)) -> dict:
    out = {}
    for side in sides:
        mine = [run for run in runs if run["side"] == side]
        keys = ("first_step_s", "wall_s", "load_before", "cpu_s", "idle_workers")
        out[side] = {key: [run[key] for run in mine] for key in keys if key in mine[0]}  # older records: no cpu_s
        out[side]["median_wall_s"] = statistics.median(run["wall_s"] for run in mine)
    logged = [json.dumps(run["logged"], sort_keys=True) for run in runs]
    out["identical_logged_values"] = len(set(logged)) == 1
    out["logged_values_a_run"] = sum(len(step) for step in runs[0]["logged"].values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="pairs of runs (one kept, one hidden), 1 or more")
    parser.add_argument("--before-tree", type=Path, help="a checkout of an earlier commit: its code against this one")
    parser.add_argument("--as-user", action="store_true",
                        help=f"with --before-tree: no {FLAG} in the runs' environment, as a user runs the recipe")
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    args = parser.parse_args()
    if args.as_user and args.before_tree is None:
        parser.error("--as-user compares two checkouts: it needs --before-tree")
    if args.pairs < 1:
        parser.error(f"--pairs must be 1 or more, got {args.pairs}")
    if args.before_tree is not None and not (args.before_tree / "recipe" / "stapo" / "main_stapo.py").is_file():
        parser.error(f"--before-tree {args.before_tree}: no recipe/stapo/main_stapo.py, not a checkout of this project")
    sides = tuple(SIDES) if args.before_tree is None else ("before", "after")
    order = [sides if pair % 2 == 0 else sides[::-1] for pair in range(args.pairs)]
    runs = []
    for side in (side for pair in order for side in pair):
        runs.append(one_run(side, args.before_tree, args.as_user))
        run = runs[-1]
        print(f"[startup] {side}: rc {run['rc']}, first step {run['first_step_s']} s, exit {run['wall_s']} s, "
              f"{run['cpu_s']} s CPU in {run['processes']} processes, {run['idle_workers']} idle "
              f"(load {run['load_before']})", flush=True)
    command = f"python -m benchmarks.startup --pairs {args.pairs}"
    if args.before_tree is not None:
        command += f" --before-tree {args.before_tree}" + (" --as-user" if args.as_user else "")
    result = {"command": command, "overrides": OVERRIDES, "runs": runs, "summary": summary(runs, sides)}
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
