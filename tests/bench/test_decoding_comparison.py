"""The comparison's held-out accuracy at the paper's second decoding (``stapo.val_decodings``): per run, per group
and paired by seed, against values taken here straight from the random rows, and the tables that show them only
when a run validated at a second decoding.

Fast: no trainer. The names are the trainer's own (``stapo.eval.val_metrics.decoding_key`` on verl's key).
"""

from __future__ import annotations

import numpy as np
import pytest

from stapo.eval.val_metrics import decoding_key
from stapo.runs.compare import write_comparison
from stapo.runs.folder import group_runs, load_run
from tests.bench.test_sweep_parts import write_metrics

SECOND = decoding_key("val/average/acc", "T0.7")
VALIDATED = (0, 5, 10)


def rows_of(rng, second: bool, missing_at: int | None = None) -> dict[int, dict[str, float]]:
    rows = {0: {}}
    for step in range(1, 11):
        rows[step] = {"timing_s/step": 1.0, "actor/entropy": float(rng.uniform(0.1, 0.3))}
    for step in VALIDATED:
        rows[step]["val/average/acc"] = float(rng.uniform(0.2, 0.6))
        if second and step != missing_at:
            rows[step][SECOND] = float(rng.uniform(0.5, 0.9))
    return rows


def test_second_decoding_per_run_group_and_paired(tmp_path):
    rng = np.random.default_rng()
    seeds = (1, 2, 3)
    rows = {(name, seed): rows_of(rng, True) for name in ("justrl", "stapo") for seed in seeds}
    runs = [load_run(write_metrics(tmp_path / f"{name}-{seed}", r, record={"cell": name, "seed": seed}))
            for (name, seed), r in rows.items()]
    document = write_comparison(group_runs(runs), tmp_path / "out", baseline="justrl")
    for group in document["groups"]:
        for run in group["runs"]:
            r = rows[(group["group"], run["seed"])]
            assert run["initial_acc@T0.7"] == r[0][SECOND] and run["final_acc@T0.7"] == r[10][SECOND]
            assert run["final_acc"] == r[10]["val/average/acc"]  # the first decoding is not the second
            assert run["series"]["held_out_acc@T0.7"] == {str(s): r[s][SECOND] for s in VALIDATED}
            assert run["final_acc@T1.0"] is None  # no pass at that setting
        finals = [rows[(group["group"], s)][10][SECOND] for s in seeds]
        stat = group["stats"]["final_acc@T0.7"]
        assert stat["mean"] == pytest.approx(np.mean(finals)) and stat["se"] == pytest.approx(
            np.std(finals, ddof=1) / np.sqrt(3))
    (stapo,) = document["paired"]["groups"]
    deltas = [rows[("stapo", s)][10][SECOND] - rows[("justrl", s)][10][SECOND] for s in seeds]
    assert stapo["diff"]["final_acc@T0.7"]["mean"] == pytest.approx(np.mean(deltas))
    assert stapo["diff"]["final_acc@T0.7"]["se"] == pytest.approx(np.std(deltas, ddof=1) / np.sqrt(3))
    table = (tmp_path / "out" / "comparison.md").read_text()
    initial = [rows[("stapo", s)][0][SECOND] for s in seeds]
    final = [rows[("stapo", s)][10][SECOND] for s in seeds]
    assert "| group | seeds | T0.7 (T=0.7, top-p=0.9): step 0 | T0.7: final |" in table
    se = np.std(initial, ddof=1) / np.sqrt(3)
    assert f"| stapo | 1,2,3 | {np.mean(initial):.3f} ± {se:.3f} | {np.mean(final):.3f} ± " in table
    assert "Δ final held-out acc, T0.7 (T=0.7, top-p=0.9)" in table
    assert f"| stapo | 1,2,3 | {np.mean(deltas):.3f} ± " in table


def test_a_run_without_the_second_pass_at_the_step_gets_null_and_no_table_without_any(tmp_path):
    rng = np.random.default_rng()
    runs = [load_run(write_metrics(tmp_path / "a", rows_of(rng, True, missing_at=10), record={"cell": "a", "seed": 1})),
            load_run(write_metrics(tmp_path / "b", rows_of(rng, False), record={"cell": "b", "seed": 1}))]
    document = write_comparison(group_runs(runs), tmp_path / "out", baseline="a")
    a, b = (group["runs"][0] for group in document["groups"])
    assert a["initial_acc@T0.7"] is not None and a["final_acc@T0.7"] is None and b["initial_acc@T0.7"] is None
    assert "T0.7" in (tmp_path / "out" / "comparison.md").read_text()  # step 0 of a is there
    plain = [load_run(write_metrics(tmp_path / f"p{i}", rows_of(rng, False), record={"cell": f"p{i}", "seed": 1}))
             for i in (1, 2)]
    write_comparison(group_runs(plain), tmp_path / "plain")
    assert "T0.7" not in (tmp_path / "plain" / "comparison.md").read_text()
