"""`stapo sweep` end to end on the tiny preset: 2 algorithms x 1 seed through the real trainer, side by side.

The two algorithms are JustRL and 20-Entropy told to keep every token (``entropy_top_fraction=1``,
a common override that JustRL's loss config has and ignores): two presets, two token-mask code
paths, one objective. So the sweep doubles as the paired test of the whole pipeline: runs of the two
with the same seed must agree in every logged metric, step for step and bit for bit (same rollouts
from the seeded sampler, docs/reproducibility.md; one registered loss; one trainer), and the
comparison's paired difference must be exactly zero. The two runs go at once (``--max-parallel 2``):
each run's numbers must not depend on the run beside it. The comparison table is checked against the
run folders' own metrics (recomputed here with numpy), and a second invocation skips every finished
run. One seed: the statistics over seeds are checked against hand computations without a trainer
(tests/bench/test_sweep_parts.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from stapo.rundir import read_metrics
from stapo.runs.machine import machine_kind
from tests.e2e.test_paired import compared, metric_diff

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
COMMON = [
    "model_preset=tiny",
    "actor_rollout_ref.actor.policy_loss.entropy_top_fraction=1.0",
    "trainer.total_training_steps=2",
    "trainer.save_freq=-1",
    "trainer.test_freq=2",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
]


def sweep(out, *extra):
    command = [
        sys.executable,
        "-m",
        "stapo.cli",
        "sweep",
        "--grid",
        "algo=justrl,entropy20",
        "--seeds",
        "1",
        "--out",
        str(out),
        *extra,
        "--",
        *COMMON,
    ]
    return subprocess.run(command, check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1700)


def test_sweep_two_algorithms_side_by_side(tmp_path):
    started = time.time()
    first = sweep(tmp_path, "--max-parallel", "2")
    elapsed = time.time() - started
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-3000:]
    document = json.loads((tmp_path / "comparison.json").read_text())
    groups = {g["group"]: g for g in document["groups"]}
    assert set(groups) == {"algo=justrl", "algo=entropy20"}
    table = (tmp_path / "comparison.md").read_text()
    for name, group in groups.items():
        assert group["seeds"] == [1] and group["steps_trained"] == [2]
        run_dirs = [tmp_path / "runs" / name.replace("=", "-") / "seed-1"]
        metrics = [read_metrics(d) for d in run_dirs]
        final = [m[2]["val/average/acc"] for m in metrics]
        # the best trained step: step 0, the model before training, never counts
        best = [max(s["val/average/acc"] for step, s in m.items() if "val/average/acc" in s and step > 0)
                for m in metrics]
        # the driver's mean entropy of a response token, which the comparison reads before actor/entropy
        entropy_last = [m[2]["actor/stapo/entropy_token_mean"] for m in metrics]
        assert entropy_last == pytest.approx([m[2]["actor/entropy"] for m in metrics], rel=1e-5)  # token-mean runs
        stats = group["stats"]
        assert stats["final_acc"]["mean"] == pytest.approx(np.mean(final))
        assert stats["final_acc"]["se"] is None and stats["final_acc"]["n"] == 1  # one seed: no standard error
        assert stats["best_acc"]["mean"] == pytest.approx(np.mean(best))
        assert stats["entropy_last"]["mean"] == pytest.approx(np.mean(entropy_last))
        assert group["entropy_trajectory"]["step"] == [1, 2]
        if name == "algo=entropy20":
            assert all(m[s]["actor/stapo/keep_ratio"] == 1.0 for m in metrics for s in (1, 2))
        masks = [m[1].get("actor/stapo/mask_ratio") for m in metrics]
        if None in masks:
            assert stats["mask_ratio"]["mean"] is None
            cell = "-"
        else:
            mean_masks = [np.mean([m[s]["actor/stapo/mask_ratio"] for s in (1, 2)]) for m in metrics]
            assert stats["mask_ratio"]["mean"] == pytest.approx(np.mean(mean_masks))
            cell = f"{np.mean(mean_masks):.4f}"
        records = [json.loads((d / "sweep_run.json").read_text()) for d in run_dirs]
        assert all(r["returncode"] == 0 and r["seconds"] > 0 for r in records)
        # the machine kinds the trainer's driver wrote to the run folder, taken into the record (stapo://tiny is
        # not a trained build, so it records no build machine)
        written = [json.loads((d / "machine.json").read_text()) for d in run_dirs]
        assert written == [{"machine": machine_kind(), "model_built_on": None}] * len(run_dirs)
        assert all((r["machine"], r["model_built_on"]) == (machine_kind(), None) for r in records)
        assert stats["wall_s"]["mean"] == pytest.approx(np.mean([r["seconds"] for r in records]))
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        acc = f"{np.mean(final):.3f}"
        assert f"| {acc} |" in row and f"| {cell}" in row, row
        config = (run_dirs[0] / "config.yaml").read_text()
        assert "seed: 1" in config
    # side by side: the two runs overlapped
    spans = [json.loads((tmp_path / "runs" / f"algo-{algo}" / "seed-1" / "sweep_run.json").read_text())
             for algo in ("justrl", "entropy20")]
    assert max(r["started_at"] for r in spans) < min(r["finished_at"] for r in spans), spans
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {"reward.png", "entropy.png"}
    # paired: same seed, same numbers at every step (validation included), whichever token-mask path ran
    justrl, keep_all = (
        compared(read_metrics(tmp_path / "runs" / f"algo-{algo}" / "seed-1")) for algo in ("justrl", "entropy20")
    )
    assert {1, 2} <= set(justrl) and sorted(keep_all) == sorted(justrl) and "critic/score/mean" in justrl[1]
    for step in justrl:
        assert keep_all[step] == justrl[step], (step, metric_diff(justrl[step], keep_all[step]))
    (paired,) = document["paired"]["groups"]
    assert document["paired"]["baseline"] == "algo=justrl" and paired["group"] == "algo=entropy20"
    for quantity in ("final_acc", "late_reward", "entropy_last"):
        assert paired["diff"][quantity]["mean"] == 0.0 and paired["diff"][quantity]["n"] == 1, paired["diff"]
    print(f"[bench] sweep 2 algos x 1 seed x 2 steps, side by side: {elapsed:.0f} s")

    again = sweep(tmp_path)
    assert again.returncode == 0, again.stdout[-3000:]
    assert again.stdout.count("finished before, skipped") == 2
    assert "running in" not in again.stdout
