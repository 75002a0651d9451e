"""Every bench algorithm runs one real step of the tiny trainer (Ray + FSDP2/gloo + rollout + reward + update).

TRL-style smoke check per algorithm: the run exits cleanly, the policy loss is finite, the gradient
is non-zero and the saved weights differ from the initial ones. One step, the smallest batch
(2 prompts x 4 responses, one mini-batch): the cost is mostly Ray and worker start-up.
No mock: only the GPU is absent (the project's CPU back-end).
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from tests.bench.test_algo_presets import BENCH_ALGOS
from tests.e2e.cpu_runs import run_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SMALLEST = [
    "trainer.total_training_steps=1",
    "trainer.save_freq=1",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
]


def weights_changed(ckpt_dir, initial_path: str) -> int:
    """How many tensors of the step-1 checkpoint differ from the initial model (world size 1: whole tensors)."""
    from transformers import AutoModelForCausalLM

    saved = torch.load(ckpt_dir / "global_step_1" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    initial = AutoModelForCausalLM.from_pretrained(initial_path).state_dict()
    changed = 0
    for name, value in saved.items():
        local = getattr(value, "_local_tensor", value)
        changed += int(not torch.equal(local, initial[name][: local.shape[0]].to(local.dtype)))
    return changed


@pytest.mark.parametrize("algo", BENCH_ALGOS)
def test_one_step_of_every_algorithm(tmp_path, algo):
    from stapo.models.tiny import build_tiny_model

    overrides = [f"algo={algo}", *SMALLEST]
    started = time.time()
    run = run_recipe(overrides, tmp_path / "ckpt", timeout=800)
    tail = run.log[-6000:]
    assert run.returncode == 0, tail
    assert sorted(run.steps) == [1], tail
    metrics = run.steps[1]
    assert math.isfinite(metrics["actor/pg_loss"]), metrics
    assert metrics["actor/grad_norm"] > 0, metrics
    assert "actor/stapo/mask_ratio" not in metrics  # token_mask none: nothing folded
    assert weights_changed(tmp_path / "ckpt", build_tiny_model()) > 0
    print(f"[bench] {algo}: one step in {time.time() - started:.0f} s (peak RSS {run.peak_rss_bytes / 2**30:.2f} GiB)")
