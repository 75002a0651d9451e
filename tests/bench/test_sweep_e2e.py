"""`stapo sweep` end to end on the tiny preset: 2 algorithms x 2 seeds through the real trainer.

The comparison table is checked against the run folders' own metrics (recomputed here with numpy),
a second invocation skips every finished run, and runs of the two algorithms with the same seed
see the same step-1 rollouts (common random numbers, docs/reproducibility.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from stapo.rundir import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
COMMON = [
    "model_preset=tiny",
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
        "algo=stapo,grpo",
        "--seeds",
        "1,2",
        "--out",
        str(out),
        *extra,
        "--",
        *COMMON,
    ]
    return subprocess.run(command, check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1700)


def stderr(values):
    return float(np.std(values, ddof=1) / np.sqrt(len(values)))


def test_sweep_two_algorithms_two_seeds(tmp_path):
    started = time.time()
    first = sweep(tmp_path)
    elapsed = time.time() - started
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-3000:]
    document = json.loads((tmp_path / "comparison.json").read_text())
    groups = {g["group"]: g for g in document["groups"]}
    assert set(groups) == {"algo=stapo", "algo=grpo"}
    table = (tmp_path / "comparison.md").read_text()
    for name, group in groups.items():
        assert group["seeds"] == [1, 2] and group["steps_trained"] == [2, 2]
        run_dirs = [tmp_path / "runs" / name.replace("=", "-") / f"seed-{seed}" for seed in (1, 2)]
        metrics = [read_metrics(d) for d in run_dirs]
        final = [m[2]["val/average/acc"] for m in metrics]
        best = [max(s["val/average/acc"] for s in m.values() if "val/average/acc" in s) for m in metrics]
        entropy_last = [m[2]["actor/entropy"] for m in metrics]
        stats = group["stats"]
        assert stats["final_acc"]["mean"] == pytest.approx(np.mean(final))
        assert stats["final_acc"]["se"] == pytest.approx(stderr(final), abs=1e-12)
        assert stats["best_acc"]["mean"] == pytest.approx(np.mean(best))
        assert stats["entropy_last"]["mean"] == pytest.approx(np.mean(entropy_last))
        assert group["entropy_trajectory"]["step"] == [1, 2]
        if name == "algo=stapo":
            masks = [np.mean([m[s]["actor/stapo/mask_ratio"] for s in (1, 2)]) for m in metrics]
            assert stats["mask_ratio"]["mean"] == pytest.approx(np.mean(masks))
            cell = f"{np.mean(masks):.4f}"
        else:
            assert stats["mask_ratio"]["mean"] is None
            cell = "-"
        records = [json.loads((d / "sweep_run.json").read_text()) for d in run_dirs]
        assert all(r["returncode"] == 0 and r["seconds"] > 0 for r in records)
        assert stats["wall_s"]["mean"] == pytest.approx(np.mean([r["seconds"] for r in records]))
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        acc = f"{np.mean(final):.3f} ± {stderr(final):.3f}"
        assert f"| {acc} |" in row and f"| {cell}" in row, row
        config = (run_dirs[0] / "config.yaml").read_text()
        assert "seed: 1" in config
    assert {p.name for p in (tmp_path / "plots").iterdir()} >= {"reward.png", "entropy.png"}
    # common random numbers: same seed, same step-1 rollouts and rewards, whichever the algorithm
    for seed in (1, 2):
        scores = [
            read_metrics(tmp_path / "runs" / f"algo-{a}" / f"seed-{seed}")[1]["critic/score/mean"]
            for a in ("stapo", "grpo")
        ]
        assert scores[0] == scores[1], (seed, scores)
    print(f"[bench] sweep 2 algos x 2 seeds x 2 steps: {elapsed:.0f} s")

    again = sweep(tmp_path)
    assert again.returncode == 0, again.stdout[-3000:]
    assert again.stdout.count("finished before, skipped") == 4
    assert "running in" not in again.stdout
