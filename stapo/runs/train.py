"""One training run of the demo (and of ``stapo sweep``): the real recipe as a child process.

The child's whole output goes to ``trainer.log`` in the run folder (flushed line by line, so a
killed run keeps it); the console shows one progress line per step, a heartbeat while a step is
running, and the held-out accuracy when validation reports it. The progress lines follow the run's
``metrics.jsonl`` (verl's file logger, one unbuffered write per step), not the console: the trainer
prints from a Ray actor, and Ray forwards an actor's lines asynchronously, so the last step's line
can be lost when the job shuts down (seen on a loaded 2-core machine); the file is the record.
Peak memory covers the child's whole process tree (Ray workers included). The child runs in the
run folder: the recipe is an installed package, so no checkout is needed.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import stapo
from stapo.rundir import METRICS_NAME, parse_metric_lines
from stapo.runs.process import recipe_command, run_recipe_process
from stapo.runs.progress import Progress, SweepClock, format_duration

HEARTBEAT_S = 60.0


def repo_root() -> Path:
    """The checkout this package runs from, for what only a checkout has (``launch/`` scripts).

    The recipe and its configs do not need it (they are installed); ``stapo sweep --launcher ray``
    submits through ``launch/ray/submit.sh``.
    """
    root = Path(stapo.__file__).resolve().parents[1]
    if not (root / "launch").is_dir():
        raise SystemExit(
            f"{root} is not a checkout of this project (no launch/ folder): the Ray launch scripts come "
            "with the source tree; install it with `pip install -e .` from a checkout"
        )
    return root


class MetricsFollower:
    """The steps a run appends to ``metrics.jsonl``, read as they are written.

    A non-empty file there at the start belongs to an earlier run in the same folder: the recipe
    moves it aside (``rundir.rotate_metrics``) before verl's logger creates a new one, so the
    follower waits for a file with another inode and reads only complete lines of it.
    """

    def __init__(self, run_dir: Path):
        self.path = run_dir / METRICS_NAME
        self.stale_inode = _inode(self.path, non_empty=True)
        self.inode: int | None = None
        self.offset = 0
        self.lock = threading.Lock()  # polled from the sampler thread and, at the end, the caller's

    def new_steps(self) -> list[tuple[int, dict[str, float]]]:
        with self.lock:
            inode = _inode(self.path)
            if inode is None or inode == self.stale_inode:
                return []
            if inode != self.inode:
                self.inode, self.offset = inode, 0
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offset += len(complete)
        return parse_metric_lines(complete.decode("utf-8", errors="replace"))


def _inode(path: Path, non_empty: bool = False) -> int | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_ino if stat.st_size or not non_empty else None


@dataclass
class TrainResult:
    returncode: int
    seconds: float
    peak_rss_bytes: int
    steps: dict[int, dict[str, float]]
    log_path: Path


def say(line: str) -> None:
    """One line in one write: runs side by side (``stapo sweep --max-parallel``) print from threads of one
    process, and print's separate write of the newline let two lines splice."""
    print(line + "\n", end="", flush=True)


def progress_plan(config) -> tuple[int, int]:
    """(steps, ``trainer.test_freq``) of a composed config, for its progress lines: the steps it will train (0 when
    the data's rows are not known here) and how often it validates."""
    from omegaconf import OmegaConf

    from stapo.input_checks import planned_steps

    steps = planned_steps(config)
    return steps or 0, int(OmegaConf.select(config, "trainer.test_freq", default=-1) or 0)


def run_trainer(overrides: list[str], run_dir: Path, total_steps: int, label: str, echo: bool = False, *,
                test_freq: int = 0, sweep: SweepClock | None = None, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> TrainResult:
    """Run ``main_stapo`` with ``overrides``; stream progress; return when it exits.

    ``test_freq``: the run's ``trainer.test_freq``, for an ETA that counts its validations; ``sweep``: the sweep's
    clock, for its overall ETA on each line; ``cwd``: where the recipe runs (default the run folder; ``stapo
    train`` keeps the caller's, so relative paths in the overrides mean what they say); ``env``: added to the
    child's environment."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "trainer.log"
    progress = Progress(total_steps, label, test_freq=test_freq)
    if sweep is not None:
        sweep.start(progress)
    follower = MetricsFollower(run_dir)
    steps: dict[int, dict[str, float]] = {}
    last_output = [time.monotonic()]

    def report_new_steps() -> None:
        for step, metrics in follower.new_steps():
            steps.setdefault(step, {}).update(metrics)
            say(progress.line(step, metrics))
            last_output[0] = time.monotonic()

    with log_path.open("a", encoding="utf-8") as log:
        log.write("$ " + " ".join(recipe_command(overrides)) + "\n")
        log.flush()

        def on_line(line: str, _proc) -> None:
            log.write(line)
            log.flush()
            if echo:
                print(line, end="", flush=True)

        def on_tick(elapsed: float) -> None:
            report_new_steps()
            if time.monotonic() - last_output[0] >= HEARTBEAT_S:
                doing = f"step {max(steps) + 1}" if steps else "start-up and validation before training"
                say(f"[{label}] ... {doing} running, {format_duration(elapsed)} elapsed")
                last_output[0] = time.monotonic()

        try:
            run = run_recipe_process(overrides, on_line=on_line, on_tick=on_tick, cwd=cwd or run_dir, env=env)
        except KeyboardInterrupt:
            print(f"\n[{label}] interrupted: the trainer was stopped (checkpoints so far are kept)", flush=True)
            raise
    report_new_steps()  # the lines written after the last tick
    if sweep is not None:
        sweep.finish(progress, run.seconds)
    return TrainResult(run.returncode, run.seconds, run.peak_rss_bytes, steps, log_path)
