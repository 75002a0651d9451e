"""stapo/runs/registered.py: the t distribution's tail against numerical integration of its density and printed
table values, the paired t-test and the sign test against computations of their own, and the confirmatory TACO set's
registered-test.json / .md against the test run again from the raw runs, its outcome read again from the gzipped
metrics, and the registration's commit set before the first run (docs/registration.md)."""

from __future__ import annotations

import gzip
import json
import math
import random
import shlex
import shutil
import subprocess
from itertools import product
from pathlib import Path

import pytest

from stapo.runs.registered import (
    RegisteredTestError,
    Registration,
    build_parser,
    iso,
    paired_t,
    render,
    run_registered,
    sign_test_two_sided,
    student_t_sf,
)

REPO = Path(__file__).resolve().parents[2]
SET = REPO / "results" / "tailbed-taco-confirm-xeon"


def t_sf_by_integration(t: float, df: int, points: int = 20_000) -> float:
    """P(T > t) as 1/2 minus the integral of Student's density over [0, |t|] (composite Simpson, float64)."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))

    h = abs(t) / points
    inner = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, points))
    area = h / 3 * (density(0.0) + inner + density(abs(t)))
    return 0.5 - area if t >= 0 else 0.5 + area


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 10, 15, 30])
def test_the_t_tail_is_the_integral_of_the_density(df):
    rng = random.Random(1000 + df)
    for t in [0.0, 0.1, -0.1, *[rng.uniform(-6, 6) for _ in range(6)]]:
        assert student_t_sf(t, df) == pytest.approx(t_sf_by_integration(t, df), abs=1e-10)


@pytest.mark.parametrize("df, t, p", [
    # printed quantiles of Student's t: P(T > t) = p
    (1, 6.313752, 0.05), (2, 2.919986, 0.05), (7, 1.894579, 0.05), (7, 2.364624, 0.025), (7, 2.997952, 0.01),
    (12, 1.782288, 0.05), (30, 2.457262, 0.01),
])
def test_the_t_tail_gives_the_printed_quantiles(df, t, p):
    assert student_t_sf(t, df) == pytest.approx(p, rel=2e-6)


def test_the_t_tail_at_its_edges():
    assert student_t_sf(0.0, 7) == 0.5
    assert student_t_sf(math.inf, 3) == 0.0 and student_t_sf(-math.inf, 3) == 1.0
    assert student_t_sf(1.3, 5) + student_t_sf(-1.3, 5) == pytest.approx(1.0, abs=1e-15)
    assert student_t_sf(3.0, 1) == pytest.approx(0.5 - math.atan(3.0) / math.pi, abs=1e-15)  # Cauchy
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="positive integer"):
            student_t_sf(1.0, bad)


def test_the_paired_t_test_against_a_loop_of_its_own():
    rng = random.Random(7)
    for n in (2, 3, 8, 20):
        deltas = [rng.gauss(0.01, 0.02) for _ in range(n)]
        mean = sum(deltas) / n
        sd = (sum((d - mean) ** 2 for d in deltas) / (n - 1)) ** 0.5
        t = mean / (sd / n**0.5)
        greater, less, both = (paired_t(deltas, side) for side in ("greater", "less", "two-sided"))
        assert greater.t == pytest.approx(t, rel=1e-12) and greater.df == n - 1
        assert greater.p == pytest.approx(t_sf_by_integration(t, n - 1), abs=1e-9)
        assert greater.p + less.p == pytest.approx(1.0, abs=1e-12)
        assert both.p == pytest.approx(2 * min(greater.p, less.p), abs=1e-12)


@pytest.mark.parametrize("deltas", [[0.01], [0.02, 0.02, 0.02], [0.0, math.nan]])
def test_a_t_test_without_spread_is_refused(deltas):
    with pytest.raises(RegisteredTestError):
        paired_t(deltas, "greater")


@pytest.mark.parametrize("higher, lower", [(9, 0), (5, 3), (0, 0), (4, 4), (1, 6)])
def test_the_sign_test_is_the_share_of_fair_coin_splits_as_uneven(higher, lower):
    n = higher + lower
    splits = list(product((0, 1), repeat=n))
    uneven = sum(abs(2 * sum(s) - n) >= abs(higher - lower) for s in splits)
    assert sign_test_two_sided(higher, lower) == pytest.approx(uneven / len(splits), rel=1e-12)


def stored() -> dict:
    return json.loads((SET / "registered-test.json").read_text(encoding="utf-8"))


def test_the_registered_test_is_what_the_raw_runs_give_now():
    """registered-test.json and .md are the registered test run from runs/ as the command they quote runs it."""
    kept = stored()
    args = build_parser().parse_args(shlex.split(kept["command"])[3:])
    registration = Registration(**kept["registration"])
    assert (args.group, args.baseline, args.outcome, args.side, args.alpha, args.registered_by) == (
        registration.group, registration.baseline, registration.outcome, registration.side, registration.alpha,
        registration.registered_by)
    assert [int(s) for s in args.seeds.split(",")] == registration.seeds
    assert args.secondary.split(",") == registration.secondary
    again = {"command": kept["command"], **run_registered(registration, SET / "runs")}
    assert json.loads(json.dumps(again)) == kept
    assert render(kept) == (SET / "registered-test.md").read_text(encoding="utf-8")


def test_the_registered_test_is_the_one_command_fixed():
    """What the registration fixed (COMMAND at the registering commit): TACO minus JustRL in held-out accuracy at
    step 100, one-sided (TACO higher), alpha 0.05, seeds 6-13."""
    registration = stored()["registration"]
    assert (registration["group"], registration["baseline"], registration["outcome"], registration["side"],
            registration["alpha"], registration["seeds"]) == (
        "algo=taco", "algo=justrl", "final_acc", "greater", 0.05, list(range(6, 14)))
    command = " ".join((SET / "COMMAND").read_text(encoding="utf-8").replace("#", " ").split())
    for fixed in ("TACO minus JustRL in held-out accuracy at step 100", "The hypothesis, one-sided: TACO is higher",
                  "a paired t-test, one-sided, at 0.05", "seeds 6-13"):
        assert fixed in command


def held_out_at(run: Path, step: int) -> float:
    """``val/average/acc`` at ``step``, read from the gzipped metrics without the bench's readers."""
    found = None
    for line in gzip.decompress((run / "metrics.jsonl.gz").read_bytes()).decode("utf-8").splitlines():
        row = json.loads(line)
        if row["step"] == step and "val/average/acc" in row["data"]:
            found = row["data"]["val/average/acc"]
    assert found is not None, run
    return found


def test_the_primary_outcome_read_again_from_the_metrics_files():
    kept = stored()
    primary = kept["primary"]
    deltas = [held_out_at(SET / "runs" / "algo-taco" / f"seed-{seed}", 100)
              - held_out_at(SET / "runs" / "algo-justrl" / f"seed-{seed}", 100) for seed in range(6, 14)]
    assert primary["deltas"] == pytest.approx(deltas, abs=1e-15)
    mean = math.fsum(deltas) / 8
    se = (math.fsum((d - mean) ** 2 for d in deltas) / 7 / 8) ** 0.5
    assert primary["t_test"]["t"] == pytest.approx(mean / se, rel=1e-12)
    assert primary["t_test"]["p"] == pytest.approx(t_sf_by_integration(mean / se, 7), abs=1e-9)
    assert primary["rejects"] is (primary["t_test"]["p"] < 0.05)


def test_the_registering_commit_came_before_the_first_run():
    """The order that makes the test confirmatory: the commit that registered it, then the runs."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git history here")
    kept = stored()
    commit = kept["registration"]["registered_by"]
    found = subprocess.run(["git", "-C", str(REPO), "show", "-s", "--format=%ct", commit], capture_output=True,
                           text=True, check=False)
    if found.returncode != 0:
        pytest.skip("the registering commit is not in this clone's history")
    committed = float(found.stdout.split()[0])
    starts = [json.loads(path.read_text(encoding="utf-8"))["started_at"]
              for path in (SET / "runs").glob("*/seed-*/sweep_run.json")]
    assert len(starts) == 16 and committed < min(starts)
    assert kept["registration"]["registered_at"] == iso(committed)


def test_a_registered_test_refuses_seeds_other_than_the_registered_ones(tmp_path):
    for group in ("algo-taco", "algo-justrl"):
        shutil.copytree(SET / "runs" / group / "seed-6", tmp_path / group / "seed-6")
    registration = Registration("algo=taco", "algo=justrl", "final_acc", "greater", 0.05, [6, 7], [], "x", "y")
    with pytest.raises(RegisteredTestError, match="no seed is added or dropped"):
        run_registered(registration, tmp_path)
    unknown = Registration("algo=taco", "algo=justrl", "final_accuracy", "greater", 0.05, [6], [], "x", "y")
    with pytest.raises(RegisteredTestError, match="not among a run's values"):
        run_registered(unknown, tmp_path)
