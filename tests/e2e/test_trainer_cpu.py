"""The whole STAPO loop through verl's real trainer on the CPU (Ray + FSDP2/gloo + rollout + ref + reward).

No mock: the only thing missing is a GPU, replaced by the project's CPU back-end. The STAPO, GRPO and
20-Entropy runs are the suite's shared runs (tests/e2e/shared_runs.py), which other modules read too.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from stapo.rundir import read_metrics
from tests.e2e.cpu_runs import Run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

GIB = 1 << 30


def _tail(run: Run) -> str:
    return run.log[-6000:]


def _assert_ok(run: Run, steps: list[int]) -> None:
    assert run.returncode == 0, _tail(run)
    assert sorted(run.steps) == steps, _tail(run)
    for step in steps:
        metrics = run.steps[step]
        # the rollout server got the actor's weights: its log-probs match the actor's recomputation
        assert metrics["training/rollout_probs_diff_max"] < 1e-3, metrics
        assert math.isfinite(metrics["actor/pg_loss"])


def _first_shard_changed(ckpt_dir, step: int, initial_path: str) -> bool:
    from transformers import AutoModelForCausalLM

    saved = torch.load(ckpt_dir / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    initial = AutoModelForCausalLM.from_pretrained(initial_path).state_dict()
    changed = 0
    for name, value in saved.items():
        local = getattr(value, "_local_tensor", value)
        changed += int(not torch.equal(local, initial[name][: local.shape[0]].to(local.dtype)))
    return changed > 0


def test_stapo_trains_and_checkpoints(stapo_run):
    """The shared STAPO run (tests/e2e/shared_runs.py): 4 steps, checkpoints at 2 and 4, the run folder.

    Resuming from its checkpoint is proved by tests/e2e/test_vllm_rollout.py, which SIGKILLs the same
    configuration on verl's vLLM rollout after step 3 and resumes it."""
    from stapo.models.tiny import build_tiny_model

    first, ckpt, run_dir = stapo_run.run, stapo_run.ckpt, stapo_run.run_dir
    steps = [1, 2, 3, 4]
    _assert_ok(first, steps)
    stapo_metrics = [first.steps[s] for s in steps]
    for metrics in stapo_metrics:
        for key in ("mask_ratio", "num_candidates", "num_spurious", "tau_h", "entropy_p50", "quadrant/lowp_lowh"):
            assert f"actor/stapo/{key}" in metrics, sorted(metrics)
    assert any(m["actor/stapo/num_spurious"] > 0 for m in stapo_metrics), stapo_metrics
    # the ablation grid's cell of the configured (tau_p, q) is the mask that was folded, step for step
    cell = "actor/stapo/ablation/pos/tau_p=0.002,q=0.75"
    for metrics in stapo_metrics:
        assert metrics[f"{cell}/num_silenced"] == metrics["actor/stapo/num_spurious"], metrics
        assert metrics[f"{cell}/num_candidates"] == metrics["actor/stapo/num_candidates"]
        assert metrics[f"{cell}/mask_ratio"] == metrics["actor/stapo/mask_ratio"]
        assert "actor/stapo/ablation/neg/tau_p=0.01,q=1/num_candidates" in metrics
        # STAPO aggregates token-mean, so verl's own actor/entropy (its aggregate of the same old-pass
        # entropies) is the driver's mean of a response token's entropy, up to the order of summation
        assert metrics["actor/stapo/entropy_token_mean"] == pytest.approx(metrics["actor/entropy"], rel=1e-5)
        # the tail metrics: the largest position's entropy, and the silenced tokens' exact-norm share from the
        # CPU rollout's collision probabilities (the tiny model names no unused ids: no tail/unused_* metrics)
        assert metrics["actor/stapo/entropy_max"] >= metrics["actor/stapo/entropy_p95"]
        assert 0 <= metrics["actor/stapo/grad_norm_share_spurious"] <= 1
        assert (metrics["actor/stapo/grad_norm_share_spurious"] > 0) == (metrics["actor/stapo/num_spurious"] > 0)
        assert not any(key.startswith("actor/stapo/tail/") for key in metrics)
    samples = [json.loads(line) for line in (run_dir / "token_samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in samples} == set(steps) and all(0 < r["prob"] <= 1 for r in samples)
    assert any(m["actor/grad_norm"] > 0 for m in stapo_metrics)
    # the run folder: every silenced token of each step logged (up to the cap), decoded, with p < tau_p
    records = [json.loads(line) for line in (run_dir / "spurious_tokens.jsonl").read_text().splitlines()]
    for step in steps:
        logged = [r for r in records if r["step"] == step]
        assert len(logged) == min(200, int(first.steps[step]["actor/stapo/num_spurious"])), step
        assert all(r["prob"] < 0.002 and isinstance(r["token"], str) for r in logged)
    assert "token_mask: stapo" in (run_dir / "config.yaml").read_text()
    assert set(read_metrics(run_dir)) == set(steps)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    # verl's sync-trainer branches: no TransferQueue snapshot in the checkpoint, gen_batch_size kept
    for step in (2, 4):
        saved = sorted(path.name for path in (ckpt / f"global_step_{step}").iterdir())
        assert "transfer_queue" not in saved, saved
    assert "gen_batch_size defaulted to 1" not in first.log
    assert _first_shard_changed(ckpt, 4, build_tiny_model())
    _assert_the_folder_records_this_run(stapo_run)
    assert first.peak_rss_bytes < 8 * GIB, f"peak RSS {first.peak_rss_bytes / GIB:.2f} GiB"
    print(f"[e2e] stapo ws=1, 4 steps: {first.seconds:.0f} s, peak RSS {first.peak_rss_bytes / GIB:.2f} GiB")


def _assert_the_folder_records_this_run(shared) -> None:
    """The trainer recorded the run at its saves, and the record is the identity ``stapo check`` works out from the
    same overrides: the run resumes as its own, the same command with another learning rate is refused."""
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.check import compose_run
    from stapo.verl_plugin.preflight.checkpoint_identity import IDENTITY_FILE, check_checkpoint_identity

    record = json.loads((shared.ckpt / IDENTITY_FILE).read_text())
    assert record["steps"] == [2, 4] and record["saving"] is None and record["earlier"] == [], record["steps"]
    again = ["model_preset=tiny", f"trainer.default_local_dir={shared.ckpt}", *shared.overrides]
    assert "saved by this run" in check_checkpoint_identity(compose_run([*again, "trainer.total_training_steps=6"]))
    with pytest.raises(STAPOConfigError, match=r"\n  actor_rollout_ref.actor.optim.lr: 0.001 -> 0.002"):
        check_checkpoint_identity(compose_run([*again, "actor_rollout_ref.actor.optim.lr=0.002"]))


def test_stapo_with_two_fsdp_ranks_over_gloo(stapo_two_ranks_run):
    """Two DP ranks, two shuffled PPO mini-batches a step, tau_h per mini-batch (the preset's paper scope):
    the driver's diagnostics rebuild the mask from verl's split and silence what the ranks folded. Lopti on
    (one run for both: a trainer run costs about two minutes): verl's update runs twice a step (low- then
    high-probability tokens), both phases report, and the warmup advances one step per training step (a
    second scheduler step per step would read 2x the lr). The suite's shared run (tests/e2e/shared_runs.py), which
    tests/e2e/test_custom_rule_runs.py compares with the same run from a rule file."""
    warmup, lr = 10, 1e-3  # the tiny preset's lr (warmup: shared_runs.STAPO_TWO_RANKS)
    assert f"actor_rollout_ref.actor.optim.lr_warmup_steps={warmup}" in stapo_two_ranks_run.overrides
    run = stapo_two_ranks_run.run
    _assert_ok(run, [1, 2])
    for step in (1, 2):
        metrics = run.steps[step]
        assert metrics["actor/stapo/threshold_scopes"] == 2
        assert metrics["actor/stapo/driver_mask_diff"] == 0, metrics
        assert metrics["actor/lr"] == pytest.approx(lr * step / warmup, rel=1e-6), metrics
        low, high = metrics["actor/stapo/lopti/low_tokens"], metrics["actor/stapo/lopti/high_tokens"]
        assert low > 0 and high > 0, metrics
        assert low + high == metrics["actor/stapo/num_response_tokens"] - metrics["actor/stapo/num_spurious"]
        for phase in ("low", "high"):
            grad_norm = metrics[f"actor/stapo/lopti/{phase}/grad_norm"]
            assert math.isfinite(grad_norm) and grad_norm > 0, metrics
        # the folded mask reached the token count verl divides by, summed over the mini-batches
        assert metrics["actor/stapo/loss_tokens"] == metrics["actor/stapo/num_response_tokens"] - metrics[
            "actor/stapo/num_spurious"
        ], metrics
        assert metrics["actor/stapo/mask_ratio"] == metrics["actor/stapo/num_spurious"] / metrics[
            "actor/stapo/num_response_tokens"
        ]
        assert metrics["actor/stapo/num_candidates"] == 0 or math.isfinite(metrics["actor/stapo/tau_h"]), metrics
    assert any(run.steps[s]["actor/stapo/num_spurious"] > 0 for s in (1, 2))
    print(f"[e2e] stapo ws=2: {run.seconds:.0f} s, peak RSS {run.peak_rss_bytes / GIB:.2f} GiB")


@pytest.mark.parametrize(
    "shared, expected_key",
    # justrl (stapo's recipe with token_mask=none) is run by tests/bench/test_sweep_e2e.py; its only differences
    # from grpo are config values that tests/e2e/test_compose.py checks; one more trainer run costs ~100 s
    [("grpo_run", "actor/kl_loss"), ("entropy20_run", "actor/stapo/keep_ratio")],
)
def test_baselines_run_through_the_same_trainer(request, shared, expected_key):
    """The shared grpo and entropy20 runs (tests/e2e/shared_runs.py). The grpo run starts without the
    preset's STAPO_CPU_BACKEND: trainer.device=cpu on a machine without CUDA is enough, the driver
    switches the back-end on and hands the flag to the workers."""
    assert not torch.cuda.is_available()
    shared_run = request.getfixturevalue(shared)
    if shared == "grpo_run":
        assert "~ray_kwargs.ray_init.runtime_env.env_vars.STAPO_CPU_BACKEND" in shared_run.overrides
    run = shared_run.run
    _assert_ok(run, [1, 2])
    assert all(expected_key in run.steps[s] for s in (1, 2)), sorted(run.steps[1])
    if shared == "entropy20_run":
        assert 0.15 < run.steps[1]["actor/stapo/keep_ratio"] < 0.3
    else:
        assert "actor/stapo/mask_ratio" not in run.steps[1]
