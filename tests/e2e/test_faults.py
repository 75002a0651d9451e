"""Faults tried on purpose against the real trainer on CPU: a SIGKILLed run resumes, a killed worker fails fast.

The trainer runs for real (Ray on loopback, verl's v1 trainer, FSDP2 over gloo, the HF rollout);
faults are injected from outside, as an OOM killer or a lost node would: SIGKILL, no clean-up.
"""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from stapo.rundir import metric_segments, read_metrics
from tests.e2e.cpu_runs import run_recipe
from tests.e2e.shared_runs import STAPO as SHARED_STAPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def _prompts_per_step(rollout_dir) -> dict[int, list[str]]:
    """verl's rollout dump: ``<step>.jsonl`` with each sample's prompt text; sorted per step."""
    steps = {}
    for path in rollout_dir.glob("*.jsonl"):
        # split on "\n" only: generated text may hold U+2028 and other characters splitlines() breaks on
        rows = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
        steps[int(path.stem)] = sorted(row["input"] for row in rows)
    return steps


def _kill_at_step(step: int, signal_number: int = signal.SIGKILL):
    """An ``on_line`` callback that kills the driver's whole session when ``step`` is logged."""

    def on_line(line, proc):
        if f"step:{step} -" in line and proc.poll() is None:
            os.killpg(proc.pid, signal_number)

    return on_line


@pytest.mark.timeout(2400)  # up to three runs: the shared reference (if no test ran it before), killed, resumed
def test_sigkilled_run_resumes_from_its_checkpoint_with_the_same_data_order(stapo_run, tmp_path):
    # the reference is the suite's shared STAPO run (tests/e2e/shared_runs.py): this very configuration
    # (4 steps, a checkpoint every 2, run folder, rollout dump), never interrupted
    reference = stapo_run.run
    assert reference.returncode == 0, reference.log[-4000:]
    expected = _prompts_per_step(stapo_run.rollouts)
    assert sorted(expected) == [1, 2, 3, 4]

    ckpt, run_dir, rollouts = tmp_path / "ckpt", tmp_path / "run", tmp_path / "rollouts"
    overrides = [*SHARED_STAPO, f"stapo.run_dir={run_dir}", f"trainer.rollout_data_dir={rollouts}"]
    killed = run_recipe(overrides, ckpt, on_line=_kill_at_step(3))
    assert killed.returncode == -signal.SIGKILL, killed.log[-4000:]
    assert sorted(killed.steps) == [1, 2, 3]
    # save_freq=2: the last checkpoint is step 2, so step 3 is the one step lost to the kill
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"

    resumed = run_recipe(overrides + ["trainer.resume_mode=auto"], ckpt)
    assert resumed.returncode == 0, resumed.log[-4000:]
    assert sorted(resumed.steps) == [3, 4]  # step 3 again (after the checkpoint), nothing before it
    assert "global_step_2" in resumed.log  # loaded from the step-2 checkpoint
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    # the same prompts at every step as the run that was never interrupted (data order restored)
    assert _prompts_per_step(rollouts) == expected
    # nothing lost from the run folder: both segments are kept and merge into steps 1..4
    assert [p.name for p in metric_segments(run_dir)] == ["metrics.prev-1.jsonl", "metrics.jsonl"]
    merged = read_metrics(run_dir)
    assert sorted(merged) == [1, 2, 3, 4]
    assert merged[3]["actor/pg_loss"] == resumed.steps[3]["actor/pg_loss"]  # the repeated step's later values
    assert merged[1]["actor/pg_loss"] == killed.steps[1]["actor/pg_loss"]


def _kill_actor_worker_at_step(step: int, killed: list):
    """SIGKILL the FSDP actor worker (``ray::WorkerDict``) once ``step`` is logged, as an OOM kill would."""

    def on_line(line, proc):
        if killed or f"step:{step} -" not in line:
            return
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "ray::WorkerDict" in " ".join(child.cmdline()):
                    child.send_signal(signal.SIGKILL)
                    killed.append((child.pid, time.monotonic()))
                    return
            except psutil.NoSuchProcess:
                continue

    return on_line


def test_a_killed_actor_worker_fails_the_job_with_a_clear_error_instead_of_hanging(tmp_path):
    killed: list = []
    run = run_recipe(
        ["algo=stapo", "trainer.total_training_steps=20", "trainer.save_freq=-1"],
        tmp_path / "ckpt",
        timeout=600,
        on_line=_kill_actor_worker_at_step(1, killed),
    )
    assert killed, "no ray::WorkerDict process found to kill\n" + run.log[-3000:]
    seconds_to_fail = time.monotonic() - killed[0][1]
    print(f"[e2e] the job failed {seconds_to_fail:.0f} s after its actor worker was killed")
    assert seconds_to_fail < 300
    assert "[test] killed after" not in run.log, "the job hung after its worker died"
    assert run.returncode not in (0, None), run.log[-3000:]
    assert max(run.steps) < 20
    assert "ActorDiedError" in run.log or "actor died" in run.log.lower(), run.log[-3000:]
