"""Running the real recipe (``python -m recipe.stapo.main_stapo``) as a subprocess, on the CPU.

Everything is real: Ray on loopback, verl's v1 trainer and TaskRunner, FSDP2 over gloo, the HF
rollout server, the reference worker, the reward, the STAPO update. Only the GPU is absent. The
child process is run and watched by ``stapo.runs.process`` (the demo's runner).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stapo.rundir import METRICS_NAME, parse_metric_lines
from stapo.runs.process import run_recipe_process
from stapo.runs.progress import parse_steps

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    returncode: int
    log: str
    seconds: float
    peak_rss_bytes: int
    steps: dict[int, dict[str, float]] = field(default_factory=dict)


def run_recipe(
    overrides: list[str],
    ckpt_dir: Path,
    timeout: int = 600,
    on_line: Callable[[str, subprocess.Popen], None] | None = None,
) -> Run:
    """Run main_stapo with the tiny preset; returns its log, parsed step metrics and peak memory.

    ``on_line(line, proc)`` sees every output line as it comes (fault tests kill processes from it).
    """
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths are limited
    args = ["model_preset=tiny", f"trainer.default_local_dir={ckpt_dir}", f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"]
    lines: list[str] = []

    def keep(line: str, proc: subprocess.Popen) -> None:
        lines.append(line)
        if on_line is not None:
            on_line(line, proc)

    try:
        run = run_recipe_process([*args, *overrides], on_line=keep, timeout=timeout, env={"WANDB_MODE": "offline"},
                                 cwd=REPO)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if run.timed_out:
        lines.append(f"\n[test] killed after {timeout} s\n")
    log = "".join(lines)
    return Run(run.returncode, log, run.seconds, run.peak_rss_bytes, logged_steps(log, overrides))


def logged_steps(log: str, overrides: list[str]) -> dict[int, dict[str, float]]:
    """The console's step lines, completed from this run's ``metrics.jsonl`` when it has a run folder.

    The trainer prints from a Ray actor whose lines Ray forwards asynchronously: the last one can
    be lost when the job shuts down, while verl's file logger has written it (unbuffered). Only the
    run's own file: the segments of earlier runs in the folder (``metrics.prev-N.jsonl``) are not its steps."""
    steps = parse_steps(log)
    run_dirs = [o.split("=", 1)[1] for o in overrides if o.startswith("stapo.run_dir=")]
    current = Path(run_dirs[-1]) / METRICS_NAME if run_dirs else None
    if current is not None and current.is_file():
        for step, metrics in parse_metric_lines(current.read_text(encoding="utf-8")):
            steps.setdefault(step, metrics)
    return steps
