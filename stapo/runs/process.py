"""The recipe (``python -m recipe.stapo.main_stapo``) as a watched child process.

One runner for everything that starts the real trainer from Python: ``stapo demo`` and ``stapo
sweep`` (progress lines, ``trainer.log``), the CPU end-to-end tests and the benchmark (captured
log, fault injection, a time limit). The child gets its own session, so whatever it starts (Ray's
raylet, workers) is killed with it; its peak memory is sampled over the whole process tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

RECIPE = "recipe.stapo.main_stapo"
# full Hydra tracebacks, every worker's lines (no Ray de-duplication), lines as they are printed
BASE_ENV = {"HYDRA_FULL_ERROR": "1", "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}
TICK_S = 0.5
# PSS reads every process's page tables (/proc/PID/smaps_rollup): one sample of a tailbed trainer's 19
# processes took 0.24 s of CPU (2026-11-26, two trainers running), so sampling every 5 s cost about 5 % of a
# core per watched run, taken from the runs themselves on 2 cores; every 15 s, under 2 %. A run's peak (model
# load, a validation of 25 s or more) needs no finer grain; a short process (a refused config, ``--cfg job``)
# is sampled every tick for its first seconds.
MEMORY_SAMPLE_S = 15.0
EVERY_TICK_FOR_S = 10.0
# what stop_running_children stops: every child of run_recipe_process still running, in any thread
_RUNNING: dict[int, subprocess.Popen] = {}
_RUNNING_LOCK = threading.Lock()


def recipe_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", RECIPE, *overrides]


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (none once it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def process_tree_rss(pid: int) -> int:
    """Memory of a process and all its descendants, in bytes (0 once it is gone).

    Proportional set size where the OS reports it (pages shared between Ray's processes, such as
    the object store and the libraries, count once in total), else resident set size.
    """
    total = 0
    for proc in process_tree(pid):
        try:
            total += getattr(proc.memory_full_info(), "pss", None) or proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


@dataclass
class ProcessRun:
    returncode: int
    seconds: float
    peak_rss_bytes: int
    timed_out: bool


def run_recipe_process(
    overrides: list[str],
    on_line: Callable[[str, subprocess.Popen], None] | None = None,
    on_tick: Callable[[float], None] | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> ProcessRun:
    """Run the recipe until it exits (or ``timeout`` seconds, then its session is killed).

    ``on_line(line, proc)`` sees every output line as it comes (stdout and stderr together);
    ``on_tick(elapsed_s)`` is called every half second from the sampler thread, which reads the tree's
    memory every ``MEMORY_SAMPLE_S``. wandb stays
    offline unless the caller's environment or ``env`` says otherwise. Ctrl-C stops the child
    with SIGTERM (so checkpoints already written stay usable) and is raised again.
    """
    environ = dict(os.environ, **BASE_ENV)
    environ.setdefault("WANDB_MODE", "offline")
    environ.update(env or {})
    started = time.monotonic()
    proc = subprocess.Popen(
        recipe_command(overrides), cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", start_new_session=True,
    )
    with _RUNNING_LOCK:
        _RUNNING[proc.pid] = proc
    peak, timed_out, done = [0], [False], threading.Event()

    def sample() -> None:
        next_memory = 0.0
        while not done.wait(TICK_S):
            elapsed = time.monotonic() - started
            if elapsed >= next_memory:
                peak[0] = max(peak[0], process_tree_rss(proc.pid))
                next_memory = elapsed + (MEMORY_SAMPLE_S if elapsed > EVERY_TICK_FOR_S else 0.0)
            if timeout is not None and elapsed > timeout:
                timed_out[0] = True
                _kill_session(proc.pid)
                return
            if on_tick is not None:
                on_tick(elapsed)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for line in proc.stdout:
            if on_line is not None:
                on_line(line, proc)
        proc.wait()
    except KeyboardInterrupt:
        _stop([proc], STOP_GRACE_S)
        raise
    finally:
        done.set()
        sampler.join()
        _kill_session(proc.pid)  # whatever of the child's session outlived it (a stray raylet)
        with _RUNNING_LOCK:
            _RUNNING.pop(proc.pid, None)
    return ProcessRun(proc.returncode, time.monotonic() - started, peak[0], timed_out[0])


# how long a trainer gets to exit on SIGTERM before its session is killed
STOP_GRACE_S = 60.0


def stop_running_children(grace_s: float = STOP_GRACE_S) -> int:
    """Stop every recipe child still running, whichever thread watches it; how many there were.

    Each child runs in a session of its own, so a Ctrl-C at the terminal (or a scheduler's SIGTERM to the caller)
    reaches only the caller, and only its main thread: ``run_recipe_process`` stops the child it watches itself
    when the interrupt lands in it, but not the children that other threads watch (``stapo sweep
    --max-parallel``). This sends each of them SIGTERM, as that path does (checkpoints already written stay
    usable), and kills the session of any still running after ``grace_s``.
    """
    with _RUNNING_LOCK:
        children = list(_RUNNING.values())
    _stop(children, grace_s)
    return len(children)


def _stop(children: list[subprocess.Popen], grace_s: float) -> None:
    for proc in children:
        _signal_session(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in children:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _kill_session(proc.pid)


def _kill_session(pid: int) -> None:
    _signal_session(pid, signal.SIGKILL)


def _signal_session(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
