"""Running the real recipe (``python -m recipe.stapo.main_stapo``) as a subprocess, on the CPU.

Everything is real: Ray on loopback, verl's v1 trainer and TaskRunner, FSDP2 over gloo, the HF
rollout server, the reference worker, the reward, the STAPO update. Only the GPU is absent. The
child process is run and watched by ``stapo.runs.process`` (the demo's runner).

A run starts its own one-node Ray (as a user's does), or joins the Ray head this pytest process
started for its runs (``cluster=session_ray()``, what ``tests/e2e/shared_runs.launch`` does), as a
job on a cluster joins it (verl's ``run_ppo`` calls ``ray.init`` with ``RAY_ADDRESS`` set). Joining
saves Ray's own start and its daemons, about a sixth of a tiny run's CPU (docs/testing.md, "Where a
launch's time goes"), and changes no number: a joined run logs every value an own-Ray run logs, bit
for bit. Each run is a job of its own (its own namespace and runtime env, so its env vars; its
workers and actors end with its driver), one after another on a pytest worker. A test that kills the
run's processes from outside (``ray::WorkerDict`` among the driver's children, the driver's process
group) keeps its own Ray.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from stapo.rundir import METRICS_NAME, parse_metric_lines
from stapo.runs.process import EVERY_TICK_FOR_S, MEMORY_SAMPLE_S, process_tree_rss, run_recipe_process
from stapo.runs.progress import parse_steps

REPO = Path(__file__).resolve().parents[2]
# the session head's resources: the tiny preset's num_cpus, and logical GPU slots for the widest run that joins
# (two FSDP ranks: as many as an own Ray of that run has, so the ranks get the same slots); a run asking for more is
# refused by the driver's cluster check, naming both numbers
HEAD_CPUS, HEAD_GPUS = 16, 2
# what a joining driver must not pass to ray.init (Ray refuses resources for a cluster it joins)
JOIN = ["~ray_kwargs.ray_init.num_cpus", "~ray_kwargs.ray_init.num_gpus", "~ray_kwargs.ray_init.include_dashboard"]
# as the CPU back-end's driver sets for its own Ray (docs/benchmarks-history.md, "idle workers"); token
# authentication off, as the recipe's CPU driver runs its loopback Ray
HEAD_ENV = {"RAY_prestart_worker_first_driver": "0", "RAY_AUTH_MODE": "disabled"}


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class SessionRay:
    """A one-node Ray head started with ``ray start`` for this pytest process's runs, in a temp dir of its own (where
    ``ray start`` also writes its address: a ``ray.init()`` without an address elsewhere never finds it)."""

    root: Path
    address: str

    def processes(self) -> list[psutil.Process]:
        """The head's processes (they name its temp dir) and theirs (the jobs' workers)."""
        roots = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(str(self.root) in part for part in proc.info["cmdline"] or []):
                    roots.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        found = {proc.pid: proc for proc in roots}
        for proc in roots:
            try:
                found.update({child.pid: child for child in proc.children(recursive=True)})
            except psutil.NoSuchProcess:
                continue
        return list(found.values())

    def rss(self) -> int:
        return sum(process_tree_rss(proc.pid) for proc in self.processes() if proc.pid != os.getpid())

    def stop(self, grace_s: float = 3.0) -> None:
        """Only this head's processes are signalled (never `ray stop`: other Rays run on the machine)."""
        procs = self.processes()
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        shutil.rmtree(self.root, ignore_errors=True)


_session_ray: SessionRay | None = None


def session_ray() -> SessionRay:
    """This process's Ray head, started on first use (about as long as one run's own Ray start) and stopped at the
    end of the session (``stop_session_ray``, from tests/e2e/shared_runs.py's ``pytest_sessionfinish``)."""
    global _session_ray
    if _session_ray is not None:
        return _session_ray
    root = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths are limited
    env = dict(os.environ, **HEAD_ENV)
    env.pop("RAY_ADDRESS", None)
    for attempt in range(3):  # a port taken between the look-up and Ray's bind: new ports
        port, agent, metrics = _free_ports(3)
        done = subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
             f"--temp-dir={root}", f"--num-cpus={HEAD_CPUS}", f"--num-gpus={HEAD_GPUS}", "--include-dashboard=false",
             f"--dashboard-agent-listen-port={agent}", f"--metrics-export-port={metrics}", "--disable-usage-stats"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode == 0:
            _session_ray = SessionRay(root, f"127.0.0.1:{port}")
            atexit.register(stop_session_ray)
            return _session_ray
        SessionRay(root, "").stop(grace_s=5)
        root.mkdir()
        time.sleep(1 + attempt)
    raise RuntimeError(f"ray start --head failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def stop_session_ray() -> None:
    global _session_ray
    if _session_ray is not None:
        _session_ray.stop()
        _session_ray = None


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
    cluster: SessionRay | None = None,
) -> Run:
    """Run main_stapo with the tiny preset; returns its log, parsed step metrics and peak memory.

    ``on_line(line, proc)`` sees every output line as it comes (fault tests kill processes from it).
    ``cluster``: join that Ray head (``session_ray()``) instead of starting one; the peak memory then adds the
    head's processes (the run's workers among them) to the driver's, as an own Ray's are in the driver's tree.
    """
    ray_tmp = None if cluster is not None else tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: socket paths
    args = ["model_preset=tiny", f"trainer.default_local_dir={ckpt_dir}",
            *(JOIN if cluster is not None else [f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"])]
    env = {"WANDB_MODE": "offline", **({"RAY_ADDRESS": cluster.address} if cluster is not None else {})}
    lines: list[str] = []
    driver: list[int] = []
    peak, next_sample = [0], [0.0]

    def keep(line: str, proc: subprocess.Popen) -> None:
        if not driver:
            driver.append(proc.pid)
        lines.append(line)
        if on_line is not None:
            on_line(line, proc)

    def tick(elapsed: float) -> None:  # the runner's memory schedule, over the driver and the joined head
        if cluster is None or not driver or elapsed < next_sample[0]:
            return
        peak[0] = max(peak[0], process_tree_rss(driver[0]) + cluster.rss())
        next_sample[0] = elapsed + (MEMORY_SAMPLE_S if elapsed > EVERY_TICK_FOR_S else 0.0)

    try:
        run = run_recipe_process([*args, *overrides], on_line=keep, on_tick=tick, timeout=timeout, env=env, cwd=REPO)
    finally:
        if ray_tmp is not None:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    if run.timed_out:
        lines.append(f"\n[test] killed after {timeout} s\n")
    log = "".join(lines)
    return Run(run.returncode, log, run.seconds, max(run.peak_rss_bytes, peak[0]), logged_steps(log, overrides))


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
