"""Running the real recipe (``python -m recipe.stapo.main_stapo``) as a subprocess, on the CPU.

Everything is real: Ray on loopback, verl's v1 trainer and TaskRunner, FSDP2 over gloo, the HF
rollout server, the reference worker, the reward, the STAPO update. Only the GPU is absent.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stapo.demo.progress import parse_steps
from stapo.demo.train import process_tree_rss

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    returncode: int
    log: str
    seconds: float
    peak_rss_bytes: int
    steps: dict[int, dict[str, float]] = field(default_factory=dict)


def run_recipe(
    overrides: list[str], ckpt_dir: Path, timeout: int = 600, on_line: Callable[[str, subprocess.Popen], None] | None = None
) -> Run:
    """Run main_stapo with the tiny preset; returns its log, parsed step metrics and peak memory.

    ``on_line(line, proc)`` sees every output line as it comes (fault tests kill processes from it).
    """
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths are limited
    args = [
        sys.executable,
        "-m",
        "recipe.stapo.main_stapo",
        "model_preset=tiny",
        f"trainer.default_local_dir={ckpt_dir}",
        f"+ray_kwargs.ray_init._temp_dir={ray_tmp}",
        *overrides,
    ]
    env = dict(os.environ, HYDRA_FULL_ERROR="1", RAY_DEDUP_LOGS="0", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    started = time.time()
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        start_new_session=True,
    )
    peak = [0]
    lines: list[str] = []
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], process_tree_rss(proc.pid))
            if time.time() - started > timeout:
                lines.append(f"\n[test] killed after {timeout} s\n")
                _kill_session(proc.pid)
                return
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line, proc)
        proc.wait()
    finally:
        done.set()
        sampler.join()
        _kill_session(proc.pid)  # whatever of this run's own session outlived the driver (a stray raylet)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    log = "".join(lines)
    return Run(proc.returncode, log, time.time() - started, peak[0], parse_steps(log))


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
