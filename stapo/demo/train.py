"""One training run of the demo: verl's real trainer (``recipe.stapo.main_stapo``) as a child process.

The child's whole output goes to ``trainer.log`` in the run folder (flushed line by line, so a
killed run keeps it); the console shows one progress line per step, a heartbeat while a step is
running, and the held-out accuracy when validation reports it. Peak memory is sampled over the
child's whole process tree (Ray workers included).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

import stapo
from stapo.demo.progress import Progress, format_duration, parse_step_line

HEARTBEAT_S = 60.0


def repo_root() -> Path:
    """The checkout holding ``recipe/`` and ``conf/`` (the package is installed editable from it)."""
    root = Path(stapo.__file__).resolve().parents[1]
    if not (root / "recipe" / "stapo" / "main_stapo.py").exists():
        raise SystemExit(
            f"stapo demo: the recipe is not next to the installed package ({root}): "
            "run it from a checkout installed with `pip install -e .` (as `make demo` does) or from the Docker image"
        )
    return root


def process_tree_rss(pid: int) -> int:
    """Memory of a process and all its descendants, in bytes (0 once it is gone).

    Proportional set size where the OS reports it (pages shared between Ray's processes, such as
    the object store and the libraries, count once in total), else resident set size.
    """
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += getattr(proc.memory_full_info(), "pss", None) or proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


@dataclass
class TrainResult:
    returncode: int
    seconds: float
    peak_rss_bytes: int
    steps: dict[int, dict[str, float]]
    log_path: Path


def run_trainer(overrides: list[str], run_dir: Path, total_steps: int, label: str, echo: bool = False) -> TrainResult:
    """Run ``main_stapo`` with ``overrides``; stream progress; return when it exits."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "trainer.log"
    command = [sys.executable, "-m", "recipe.stapo.main_stapo", *overrides]
    env = dict(os.environ, HYDRA_FULL_ERROR="1", RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")
    env.setdefault("WANDB_MODE", "offline")
    progress = Progress(total_steps, label)
    steps: dict[int, dict[str, float]] = {}
    started = time.monotonic()
    last_output = [started]
    peak = [0]
    with log_path.open("a", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        proc = subprocess.Popen(
            command,
            cwd=repo_root(),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        done = threading.Event()
        monitor = threading.Thread(target=_monitor, args=(proc, done, peak, progress, steps, started, last_output))
        monitor.start()
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if echo:
                    print(line, end="", flush=True)
                parsed = parse_step_line(line)
                if parsed:
                    step, metrics = parsed
                    steps[step] = metrics
                    print(progress.line(step, metrics), flush=True)
                    last_output[0] = time.monotonic()
            proc.wait()
        except KeyboardInterrupt:
            print(f"\n[{label}] interrupted: stopping the trainer (checkpoints so far are kept)", flush=True)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            raise
        finally:
            done.set()
            monitor.join()
            _kill_leftovers(proc.pid)
    return TrainResult(proc.returncode, time.monotonic() - started, peak[0], steps, log_path)


def _monitor(proc, done, peak, progress: Progress, steps, started: float, last_output: list[float]) -> None:
    """Sample memory every half second; print a heartbeat when no step line came for a while."""
    while not done.wait(0.5):
        peak[0] = max(peak[0], process_tree_rss(proc.pid))
        now = time.monotonic()
        if now - last_output[0] >= HEARTBEAT_S:
            doing = f"step {max(steps) + 1}" if steps else "start-up and validation before training"
            print(f"[{progress.label}] ... {doing} running, {format_duration(now - started)} elapsed", flush=True)
            last_output[0] = now


def _kill_leftovers(pid: int) -> None:
    """Anything of the child's session that outlived it (a stray raylet) goes too."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
