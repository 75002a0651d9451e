"""Stopping a parallel `stapo sweep` from outside stops the runs in flight, as a user at a terminal or a scheduler
expects.

Each trainer runs in a session of its own (stapo/runs/process.py), so neither a Ctrl-C at the terminal nor a
scheduler's SIGTERM to the sweep reaches it: the sweep has to stop its runs itself. With ``--max-parallel 2`` the
runs are watched by worker threads and the interrupt lands in the main thread; before stop_running_children the
sweep then waited for both runs to train to their last step and left a traceback (and a SIGTERM killed the sweep
alone, leaving both trainers running with nobody reading their output). Real parts: the `stapo` command in its own
process, with Python's own Ctrl-C handling, and two tiny trainers that have started Ray on loopback.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stapo.runs.process import process_tree
from stapo.sweep.cli import is_finished

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO_ROOT = Path(__file__).resolve().parents[2]
# long enough that a run cannot end before it is stopped; nothing validated or saved
COMMON = [
    "model_preset=tiny",
    "trainer.total_training_steps=100",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
]
# the sweep as a terminal runs it: SIGINT raises KeyboardInterrupt (a test runner's worker may ignore SIGINT, and
# an ignored signal stays ignored across exec)
ENTRY = "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); " \
        "from stapo.cli import main; raise SystemExit(main(sys.argv[1:]))"


def trainers_with_ray(sweep: psutil.Process) -> list[psutil.Process]:
    """The sweep's trainer processes, once each has a Ray raylet running under it."""
    found = []
    for child in sweep.children(recursive=True):
        try:
            if "recipe.stapo.main_stapo" in " ".join(child.cmdline()) and any(
                "raylet" in grandchild.name() for grandchild in child.children(recursive=True)
            ):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def running(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_a_parallel_sweep_stops_every_run_in_flight_and_keeps_them_resumable(tmp_path, sig):
    command = [sys.executable, "-c", ENTRY, "sweep", "--no-check", "--max-parallel", "2", "--grid", "algo=justrl,grpo",
               "--seeds", "1", "--out", str(tmp_path), "--", *COMMON]
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        sweep = psutil.Process(proc.pid)
        deadline = time.monotonic() + 600
        while len(trainers := trainers_with_ray(sweep)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "both trainers never started Ray"
            time.sleep(1)
        tree = [process for trainer in trainers for process in process_tree(trainer.pid)]
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=180)  # the runs have 100 steps: only stopping them ends it this soon
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert "[sweep] interrupted: stopped the 2 run(s) in flight" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    deadline = time.monotonic() + 30
    while running(tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not running(tree), [(p.pid, p.name()) for p in running(tree)]
    for cell in ("algo-justrl", "algo-grpo"):  # left unfinished: the same command runs them again
        assert not is_finished(tmp_path / "runs" / cell / "seed-1")
