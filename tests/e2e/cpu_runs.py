"""Running the real recipe (``python -m recipe.stapo.main_stapo``) as a subprocess, on the CPU.

Everything is real: Ray on loopback, verl's v1 trainer and TaskRunner, FSDP2 over gloo, the HF
rollout server, the reference worker, the reward, the STAPO update. Only the GPU is absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
_METRIC = re.compile(r"(\S+):(-?[0-9.]+(?:e[-+]?\d+)?|nan|inf)")


@dataclass
class Run:
    returncode: int
    log: str
    seconds: float
    peak_rss_bytes: int
    steps: dict[int, dict[str, float]] = field(default_factory=dict)


def parse_steps(log: str) -> dict[int, dict[str, float]]:
    """verl's console logger prints one ``step:N - key:value - ...`` line per step."""
    steps = {}
    for line in log.splitlines():
        match = re.search(r"step:(\d+) - (.*)", line)
        if not match:
            continue
        steps[int(match.group(1))] = {k: float(v) for k, v in _METRIC.findall(match.group(2))}
    return steps


def _tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_recipe(overrides: list[str], ckpt_dir: Path, timeout: int = 600) -> Run:
    """Run main_stapo with the tiny preset; returns its log, parsed step metrics and peak memory."""
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
    env = dict(os.environ, HYDRA_FULL_ERROR="1", RAY_DEDUP_LOGS="0", WANDB_MODE="offline")
    started = time.time()
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        log, _ = proc.communicate()
        log += f"\n[test] killed after {timeout} s"
    finally:
        done.set()
        sampler.join()
        try:  # whatever of this run's own session outlived the driver (a stray raylet): stop it
            os.killpg(proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return Run(proc.returncode, log, time.time() - started, peak[0], parse_steps(log))
