"""A test registered before its runs, run exactly as registered, from the set's raw run folders.

A set is confirmatory when its outcome, test, side, alpha and seeds were committed before its first run
(docs/registration.md). This module runs such a test and nothing else: a paired t-test of one outcome, the group
minus the baseline seed by seed, over exactly the registered seeds, on the side the registration named, at its
alpha; beside it the count of seeds higher / lower / equal and the two-sided sign test, and the registered secondary
rows as paired mean ± SE with their counts (no test of their own). Every value is read by ``stapo.runs.compare`` from
the runs' metrics, as ``stapo compare`` reads them, so the test and the set's comparison.md cannot disagree.

    python -m stapo.runs.registered results/tailbed-taco-confirm-xeon --group algo=taco --baseline algo=justrl \\
        --outcome final_acc --side greater --alpha 0.05 --seeds 6,7,8,9,10,11,12,13 --registered-by 5b1a5a5 \\
        --secondary final_acc@T0.7,best_acc,tail_mass,tail_mass_late,entropy_peak,entropy_last

writes ``registered-test.md`` and ``registered-test.json`` into the set's folder. The t distribution's tail is
computed in closed form for integer degrees of freedom (a paired test over n seeds has n - 1), pure Python.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from math import comb
from pathlib import Path

SIDES = ("greater", "less", "two-sided")
EQUAL = 1e-12  # two values this close count as equal (held-out accuracies are counts over 512 samples)


class RegisteredTestError(ValueError):
    """A registered test that cannot be run as registered: refused with one line saying why."""


def student_t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` (a positive integer) degrees of freedom.

    With theta = atan(|t| / sqrt(df)), P(|T| < |t|) is a finite sum of powers of cos(theta): for odd df,
    (2 / pi) (theta + sin(theta) (c + 2/3 c^3 + 2*4/(3*5) c^5 + ... up to c^(df-2))); for even df,
    sin(theta) (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2)), with c = cos(theta) (the terms' ratio is
    (k - 1) / k or k / (k + 1) c^2)."""
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df!r}")
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2:
        term, total = c, 0.0
        for k in range(3, df + 1, 2):  # terms c, 2/3 c^3, ... while the power stays <= df - 2
            total += term
            term *= (k - 1) / k * c * c
        inside = (2 / math.pi) * (theta + s * total) if df > 1 else 2 * theta / math.pi
    else:
        term, total = 1.0, 0.0
        for k in range(2, df + 1, 2):
            total += term
            term *= (k - 1) / k * c * c
        inside = s * total
    tail = max(0.0, (1.0 - inside) / 2)
    return tail if t >= 0 else 1.0 - tail


def sign_test_two_sided(higher: int, lower: int) -> float:
    """Two-sided sign test, ties left out: the probability under a fair coin of a split at least this uneven."""
    n, k = higher + lower, max(higher, lower)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(comb(n, i) for i in range(k, n + 1)) / 2**n)


@dataclass
class PairedT:
    n: int
    mean: float
    se: float
    t: float
    df: int
    p: float
    side: str


def paired_t(deltas: list[float], side: str) -> PairedT:
    """The paired t-test of per-seed differences: t = mean / (sd / sqrt(n)) on n - 1 degrees of freedom, its p on
    ``side`` ("greater": the group is higher; "less"; "two-sided")."""
    if side not in SIDES:
        raise RegisteredTestError(f"side must be one of {SIDES}, got {side!r}")
    n = len(deltas)
    if n < 2 or not all(math.isfinite(d) for d in deltas):
        raise RegisteredTestError(f"a paired t-test needs at least two finite differences, got {deltas}")
    mean = math.fsum(deltas) / n
    se = math.sqrt(math.fsum((d - mean) ** 2 for d in deltas) / (n - 1) / n)
    if se == 0:
        raise RegisteredTestError(f"every difference is {mean!r}: the t statistic is undefined")
    t = mean / se
    p = {"greater": student_t_sf(t, n - 1), "less": student_t_sf(-t, n - 1),
         "two-sided": min(1.0, 2 * student_t_sf(abs(t), n - 1))}[side]
    return PairedT(n, mean, se, t, n - 1, p, side)


def counts(deltas: list[float]) -> dict[str, int]:
    return {"higher": sum(d > EQUAL for d in deltas), "lower": sum(d < -EQUAL for d in deltas),
            "equal": sum(abs(d) <= EQUAL for d in deltas)}


@dataclass
class Registration:
    """What a set's COMMAND fixed before its first run."""

    group: str
    baseline: str
    outcome: str  # a per-run quantity of stapo.runs.summary (final_acc: held-out accuracy at the compared step)
    side: str
    alpha: float
    seeds: list[int]
    secondary: list[str]
    registered_by: str  # the commit that registered the test
    registered_at: str  # that commit's time (ISO 8601, UTC)


def commit_time(commit: str, repo: Path) -> str:
    """A commit's committer time, ISO 8601 in UTC, from git."""
    found = subprocess.run(["git", "-C", str(repo), "show", "-s", "--format=%ct", commit], capture_output=True,
                           text=True, check=False)
    if found.returncode != 0 or not found.stdout.strip():
        raise RegisteredTestError(f"--registered-by {commit}: git cannot resolve it in {repo}")
    return iso(float(found.stdout.split()[0]))


def iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def per_seed(group: dict, quantity: str) -> dict[int, float | None]:
    return {run["seed"]: run.get(quantity) for run in group["runs"]}


def run_registered(registration: Registration, runs_dir: Path) -> dict:
    """The registered test over the run folders under ``runs_dir``: the document ``registered-test.json`` holds.
    Refused when a group's seeds are not exactly the registered ones or a run is short of the compared step."""
    from stapo.runs.compare import build_comparison
    from stapo.runs.compare_cli import find_runs
    from stapo.runs.folder import group_runs, load_run
    from stapo.runs.summary import QUANTITIES

    unknown = [q for q in (registration.outcome, *registration.secondary) if q not in QUANTITIES]
    if unknown:
        raise RegisteredTestError(f"quantities {unknown} are not among a run's values {list(QUANTITIES)}")
    runs = [load_run(path) for path in find_runs(runs_dir)]
    groups = group_runs(runs)
    for name in (registration.group, registration.baseline):
        found = sorted(run.seed for run in groups.get(name, []))
        if found != sorted(registration.seeds):
            raise RegisteredTestError(f"group {name!r} holds seeds {found}, the registration fixed "
                                      f"{sorted(registration.seeds)}: no seed is added or dropped after the runs")
    compared = {name: groups[name] for name in (registration.baseline, registration.group)}
    document, _ = build_comparison(compared, baseline=registration.baseline)
    if document["unfinished"]:
        raise RegisteredTestError(f"runs short of step {document['compared_at']}: {document['unfinished']}")
    by_name = {group["group"]: group for group in document["groups"]}
    mine, base = by_name[registration.group], by_name[registration.baseline]

    def row(quantity: str) -> dict:
        ours, theirs = per_seed(mine, quantity), per_seed(base, quantity)
        missing = [seed for seed in registration.seeds if ours[seed] is None or theirs[seed] is None]
        if missing:
            raise RegisteredTestError(f"{quantity}: no value for seeds {missing}")
        deltas = [ours[seed] - theirs[seed] for seed in sorted(registration.seeds)]
        mean = math.fsum(deltas) / len(deltas)
        se = math.sqrt(math.fsum((d - mean) ** 2 for d in deltas) / (len(deltas) - 1) / len(deltas))
        return {"quantity": quantity, "group_mean": math.fsum(ours.values()) / len(ours),
                "baseline_mean": math.fsum(theirs.values()) / len(theirs), "mean": mean, "se": se,
                "deltas": deltas, **counts(deltas)}

    primary = row(registration.outcome)
    test = paired_t(primary["deltas"], registration.side)
    starts = [run.record.get("started_at") for run in (*compared[registration.group], *compared[registration.baseline])]
    return {
        "registration": asdict(registration),
        "compared_at": document["compared_at"],
        "held_out_at": document["held_out_at"],
        "seeds": sorted(registration.seeds),
        "first_run_started_at": iso(min(starts)) if all(starts) else None,
        "primary": {**primary, "t_test": asdict(test), "rejects": test.p < registration.alpha,
                    "sign_test_two_sided": sign_test_two_sided(primary["higher"], primary["lower"])},
        "secondary": [row(quantity) for quantity in registration.secondary],
        "events": {name: by_name[name]["events"] for name in (registration.baseline, registration.group)},
    }


# what the quantities a registration names mean (stapo.runs.summary), and the digits they are written with
LABELS = {
    "final_acc": ("held-out accuracy at the compared step", 4),
    "best_acc": ("best held-out accuracy of the trained validation steps", 4),
    "late_reward": ("train reward, last 10 steps", 4),
    "entropy_last": ("mean entropy of a response token at the compared step", 4),
    "entropy_peak": ("largest mean entropy of a step", 4),
    "tail_mass": ("filler mass a position, mean over steps", 6),
    "tail_mass_late": ("filler mass a position, last 10 steps", 6),
}


def label(quantity: str) -> tuple[str, int]:
    """(what ``quantity`` is, its digits); a further decoding's accuracy (``final_acc@T0.7``) as its setting's."""
    name, _, decoding = quantity.partition("@")
    text, digits = LABELS.get(name, (name, 4))
    return (f"{text} at decoding {decoding}" if decoding else text), digits


def render(result: dict) -> str:
    """registered-test.md: the registered test's result, every number from ``result``."""
    reg, primary = result["registration"], result["primary"]
    test = primary["t_test"]
    side = {"greater": f"one-sided ({reg['group']} higher)", "less": f"one-sided ({reg['group']} lower)",
            "two-sided": "two-sided"}[reg["side"]]
    verdict = "confirmed" if primary["rejects"] else "not confirmed"
    text, digits = label(reg["outcome"])
    seeds = ", ".join(map(str, result["seeds"]))
    title = f"# The registered test: {reg['group']} minus {reg['baseline']}, {reg['outcome']}"
    order = (f"Registered by commit {reg['registered_by']} ({reg['registered_at']}); the first run started at "
             f"{result['first_run_started_at']}. Seeds {seeds}, as registered. Written by `python -m "
             "stapo.runs.registered` (stapo/runs/registered.py) from the runs under `runs/`:")
    outcome = (f"**Primary outcome**: `{reg['outcome']}` ({text}; held-out step {result['held_out_at']}), paired by "
               f"seed. Mean difference {primary['mean']:+.{digits}f} ± {primary['se']:.{digits}f} (SE over "
               f"{test['n']} seeds); paired t = {test['t']:.3f} on {test['df']} degrees of freedom, {side} p = "
               f"{test['p']:.4f} at alpha {reg['alpha']:g}: **{verdict}**.")
    per_seed_line = (f"Per seed ({seeds}): {', '.join(f'{d:+.{digits}f}' for d in primary['deltas'])}; {reg['group']} "
                     f"higher in {primary['higher']}, lower in {primary['lower']}, equal in {primary['equal']}; "
                     f"two-sided sign test (ties left out) p = {primary['sign_test_two_sided']:.4f}.")
    secondary = (f"**Secondary rows** (registered without a test of their own): {reg['group']} minus "
                 f"{reg['baseline']}, paired by seed, mean ± SE; the primary outcome first.")
    lines = [title, "", order, "", "```bash", result["command"], "```", "", outcome, per_seed_line, "", secondary, "",
             f"| quantity | {reg['baseline']} | {reg['group']} | paired difference | seeds higher / lower / equal |",
             "|---|---|---|---|---|"]
    for row in [primary, *result["secondary"]]:
        what, n = label(row["quantity"])
        lines.append(f"| {what} (`{row['quantity']}`) | {row['baseline_mean']:.{n}f} | {row['group_mean']:.{n}f} | "
                     f"{row['mean']:+.{n}f} ± {row['se']:.{n}f} | {row['higher']} / {row['lower']} / {row['equal']} |")
    lines += ["", "Entropy events by stapo/runs/events.py's rule: the runs with one, of each group's runs.", ""]
    for name, events in result["events"].items():
        found = [f"{kind} {e['runs']} of {e['of']}" + (f" (seed {', '.join(map(str, e['seeds']))})"
                                                       if e["seeds"] else "") for kind, e in events.items()]
        lines.append(f"- {name}: {'; '.join(found)}")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stapo.runs.registered", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("set_dir", type=Path, help="the set's folder (results/<set>), its runs under runs/")
    parser.add_argument("--group", required=True, help="the group tested, as comparison.md names it")
    parser.add_argument("--baseline", required=True, help="the group it is paired with, seed by seed")
    parser.add_argument("--outcome", required=True, help="the registered quantity (stapo.runs.summary), e.g. final_acc")
    parser.add_argument("--side", required=True, choices=SIDES, help="the registered side of the test")
    parser.add_argument("--alpha", required=True, type=float, help="the registered level, in (0, 1)")
    parser.add_argument("--seeds", required=True, help="the registered seeds, comma-separated")
    parser.add_argument("--secondary", default="", help="the registered secondary quantities, comma-separated")
    parser.add_argument("--registered-by", required=True, help="the commit that registered the test")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 < args.alpha < 1:
        parser.error(f"--alpha must be in (0, 1), got {args.alpha}")
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    secondary = [quantity for quantity in args.secondary.split(",") if quantity]
    try:
        registration = Registration(args.group, args.baseline, args.outcome, args.side, args.alpha, seeds, secondary,
                                    args.registered_by, commit_time(args.registered_by, args.set_dir))
        result = {"command": "python -m stapo.runs.registered " + shlex.join(argv),
                  **run_registered(registration, args.set_dir / "runs")}
    except RegisteredTestError as error:
        print(f"stapo.runs.registered: error: {error}", file=sys.stderr)
        return 2
    (args.set_dir / "registered-test.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (args.set_dir / "registered-test.md").write_text(render(result), encoding="utf-8")
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
