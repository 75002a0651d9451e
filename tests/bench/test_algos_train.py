"""The bench's objectives train through the real tiny trainer (Ray + FSDP2/gloo + rollout + reward + update).

TRL-style smoke check: the run exits cleanly, the policy loss is finite, the gradient is non-zero and
the saved weights differ from the initial ones. No mock: only the GPU is absent (the project's CPU
back-end).

End to end, only what proves the plumbing: each preset is a Hydra file over one trainer, and what
differs between presets is the loss maths, checked per preset in-process (tests/bench/
test_algo_presets.py composes every preset; tests/integration/test_preset_losses.py runs each
preset's loss). The trainer runs here cover the three ways a loss reaches verl's update:
- the masked_clip objective with the S2T mask folded into the loss: the suite's shared STAPO run;
- masked_clip with the 20-Entropy token mask: the suite's shared entropy20 run;
- one of verl's own registered losses (gspo, with its sequence-level aggregation), one step of
  the smallest batch (2 prompts x 4 responses, one mini-batch), the bench presets' token_mask none:
  the first step of tests/e2e/test_faults.py's run, whose actor worker is then killed (one trainer
  run for both).
The shared runs are in tests/e2e/shared_runs.py.
"""

from __future__ import annotations

import math

import pytest
import torch

# a shared run's time counts against the first test that asks for it
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# one bench preset whose loss is verl's own (POLICY_LOSS_REGISTRY), not the recipe's masked_clip
VERL_LOSS_ALGO = "gspo"

SMALLEST = [
    "trainer.total_training_steps=1",
    "trainer.save_freq=1",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
]


def weights_changed(ckpt_dir, initial_path: str, step: int = 1) -> int:
    """How many tensors of the step's checkpoint differ from the initial model (world size 1: whole tensors)."""
    from transformers import AutoModelForCausalLM

    saved = torch.load(ckpt_dir / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    initial = AutoModelForCausalLM.from_pretrained(initial_path).state_dict()
    changed = 0
    for name, value in saved.items():
        local = getattr(value, "_local_tensor", value)
        changed += int(not torch.equal(local, initial[name][: local.shape[0]].to(local.dtype)))
    return changed


def assert_trained(step_metrics: list[dict[str, float]]) -> None:
    for metrics in step_metrics:
        assert math.isfinite(metrics["actor/pg_loss"]), metrics
    assert any(metrics["actor/grad_norm"] > 0 for metrics in step_metrics), step_metrics


@pytest.mark.parametrize("shared, step", [("stapo_run", 4), ("entropy20_run", 2)])
def test_the_masked_objectives_train(request, shared, step):
    """The shared STAPO run (S2T mask folded) and entropy20 run (top-20% entropy mask) update the policy."""
    from stapo.models.tiny import build_tiny_model

    shared_run = request.getfixturevalue(shared)
    run = shared_run.run
    assert max(run.steps) == step, run.log[-6000:]
    assert run.returncode == 0, run.log[-6000:]
    assert_trained([run.steps[s] for s in sorted(run.steps)])
    assert weights_changed(shared_run.ckpt, build_tiny_model(), step) > 0
