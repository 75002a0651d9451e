"""Faults tried on purpose against the real trainer on CPU: a killed actor worker fails the job fast.

The trainer runs for real (Ray on loopback, verl's v1 trainer, FSDP2 over gloo, the HF rollout); the
fault is injected from outside, as an OOM killer would: SIGKILL, no clean-up. A whole run SIGKILLed and
resumed from its checkpoint is tests/e2e/test_vllm_rollout.py's (on verl's vLLM rollout, as a GPU job runs).

The run is also the suite's one step of a loss of verl's own registry (tests/bench/test_algos_train.py says
why one is needed): a trainer run costs about two minutes of the suite, and the step is complete, checkpoint
included, before the kill (verl saves a step's checkpoint before it logs the step).
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.bench.test_algo_presets import BENCH_ALGOS, PAPER_VALUES
from tests.bench.test_algos_train import SMALLEST, VERL_LOSS_ALGO, assert_trained, weights_changed
from tests.e2e.cpu_runs import run_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


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
    """verl's gspo loss (sequence-level aggregation, token_mask none) on the smallest batch, a checkpoint every
    step; the FSDP actor worker is killed once step 1 is logged."""
    from stapo.models.tiny import build_tiny_model

    assert VERL_LOSS_ALGO in BENCH_ALGOS
    assert PAPER_VALUES[VERL_LOSS_ALGO]["actor_rollout_ref.actor.policy_loss.loss_mode"] != "masked_clip"
    killed: list = []
    run = run_recipe(
        # the last of two values wins (Hydra): 20 steps, so the job is still running when its worker dies
        [f"algo={VERL_LOSS_ALGO}", *SMALLEST, "trainer.total_training_steps=20"],
        tmp_path / "ckpt",
        timeout=600,
        on_line=_kill_actor_worker_at_step(1, killed),
    )
    # step 1, before the kill: verl's registered loss trained (finite loss, a gradient, new weights saved)
    assert 1 in run.steps, run.log[-6000:]
    metrics = run.steps[1]
    assert_trained([metrics])
    assert "actor/stapo/mask_ratio" not in metrics  # token_mask none: nothing folded
    assert weights_changed(tmp_path / "ckpt", build_tiny_model()) > 0
    # then the fault
    assert killed, "no ray::WorkerDict process found to kill\n" + run.log[-3000:]
    seconds_to_fail = time.monotonic() - killed[0][1]
    print(f"[e2e] the job failed {seconds_to_fail:.0f} s after its actor worker was killed")
    assert seconds_to_fail < 300
    assert "[test] killed after" not in run.log, "the job hung after its worker died"
    assert run.returncode not in (0, None), run.log[-3000:]
    assert max(run.steps) < 20
    assert "ActorDiedError" in run.log or "actor died" in run.log.lower(), run.log[-3000:]
