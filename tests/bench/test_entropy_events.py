"""Entropy events (stapo/runs/events.py): the rule against a loop written here on fresh random series, Fisher's
test against a count over every way of dealing the events, and the events a comparison writes, end to end on run
folders the test writes and on the recorded learning-rate stress (the counts results/README.md quotes)."""

from __future__ import annotations

import json
import math
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from stapo.runs.archive import read_json
from stapo.runs.compare import write_comparison
from stapo.runs.events import fisher_two_sided, run_events
from stapo.runs.folder import group_runs, load_run

REPO = Path(__file__).resolve().parents[2]
ENTROPY = "actor/stapo/entropy_token_mean"
TAIL = "actor/stapo/tail/unused_mass_mean"


def reference_events(entropy: dict[int, float], tail: dict[int, float]) -> dict:
    """The rule as results/tailbed-lr5e-5/COMMAND words it, one step at a time, with stapo/runs/events.py's reading
    of an entropy that is not a number: an explosion at its step (step 1's own: no collapse can be measured)."""
    if 1 not in entropy:
        return {"explosion": None, "tail_driven": None, "collapse": None}
    explosion, collapse, driven = [], [], []
    broken = not math.isfinite(entropy[1])
    for step in sorted(entropy):
        if step < 1 or (step == 1 and not broken):
            continue
        if not math.isfinite(entropy[step]) or (not broken and entropy[step] > 2 * entropy[1]):
            explosion.append(step)
            if 1 in tail and step in tail and tail[step] > 10 * tail[1]:
                driven.append(step)
        elif not broken and entropy[step] < entropy[1] / 2:
            collapse.append(step)
    return {"explosion": explosion, "tail_driven": driven if 1 in tail else None,
            "collapse": None if broken else collapse}


def random_series(rng, steps: int, missing: float = 0.0, broken: float = 0.0) -> dict[int, float]:
    """A positive series with jumps of either size, some steps missing, a share ``broken`` NaN or infinite."""
    values = np.exp(rng.normal(0.0, 0.9, steps + 1))
    values[rng.random(steps + 1) < broken] = rng.choice([math.nan, math.inf])
    return {step: float(values[step]) for step in range(steps + 1) if rng.random() >= missing}


@pytest.mark.parametrize("trial", range(20))
def test_the_rule_finds_the_steps_a_loop_finds(trial):
    rng = np.random.default_rng()
    entropy = random_series(rng, int(rng.integers(1, 40)), missing=0.1, broken=float(rng.choice([0.0, 0.1, 0.5])))
    tail = random_series(rng, 40, missing=float(rng.choice([0.0, 0.3, 1.0])))
    assert run_events(entropy, tail) == reference_events(entropy, tail)


def test_edges_of_the_rule():
    # exactly twice / exactly half is no event (strictly above, strictly below), step 0 never counts
    flat = {0: 9.0, 1: 0.1, 2: 0.2, 3: 0.05, 4: 0.1}
    assert run_events(flat, {1: 1e-4, 2: 1.0}) == {"explosion": [], "tail_driven": [], "collapse": []}
    assert run_events({2: 0.5, 3: 0.1}, {}) == dict.fromkeys(("explosion", "tail_driven", "collapse"))  # no step 1
    up = {1: 0.1, 2: 0.3, 3: 0.25}
    # no tail mass at step 1 (a model without unused tokens, vLLM): not known, not "none"
    assert run_events(up, {}) == {"explosion": [2, 3], "tail_driven": None, "collapse": []}
    # a step whose tail mass was not logged is not tail-driven
    assert run_events(up, {1: 1e-4, 3: 2e-3})["tail_driven"] == [3]


def test_an_entropy_that_is_not_a_number_is_an_explosion():
    """NaN > x is false: without its own reading, a run whose entropy became NaN would count as calm."""
    for bad in (math.nan, math.inf, -math.inf):
        run = {1: 0.1, 2: 0.12, 3: bad, 4: 0.02}
        assert run_events(run, {1: 1e-4, 3: 1.0}) == {"explosion": [3], "tail_driven": [3], "collapse": [4]}
        assert run_events(run, {1: 1e-4, 3: math.nan})["tail_driven"] == []  # a NaN tail mass is not above
        # step 1 itself not a number: the explosion is there, and a collapse cannot be measured against it
        assert run_events({1: bad, 2: 0.1, 3: bad}, {}) == {"explosion": [1, 3], "tail_driven": None,
                                                            "collapse": None}


def dealt(hit_a: int, n_a: int, hit_b: int, n_b: int) -> float:
    """Fisher's two-sided p by dealing the hits to the runs every possible way and counting the tables."""
    runs = range(n_a + n_b)
    tables = Counter(sum(run < n_a for run in hits) for hits in combinations(runs, hit_a + hit_b))
    seen = tables[hit_a]
    return sum(count for count in tables.values() if count <= seen) / sum(tables.values())


@pytest.mark.parametrize("n_a,n_b", [(1, 1), (3, 4), (5, 5), (8, 8), (2, 7)])
def test_fisher_counts_what_dealing_the_events_counts(n_a, n_b):
    for hit_a in range(n_a + 1):
        for hit_b in range(n_b + 1):
            assert fisher_two_sided(hit_a, n_a, hit_b, n_b) == pytest.approx(dealt(hit_a, n_a, hit_b, n_b), rel=1e-12)
    assert fisher_two_sided(3, 4, 1, 4) == pytest.approx(17 / 35)  # the lady tasting tea, two-sided
    assert fisher_two_sided(0, 0, 1, 3) is None


def write_run(run_dir: Path, seed: int, cell: str, entropy: list[float], tail: list[float]) -> None:
    steps = len(entropy)
    lines = [json.dumps({"step": 0, "data": {"val/average/acc": 0.5}})]
    for step in range(1, steps + 1):
        data = {ENTROPY: entropy[step - 1], TAIL: tail[step - 1], "critic/score/mean": 0.1, "timing_s/step": 1.0}
        if step == steps:
            data["val/average/acc"] = 0.6
        lines.append(json.dumps({"step": step, "data": data}))
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run_dir / "config.yaml").write_text(f"trainer:\n  total_training_steps: {steps}\n", encoding="utf-8")
    (run_dir / "sweep_run.json").write_text(json.dumps({"cell": cell, "seed": seed, "returncode": 0}))


def test_the_comparison_counts_each_groups_runs_with_an_event_and_sets_them_against_the_baseline(tmp_path):
    flat, up = [0.1, 0.1, 0.11, 0.1], [0.1, 0.15, 0.3, 0.1]
    quiet, loud = [1e-4] * 4, [1e-4, 1e-4, 2e-3, 1e-4]
    for seed in (1, 2, 3):
        write_run(tmp_path / "base" / f"seed-{seed}", seed, "algo=justrl", up, loud if seed < 3 else quiet)
        write_run(tmp_path / "other" / f"seed-{seed}", seed, "algo=stapo", flat if seed > 1 else [0.1, 0.1, 0.04, 0.1],
                  quiet)
    runs = [load_run(path) for path in sorted(tmp_path.glob("*/seed-*"))]
    document = write_comparison(group_runs(runs), tmp_path / "out", baseline="algo=justrl")
    by_name = {group["group"]: group for group in document["groups"]}
    assert by_name["algo=justrl"]["events"] == {
        "explosion": {"runs": 3, "of": 3, "seeds": [1, 2, 3]},
        "tail_driven": {"runs": 2, "of": 3, "seeds": [1, 2]},
        "collapse": {"runs": 0, "of": 3, "seeds": []},
    }
    stapo = by_name["algo=stapo"]
    assert [run["events"] for run in stapo["runs"]][0] == {"explosion": [], "tail_driven": [], "collapse": [3]}
    assert stapo["events"]["collapse"] == {"runs": 1, "of": 3, "seeds": [1]}
    assert document["events_rule"] == {"explosion_above": 2.0, "collapse_below": 0.5, "tail_above": 10.0,
                                       "relative_to_step": 1}
    text = (tmp_path / "out" / "comparison.md").read_text()
    p = fisher_two_sided(0, 3, 3, 3)
    assert f"| algo=stapo | 0 of 3 | 0 of 3 | 1 of 3 (1) | {p:.3g} | " in text
    assert "| algo=justrl | 3 of 3 (1, 2, 3) | 2 of 3 (1, 2) | 0 of 3 |  |  |  |" in text


def test_the_recorded_learning_rate_stress_gives_the_counts_its_readme_quotes():
    """results/tailbed-lr5e-5: its runs' per-step series (comparison.json) through the module give the table
    results/README.md quotes (which tests/bench/test_quoted_figures.py recomputes by its own loop)."""
    document = read_json(REPO / "results" / "tailbed-lr5e-5" / "comparison.json")
    found = {}
    for group in document["groups"]:
        events = []
        for run in group["runs"]:
            series = {name: {int(k): v for k, v in run["series"][name].items()} for name in ("entropy", "tail_mass")}
            events.append(run_events(series["entropy"], series["tail_mass"]))
        kinds = ("explosion", "tail_driven", "collapse")
        found[group["group"]] = [sum(bool(e[kind]) for e in events) for kind in kinds]
    assert found == {"algo=justrl": [5, 2, 0], "algo=stapo": [0, 0, 0], "algo=grpo": [6, 4, 0]}
    readme = (REPO / "results" / "README.md").read_text()
    assert "| an entropy explosion | 5 of 8 | 0 of 8 | 6 of 8 |" in readme
    assert "| a tail-driven explosion | 2 of 8 | 0 of 8 | 4 of 8 |" in readme
