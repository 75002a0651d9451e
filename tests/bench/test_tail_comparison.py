"""The tail quantities of a comparison (stapo.runs.summary: unused mass, largest position entropy, the exact
grad-norm share), read from run folders written as verl's file logger writes them, against values computed
here in plain loops from the same random rows; their names against the ones the driver logs.

Fast: no trainer.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stapo.rundir import ENTROPY_TOKEN_MEAN
from stapo.runs import summary
from stapo.runs.compare import write_comparison
from stapo.runs.folder import group_runs, load_run
from tests.bench.test_sweep_parts import write_metrics

STEPS = 14  # more than LATE_STEPS, so the late window is a part of the run


def test_the_names_are_the_ones_the_driver_logs():
    """The tail names have one spelling (stapo.rundir) that the driver writes and the comparison reads; the
    grad-norm shares are the driver's prefix on the keys stapo.algorithm.gradnorm.exact_norm_shares returns."""
    import torch

    from stapo.algorithm.gradnorm import exact_norm_shares
    from stapo.verl_plugin.training import driver_diagnostics as driver
    from stapo.verl_plugin.training.losses import METRIC_PREFIX

    for name in ("ENTROPY_MAX", "TAIL_MASS", "TAIL_MASS_MAX", "TAIL_SAMPLED"):
        assert getattr(summary, name) is getattr(driver, name), name
    one = torch.ones(1)
    keys = exact_norm_shares(one / 2, one / 2, one, one.bool(), one.bool())
    assert {summary.NORM_SHARE, summary.NORM_SQ_SHARE} == {METRIC_PREFIX + key for key in keys}


def random_rows(rng, with_tail: bool) -> dict[int, dict[str, float]]:
    rows = {0: {"val/average/acc": 0.5}}
    for step in range(1, STEPS + 1):
        row = {ENTROPY_TOKEN_MEAN: float(rng.uniform(0.05, 0.3)), "timing_s/step": 1.0}
        if with_tail and step != 3:  # a step without the diagnostics (not due) is skipped, not read as 0
            row[summary.TAIL_MASS] = float(rng.uniform(1e-4, 2e-3))
            row[summary.TAIL_MASS_MAX] = float(rng.uniform(0.01, 0.5))
            row[summary.ENTROPY_MAX] = float(rng.uniform(0.5, 4.0))
            row[summary.NORM_SHARE] = float(rng.uniform(0.0, 0.3))
        rows[step] = row
    rows[STEPS]["val/average/acc"] = 0.6
    return rows


def expected(rows: dict[int, dict[str, float]]) -> dict[str, float | None]:
    """The tail quantities at the last step, in loops."""
    mass, mass_late, peaks, entropy_peaks, shares, entropies = [], [], [], [], [], []
    for step in range(1, STEPS + 1):
        row = rows[step]
        entropies.append(row[ENTROPY_TOKEN_MEAN])
        if summary.TAIL_MASS in row:
            mass.append(row[summary.TAIL_MASS])
            if step > STEPS - summary.LATE_STEPS:
                mass_late.append(row[summary.TAIL_MASS])
            peaks.append(row[summary.TAIL_MASS_MAX])
            entropy_peaks.append(row[summary.ENTROPY_MAX])
            shares.append(row[summary.NORM_SHARE])
    return {
        "tail_mass": math.fsum(mass) / len(mass) if mass else None,
        "tail_mass_late": math.fsum(mass_late) / len(mass_late) if mass_late else None,
        "tail_mass_peak": max(peaks) if peaks else None,
        "entropy_max_peak": max(entropy_peaks) if entropy_peaks else None,
        "entropy_peak": max(entropies),
        "norm_share": math.fsum(shares) / len(shares) if shares else None,
    }


def test_tail_quantities_per_run_per_group_and_paired(tmp_path):
    rng = np.random.default_rng()
    rows = {(name, seed): random_rows(rng, True) for name in ("grpo", "stapo") for seed in (1, 2, 3)}
    runs = [
        load_run(write_metrics(tmp_path / f"{name}-seed{seed}", r, record={"cell": name, "seed": seed}))
        for (name, seed), r in rows.items()
    ]
    document = write_comparison(group_runs(runs), tmp_path / "out", baseline="grpo")
    want = {key: expected(r) for key, r in rows.items()}
    for group in document["groups"]:
        for run in group["runs"]:
            for quantity, value in want[(group["group"], run["seed"])].items():
                assert run[quantity] == pytest.approx(value), quantity
            assert sorted(map(int, run["series"]["tail_mass"])) == sorted(set(range(1, STEPS + 1)) - {3})
        for quantity in summary.TAIL_QUANTITIES:
            values = [want[(group["group"], seed)][quantity] for seed in (1, 2, 3)]
            assert group["stats"][quantity]["mean"] == pytest.approx(np.mean(values))
            assert group["stats"][quantity]["se"] == pytest.approx(np.std(values, ddof=1) / np.sqrt(3))
    (stapo,) = document["paired"]["groups"]
    for quantity in summary.TAIL_QUANTITIES:
        deltas = [want[("stapo", seed)][quantity] - want[("grpo", seed)][quantity] for seed in (1, 2, 3)]
        assert stapo["diff"][quantity]["mean"] == pytest.approx(np.mean(deltas))
        assert stapo["diff"][quantity]["se"] == pytest.approx(np.std(deltas, ddof=1) / np.sqrt(3))
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert "| group | seeds | unused mass, mean |" in table and "The tail, paired by seed" in table
    grpo_mass = np.mean([want[("grpo", s)]["tail_mass"] for s in (1, 2, 3)])
    assert f"| grpo | 1,2,3 | {grpo_mass:.6f} ± " in table
    assert json.loads((tmp_path / "out" / "comparison.json").read_text())["groups"][0]["stats"]["tail_mass"]


def test_runs_without_the_tail_get_nulls_and_no_tail_table(tmp_path):
    rng = np.random.default_rng()
    runs = [
        load_run(write_metrics(tmp_path / f"{name}-seed1", random_rows(rng, False), record={"cell": name, "seed": 1}))
        for name in ("grpo", "stapo")
    ]
    document = write_comparison(group_runs(runs), tmp_path / "out")
    stats = document["groups"][0]["stats"]
    assert all(stats[q]["mean"] is None for q in summary.TAIL_QUANTITIES if q != "entropy_peak")
    assert stats["entropy_peak"]["mean"] is not None  # the mean entropy is logged by every run
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert "unused mass" not in table
