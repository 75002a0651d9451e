"""A run SIGKILLed while it saves resumes from the checkpoint its record and verl's tracker agree on.

The trainer runs for real (Ray on loopback, verl's v1 trainer, FSDP2 over gloo, the HF rollout), a checkpoint every
step; the driver's whole process group is SIGKILLed as soon as ``stapo_run.json`` says the save of step 2 or later
is under way (the record marks the step before verl writes it), or, should no save be caught, after step 3. Either
way the folder must name, for the step verl would resume, the run that saved it, and the same command must resume
it as its own and finish.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from stapo.verl_plugin.preflight.checkpoint_identity import IDENTITY_FILE, tracker_step, unrecorded_step
from tests.e2e.cpu_runs import run_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

STEPS = 4
OVERRIDES = [
    "algo=stapo",
    f"trainer.total_training_steps={STEPS}",
    "trainer.save_freq=1",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
]


class KillWhileSaving:
    """SIGKILLs the driver's process group once the record marks the save of step 2 or later (a thread polls it:
    the log is too slow to catch a save of the tiny model), else once step 3 is logged."""

    def __init__(self, folder):
        self.folder, self.proc, self.killed = folder, None, []
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def on_line(self, line, proc):
        if self.proc is None:
            self.proc = proc
            self.thread.start()
        if "step:3 -" in line:
            self._kill("after step 3")

    def _kill(self, when: str) -> None:
        if not self.killed and self.proc.poll() is None:
            self.killed.append(when)
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _watch(self) -> None:
        while not self.killed and self.proc.poll() is None:
            try:
                saving = json.loads((self.folder / IDENTITY_FILE).read_text()).get("saving")
            except (OSError, ValueError):
                saving = None
            if (saving or 0) >= 2:
                self._kill(f"during the save of step {saving}")
            time.sleep(0.005)


def test_a_run_killed_while_it_saves_resumes_what_its_record_and_checkpoint_agree_on(tmp_path):
    ckpt = tmp_path / "ckpt"
    killer = KillWhileSaving(ckpt)
    first = run_recipe(OVERRIDES, ckpt, timeout=600, on_line=killer.on_line)
    assert killer.killed, first.log[-4000:]
    print(f"[e2e] killed {killer.killed[0]}")
    step = tracker_step(ckpt)
    assert step is not None and step < STEPS, first.log[-4000:]
    record = json.loads((ckpt / IDENTITY_FILE).read_text())
    assert unrecorded_step(record, step) is None, (step, record["steps"], record["saving"])
    resumed = run_recipe(OVERRIDES, ckpt, timeout=600)
    assert resumed.returncode == 0, resumed.log[-6000:]
    assert f"[stapo] checkpoints: resumes {ckpt}/global_step_{step}, saved by this run" in resumed.log
    assert sorted(resumed.steps) == list(range(step + 1, STEPS + 1))
    record = json.loads((ckpt / IDENTITY_FILE).read_text())
    assert record["saving"] is None and record["steps"][-1] == STEPS and record["earlier"] == []
    assert tracker_step(ckpt) == STEPS
