"""A comparison never hides a run: a run whose value is not finite stays visible in every table that lists its seed.

One NaN step inside a run's window makes its value NaN, and the mean over seeds leaves it out; the cell then says
``(n=4 of 5)``, and the comparison warns on the console and in both files of every non-finite value it read, by run,
step and key. A NaN entropy counts as an explosion (stapo/runs/events.py). Run folders written here
(tests/bench/test_compare_like_with_like's ``fake_run``); the expected means recomputed from the values written.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from stapo.cli import main as stapo
from stapo.runs.tables import cell
from tests.bench.test_compare_like_with_like import ENTROPY, REWARD, STEPS, fake_run

SEEDS = (1, 2, 3, 4, 5)
NAN_SEED, NAN_STEP = 3, STEPS - 2  # inside the late-reward window (the last 10 steps)
ENTROPY_SEED, ENTROPY_STEP = 2, 9


def rewrite(run_dir, rows) -> None:
    lines = [json.dumps({"step": step, "data": data}) for step, data in rows.items()]  # NaN written as verl does
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_runs(root, rng) -> dict:
    written = {}
    for name in ("algo-stapo", "algo-justrl"):
        for seed in SEEDS:
            run_dir = root / name / f"seed-{seed}"
            rows = fake_run(run_dir, seed, name.replace("-", "=", 1), STEPS, rng)
            if name == "algo-stapo" and seed == NAN_SEED:
                rows[NAN_STEP][REWARD] = math.nan
            if name == "algo-justrl" and seed == ENTROPY_SEED:
                rows[ENTROPY_STEP][ENTROPY] = math.inf
            rewrite(run_dir, rows)
            written[(name, seed)] = rows
    return written


def late_reward(rows) -> float:
    late = [rows[step][REWARD] for step in range(STEPS - 9, STEPS + 1)]
    return sum(late) / len(late)


def test_a_nan_step_shows_as_n_below_the_seeds_and_is_warned_of_by_run_step_and_key(tmp_path, capsys):
    written = write_runs(tmp_path, np.random.default_rng())
    out = tmp_path / "cmp"
    argv = ["compare", str(tmp_path / "algo-stapo"), str(tmp_path / "algo-justrl"), "--baseline", "algo=stapo",
            "--out", str(out)]
    assert stapo(argv) == 0
    console = capsys.readouterr().err
    document = json.loads((out / "comparison.json").read_text())
    table = (out / "comparison.md").read_text()

    groups = {group["group"]: group for group in document["groups"]}
    stapo_late = groups["algo=stapo"]["stats"]["late_reward"]
    finite = [late_reward(written[("algo-stapo", seed)]) for seed in SEEDS if seed != NAN_SEED]
    assert stapo_late["n"] == 4 and stapo_late["nonfinite"] == 1
    assert "nonfinite" not in groups["algo=stapo"]["stats"]["final_acc"]  # written only where there are some
    assert stapo_late["mean"] == pytest.approx(statistics.fmean(finite))
    shown = f"{stapo_late['mean']:.3f} ± {stapo_late['se']:.3f} (n=4 of 5)"
    row = next(line for line in table.splitlines() if line.startswith("| algo=stapo | 1,2,3,4,5 |"))
    assert shown in row
    assert "(n=" not in row.replace(shown, "")  # every other cell of the row is over all five runs
    # paired by seed, the seed whose baseline value is NaN drops out of the difference, and says so
    justrl = [line for line in table.splitlines() if line.startswith("| algo=justrl | 1,2,3,4,5 |")]
    assert len(justrl) == 2 and "(n=" not in justrl[0]  # its own row: every value finite (the inf is not at 24)
    assert justrl[1].count("(n=4 of 5)") == 1 and "(n=4 of 5) |" in justrl[1].split("|")[5] + "|"
    run_dir = str(tmp_path / "algo-stapo" / f"seed-{NAN_SEED}")
    for text in (console, table, json.dumps(document["warnings"])):
        assert run_dir in text and f"{REWARD} at step {NAN_STEP}" in text
    justrl_dir = str(tmp_path / "algo-justrl" / f"seed-{ENTROPY_SEED}")
    assert f"{ENTROPY} at step {ENTROPY_STEP}" in console and justrl_dir in console
    assert {"group": "algo=stapo", "seed": NAN_SEED, "run_dir": run_dir, "step": NAN_STEP, "key": REWARD} in \
        document["nonfinite"]
    assert len(document["nonfinite"]) == 2
    # the infinite entropy is an explosion of that run (the others' entropy never doubles)
    assert groups["algo=justrl"]["events"]["explosion"] == {"runs": 1, "of": 5, "seeds": [ENTROPY_SEED]}
    assert groups["algo=stapo"]["events"]["explosion"]["runs"] == 0


def test_a_run_set_without_non_finite_values_reads_as_before(tmp_path, capsys):
    rng = np.random.default_rng()
    for seed in SEEDS[:3]:
        fake_run(tmp_path / "algo-stapo" / f"seed-{seed}", seed, "algo=stapo", STEPS, rng)
    out = tmp_path / "cmp"
    assert stapo(["compare", str(tmp_path / "algo-stapo"), "--out", str(out)]) == 0
    document = json.loads((out / "comparison.json").read_text())
    assert document["nonfinite"] == [] and "warnings" not in document
    rows = [line for line in (out / "comparison.md").read_text().splitlines() if line.startswith("| algo=stapo")]
    assert rows and not any("(n=" in row for row in rows)
    assert "warning" not in capsys.readouterr().err


def test_the_cell_says_how_many_runs_it_is_over():
    assert cell({"mean": 0.41, "se": 0.02, "n": 4, "nonfinite": 1}, 2, of=5) == "0.41 ± 0.02 (n=4 of 5)"
    assert cell({"mean": 0.41, "se": 0.02, "n": 5}, 2, of=5) == "0.41 ± 0.02"
    assert cell({"mean": 0.41, "se": None, "n": 1}, 2, of=2) == "0.41 (n=1 of 2)"
    assert cell({"mean": None, "se": None, "n": 0, "nonfinite": 2}, 2, of=2) == "- (n=0 of 2)"
    assert cell({"mean": None, "se": None, "n": 0, "nonfinite": 0}, 2, of=2) == "-"  # not logged: nothing hidden
    assert cell({"mean": 0.41, "se": 0.02, "n": 4}, 2) == "0.41 ± 0.02"  # an archived document, no count asked
