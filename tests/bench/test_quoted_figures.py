"""Every figure results/README.md, README.md (and docs/findings.md, where README's narrative moves) and docs/*.md
quote of a recorded set is recomputed here from the set's files, and no figure stands in those docs unchecked.

Each entry of ``QUOTES`` is a piece of a doc with ``{}`` where a figure stands and the figures recomputed from the
files (``comparison.json``, ``registered-test.json``, the runs' records, the benchmarks' measurement files); the doc
must contain the piece with those figures filled in (line breaks aside). Each entry names its doc by a constant; an
entry of README.md is also found in docs/findings.md. Rounding is Python's (``format``), as the tables are written.

What counts as a quoted figure (``FIGURE``): a number written with a decimal point (``0.013``, ``+0.014``,
``-0.0273``, ``18.7x``, ``0.030 %``), since every value the bench measures (accuracy, reward, entropy, mass, share,
p-value, t, ratio) is written with one, and a count written ``k of n`` (``9 of the 10 seeds``, ``5 of 8 runs``). Plain
integers are settings or sizes (steps, seeds, dates, sample counts, issue numbers, commit hashes) and are not figures.
Where: every paragraph of results/README.md and docs/findings.md, and each paragraph of README.md and the other
docs/*.md that names a recorded set (a folder of results/). Code spans, fenced blocks and link targets are not text.
How it knows a figure is checked: the figure lies inside a match of one of ``QUOTES``' filled-in pieces for that doc;
or inside a match of ``SETTINGS`` (a run's settings written as numbers: decodings, thresholds, clip ranges); or it is in
``OUTSIDE`` (figures of the paper or of measurements outside the project, each said so). Anything else fails
``test_every_figure_in_the_docs_is_one_the_test_recomputes``, naming the figure and its context. Fast: no trainer,
reads the JSON in ``results/``.
"""

from __future__ import annotations

import json
import re
from functools import cache
from math import comb
from pathlib import Path

import pytest

from stapo.runs.archive import read_json
from stapo.runs.events import fisher_two_sided
from stapo.runs.registered import student_t_sf

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
R = "results/README.md"
M = "README.md"
# README.md's research narrative, moved there verbatim: README's pieces are found there too
FINDINGS = "docs/findings.md"
REGISTRATION = "docs/registration.md"


@cache
def load(folder: str) -> dict:
    return read_json(RESULTS / folder / "comparison.json")


def group(folder: str, name: str) -> dict:
    return next(g for g in load(folder)["groups"] if g["group"] == name)


def paired_group(folder: str, name: str) -> dict:
    return next(g for g in load(folder)["paired"]["groups"] if g["group"] == name)


def num(value: float, digits: int, sign: bool = False) -> str:
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def stat(folder: str, name: str, quantity: str, digits: int = 3, sign: bool = False, scale: float = 1.0) -> str:
    """``mean ± se`` of a group's quantity, as comparison.md writes it (times ``scale``: 100 for a share in %)."""
    s = group(folder, name)["stats"][quantity]
    return f"{num(scale * s['mean'], digits, sign)} ± {scale * s['se']:.{digits}f}"


def mean(folder: str, name: str, quantity: str, digits: int = 3, scale: float = 1.0) -> str:
    return num(scale * group(folder, name)["stats"][quantity]["mean"], digits)


def paired(folder: str, name: str, quantity: str, digits: int = 3, sign: bool = True) -> str:
    d = paired_group(folder, name)["diff"][quantity]
    return f"{num(d['mean'], digits, sign)} ± {d['se']:.{digits}f}"


def t_value(folder: str, name: str, quantity: str, digits: int = 1) -> str:
    d = paired_group(folder, name)["diff"][quantity]
    return num(abs(d["mean"]) / d["se"], digits)


def per_seed(folder: str, name: str, quantity: str, digits: int = 3) -> list[str]:
    return [num(run[quantity], digits) for run in group(folder, name)["runs"]]


def seed_deltas(folder: str, name: str, quantity: str) -> list[float]:
    """Per seed, the group's value minus the paired baseline's."""
    base = {run["seed"]: run for run in group(folder, load(folder)["paired"]["baseline"])["runs"]}
    return [run[quantity] - base[run["seed"]][quantity] for run in group(folder, name)["runs"]]


def paired_vs(folder: str, name: str, base: str, quantity: str, digits: int = 3, scale: float = 1.0) -> str:
    """``mean ± se`` of the group minus ``base`` seed by seed (times ``scale``: 100 for a share in %), for a pair the
    file's paired table does not hold."""
    others = {run["seed"]: run[quantity] for run in group(folder, base)["runs"]}
    found = [scale * (run[quantity] - others[run["seed"]]) for run in group(folder, name)["runs"]
             if run["seed"] in others]
    mean_ = sum(found) / len(found)
    se = (sum((d - mean_) ** 2 for d in found) / (len(found) - 1) / len(found)) ** 0.5
    return f"{num(mean_, digits, True)} ± {se:.{digits}f}"


def deltas(folder: str, name: str, quantity: str, digits: int = 3, sign: bool = True) -> list[str]:
    return [num(value, digits, sign) for value in seed_deltas(folder, name, quantity)]


def entropy_at(folder: str, name: str, step: int, digits: int = 3) -> str:
    trajectory = group(folder, name)["entropy_trajectory"]
    return num(trajectory["mean"][trajectory["step"].index(step)], digits)


def run_of(folder: str, name: str, seed: int) -> dict:
    return next(run for run in group(folder, name)["runs"] if run["seed"] == seed)


def series(folder: str, name: str, seed: int, key: str, step: int, digits: int = 3) -> str:
    return num(run_of(folder, name, seed)["series"][key][str(step)], digits)


def run_value(folder: str, name: str, seed: int, quantity: str, digits: int = 3) -> str:
    return num(run_of(folder, name, seed)[quantity], digits)


def lower_in(folder: str, name: str, quantity: str) -> str:
    """``k of n``: in how many of the paired seeds the group's value is below the baseline's."""
    found = seed_deltas(folder, name, quantity)
    return f"{sum(delta < 0 for delta in found)} of {len(found)}"


def higher_in(folder: str, name: str, quantity: str) -> str:
    """``k of n``: in how many of the paired seeds the group's value is above the baseline's."""
    found = seed_deltas(folder, name, quantity)
    return f"{sum(delta > 0 for delta in found)} of {len(found)}"


def clipped_steps(folder: str, name: str) -> tuple[int, int]:
    """(steps with any clipped token, steps logged) over a group's runs."""
    values = [v for run in group(folder, name)["runs"] for v in run["series"]["pg_clipfrac"].values() if v is not None]
    return sum(v > 0 for v in values), len(values)


def pct(folder: str, name: str, quantity: str, digits: int) -> str:
    return mean(folder, name, quantity, digits, scale=100.0)


TE, A8, TA, LH, S5, S60, SM = (
    "testbed-two-epochs", "testbed-addition-8algos", "testbed-threshold-ablation", "testbed-long-horizon",
    "testbed-addition-5seeds", "testbed-addition-60steps", "smollm2-arithmetic-4steps",
)
LR, RERUN = "testbed-lr5e-5", "testbed-lr5e-5-replication"
TB = "tailbed-t1"
# results/README.md's tables of TB: (row title, quantity, digits), the groups in their column order
TB_ROWS = [
    ("held-out acc, step 100", "final_acc", 3),
    ("best held-out acc (steps 25-100)", "best_acc", 3),
    ("train reward, last 10 steps", "late_reward", 3),
    ("mean entropy, step 100", "entropy_last", 4),
    ("largest mean entropy of a step", "entropy_peak", 4),
    ("largest position entropy of a step", "entropy_max_peak", 3),
    ("unused mass a position, mean over steps", "tail_mass", 6),
    ("unused mass a position, last 10 steps", "tail_mass_late", 6),
    ("unused mass, largest position of a step", "tail_mass_peak", 4),
    ("S2T tokens' share of the exact grad norm", "norm_share", 4),
]
TB_GROUPS = ("algo=justrl", "algo=grpo", "algo=entropy20", "algo=stapo", "algo=taco", "algo=lopti")
TB_CELL = " {} |"  # one column of a TB table row; the paired table has no column for the baseline
TD = "tailbed-decodings"
TD_QUOTES = [
    (R, "| held-out acc at T=1 / top-p=1, step 0 | {} | {} | |", stat(TD, "algo=justrl", "initial_acc"),
     stat(TD, "algo=stapo", "initial_acc")),
    (R, "| held-out acc at T=1 / top-p=1, step 100 | {} | {} | {} |", stat(TD, "algo=justrl", "final_acc"),
     stat(TD, "algo=stapo", "final_acc"), paired(TD, "algo=stapo", "final_acc")),
    (R, "| held-out acc at T=0.7 / top-p=0.9, step 0 | {} | {} | |", stat(TD, "algo=justrl", "initial_acc@T0.7"),
     stat(TD, "algo=stapo", "initial_acc@T0.7")),
    (R, "| held-out acc at T=0.7 / top-p=0.9, step 100 | {} | {} | {} |", stat(TD, "algo=justrl", "final_acc@T0.7"),
     stat(TD, "algo=stapo", "final_acc@T0.7"), paired(TD, "algo=stapo", "final_acc@T0.7")),
    (R, "({} against\n{} at T=1)", mean(TD, "algo=justrl", "initial_acc@T0.7"),
     mean(TD, "algo=justrl", "initial_acc")),
    (M, "({} held-out at step 0) and STAPO ends {} below JustRL", mean(TD, "algo=justrl", "initial_acc@T0.7"),
     paired(TD, "algo=stapo", "final_acc@T0.7", sign=False).lstrip("-")),
    (R, "STAPO ends {} below JustRL\n(lower in {} seeds", paired(TD, "algo=stapo", "final_acc@T0.7", sign=False)
     .lstrip("-"), lower_in(TD, "algo=stapo", "final_acc@T0.7")),
    (R, "a small difference near the ceiling, against {} at T=1", paired(TD, "algo=stapo", "final_acc")),
]
TL = "tailbed-lr5e-5"
# results/README.md's table of TL: (row title, quantity, digits); JustRL, STAPO, then the paired difference
TL_ROWS = [
    ("held-out acc, step 60", "final_acc", 3),
    ("train reward, last 10 steps", "late_reward", 3),
    ("mean entropy, step 60", "entropy_last", 4),
    ("largest mean entropy of a step", "entropy_peak", 4),
    ("largest position entropy of a step", "entropy_max_peak", 3),
    ("filler mass a position, mean over steps", "tail_mass", 6),
    ("filler mass, largest position of a step", "tail_mass_peak", 4),
    ("S2T tokens' share of the exact grad norm", "norm_share", 4),
]


def entropy_events(folder: str, name: str) -> dict[int, dict[str, list[int]]]:
    """Per seed, the steps of each entropy event by the rule in results/tailbed-lr5e-5/COMMAND: from step 2, mean
    entropy above 2x the run's step-1 value (explosion) or below half of it (collapse); an explosion is tail-driven
    when the filler mass a position is above 10x its step-1 value at that step."""
    found = {}
    for run in group(folder, name)["runs"]:
        entropy = {int(k): v for k, v in run["series"]["entropy"].items()}
        tail = {int(k): v for k, v in run["series"]["tail_mass"].items()}
        later = sorted(step for step in entropy if step >= 2)
        up = [step for step in later if entropy[step] > 2 * entropy[1]]
        found[run["seed"]] = {
            "explosion": up, "collapse": [step for step in later if entropy[step] < entropy[1] / 2],
            "tail": [step for step in up if tail[step] > 10 * tail[1]]}
    return found


def runs_with(events: dict[int, dict[str, list[int]]], kind: str) -> int:
    """How many runs of ``entropy_events``' answer had at least one event of ``kind``."""
    return sum(bool(e[kind]) for e in events.values())


def sign_test_two_sided(higher: int, lower: int) -> float:
    """Two-sided sign test, ties left out: P(a split at least this uneven) under a fair coin."""
    n, k = higher + lower, max(higher, lower)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k, n + 1)) / 2 ** n)


def over_step_1(folder: str, name: str, seed: int, key: str) -> float:
    """A run's largest logged ``key`` of a step over its step-1 value."""
    found = run_of(folder, name, seed)["series"][key]
    return max(found.values()) / found["1"]


def tail_ratio(folder: str, name: str, seed: int) -> float:
    """A run's largest filler mass a position over its step-1 value."""
    return over_step_1(folder, name, seed, "tail_mass")


def recorded_events(folder: str, groups) -> dict[str, dict[int, dict[str, list[int]]]]:
    """Each group's ``entropy_events``, asserting the file's own event counts are the test's."""
    events = {name: entropy_events(folder, name) for name in groups}
    for name in groups:
        recorded = group(folder, name)["events"]
        for kind, mine in (("explosion", "explosion"), ("tail_driven", "tail"), ("collapse", "collapse")):
            assert recorded[kind]["runs"] == runs_with(events[name], mine)
    return events


def and_list(items: list) -> str:
    """``1, 2 and 3``."""
    words = [str(item) for item in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def above_in_every_seed(folder: str, name: str, other: str, quantity: str) -> int:
    """The number of seeds, asserting the group's value is above ``other``'s in every one of them."""
    others = {run["seed"]: run[quantity] for run in group(folder, other)["runs"]}
    runs = group(folder, name)["runs"]
    assert all(run[quantity] > others[run["seed"]] for run in runs)
    return len(runs)


# results/README.md's event tables: (row title, entropy_events' kind)
EVENT_ROWS = (("an entropy explosion", "explosion"), ("a tail-driven explosion", "tail"),
              ("an entropy collapse", "collapse"))


def counted(events: dict[int, dict[str, list[int]]], kind: str) -> str:
    """``k of n``: the runs of ``entropy_events``' answer with an event of ``kind``, of all its runs."""
    return f"{runs_with(events, kind)} of {len(events)}"


def _tl_events() -> list[tuple]:
    justrl, stapo = entropy_events(TL, "algo=justrl"), entropy_events(TL, "algo=stapo")
    grpo = entropy_events(TL, "algo=grpo")
    exploded = [seed for seed, e in justrl.items() if e["explosion"]]
    tail_driven = [seed for seed, e in justrl.items() if e["tail"]]
    others = sorted(tail_ratio(TL, "algo=justrl", seed) for seed in exploded if seed not in tail_driven)
    assert justrl[3]["explosion"] == list(range(19, 61)) and tail_driven == [2, 3]

    def p_value(kind: str, digits: int, events: dict = justrl) -> str:
        """Fisher's exact test, two-sided: COMMAND fixed the event rule, not a test or a side."""
        p = fisher_two_sided(runs_with(events, kind), len(events), runs_with(stapo, kind), len(stapo))
        return f"{p:.{digits}f}"

    def peak(seed: int) -> str:
        return num(max(run_of(TL, "algo=justrl", seed)["series"]["tail_mass"].values()), 5)

    return [
        *[(R, f"| {row} | {{}} | {{}} | {{}} |", counted(justrl, kind), counted(stapo, kind), counted(grpo, kind))
          for row, kind in EVENT_ROWS],
        (R, "explosion, two-sided: p = {}). JustRL's seeds {}, {}, {}, {} and {} explode; seed 3 from step 19 to the "
            "end ({} at step 60, against {} at step 1)", p_value("explosion", 3), *exploded,
         series(TL, "algo=justrl", 3, "entropy", 60, 4), series(TL, "algo=justrl", 3, "entropy", 1, 4)),
        (R, "(seeds 2 and 3: the filler mass a position reaches {} and {}, {}x and {}x step 1), too few alone to tell "
            "the algorithms apart (p = {})", peak(2), peak(3),
         *[num(tail_ratio(TL, "algo=justrl", s), 1) for s in (2, 3)], p_value("tail", 2)),
        (R, "the filler mass peaked at {}-{}x step 1", num(others[0], 1), num(others[-1], 1)),
        (R, "STAPO's filler mass never passed {}x its step-1 value",
         num(max(tail_ratio(TL, "algo=stapo", s) for s in stapo), 1)),
        (M, "JustRL's entropy more than doubles in {} runs and STAPO's in none (two-sided Fisher p = {}, chosen after "
            "the runs;",
         counted(justrl, "explosion"), p_value("explosion", 3)),
        (M, "accuracy is not told apart ({})", paired(TL, "algo=stapo", "final_acc")),
        (M, "GRPO (JustRL plus a KL term of 0.001) explodes in {} runs, {} of them by the tail (against STAPO "
            "two-sided p = {}), and ends below JustRL in every seed ({})", counted(grpo, "explosion"),
         runs_with(grpo, "tail"), p_value("explosion", 4, grpo), paired(TL, "algo=grpo", "final_acc")),
        (R, "GRPO explodes in {} runs (seeds {}), {} of them tail-driven by the rule (seeds {}: the filler mass a "
            "position reaches {}x, {}x, {}x and {}x its step-1 value); STAPO in none",
         counted(grpo, "explosion"), and_list([seed for seed, e in grpo.items() if e["explosion"]]),
         runs_with(grpo, "tail"), and_list([seed for seed, e in grpo.items() if e["tail"]]),
         *[num(tail_ratio(TL, "algo=grpo", seed), 1) for seed, e in grpo.items() if e["tail"]]),
        (R, "GRPO against STAPO, two-sided\n  Fisher p = {} for an explosion, {} for a tail-driven one",
         p_value("explosion", 4, grpo), p_value("tail", 3, grpo)),
        (R, "above STAPO's in each of the {} seeds ({})",
         above_in_every_seed(TL, "algo=grpo", "algo=stapo", "entropy_peak"),
         paired_vs(TL, "algo=grpo", "algo=stapo", "entropy_peak", 4)),
        (R, "Held-out at step 60 {} against JustRL (lower in {} seeds: {}; a two-sided sign test gives p = {})",
         paired(TL, "algo=grpo", "final_acc"), lower_in(TL, "algo=grpo", "final_acc"),
         ", ".join(deltas(TL, "algo=grpo", "final_acc", sign=False)), f"{sign_test_two_sided(len(grpo), 0):.4f}"),
        (R, "accuracy does not tell STAPO and\n  JustRL apart ({})", paired(TL, "algo=stapo", "final_acc")),
        (R, "JustRL apart: {} in the largest position entropy, {} in the filler mass)",
         paired(TL, "algo=grpo", "entropy_max_peak"), paired(TL, "algo=grpo", "tail_mass", 6)),
    ]


TL_QUOTES = [
    (R, "| held-out acc, step 0 | {} | {} | {} | | |", stat(TL, "algo=justrl", "initial_acc"),
     stat(TL, "algo=stapo", "initial_acc"), stat(TL, "algo=grpo", "initial_acc")),
    *[(R, f"| {title} | {{}} | {{}} | {{}} | {{}} | {{}} |", stat(TL, "algo=justrl", quantity, digits),
       stat(TL, "algo=stapo", quantity, digits), stat(TL, "algo=grpo", quantity, digits),
       paired(TL, "algo=stapo", quantity, digits), paired(TL, "algo=grpo", quantity, digits))
      for title, quantity, digits in TL_ROWS],
    (R, "(from {} at step 0 to {}, {} and {} at step 60, where JustRL at the preset's lr gains to {} by step 100",
     mean(TL, "algo=justrl", "initial_acc"), mean(TL, "algo=justrl", "final_acc"), mean(TL, "algo=stapo", "final_acc"),
     mean(TL, "algo=grpo", "final_acc"), mean(TB, "algo=justrl", "final_acc")),
    (R, "no token of either was clipped in any of the {} steps", clipped_steps(TL, "algo=grpo")[1]),
    *_tl_events(),
]
LX = "tailbed-long-horizon-xeon"
LX_GROUPS = ("algo=justrl", "algo=stapo", "algo=grpo")
# results/README.md's table of LX: (row title, quantity, digits); JustRL, STAPO, GRPO, then the two paired differences
LX_ROWS = [
    ("held-out acc, step 500", "final_acc", 3),
    ("train reward, last 10 steps", "late_reward", 3),
    ("mean entropy, step 500", "entropy_last", 4),
    ("largest mean entropy of a step", "entropy_peak", 4),
    ("largest position entropy of a step", "entropy_max_peak", 3),
    ("filler mass a position, mean over steps", "tail_mass", 6),
    ("filler mass a position, last 10 steps", "tail_mass_late", 6),
    ("filler mass, largest position of a step", "tail_mass_peak", 4),
    ("S2T tokens' share of the exact grad norm", "norm_share", 4),
]


def series_mean(folder: str, name: str, key: str, step: int, digits: int = 3) -> str:
    """A logged quantity at one step, averaged over the group's runs."""
    values = [run["series"][key][str(step)] for run in group(folder, name)["runs"]]
    return num(sum(values) / len(values), digits)


def first_collapses(folder: str, name: str) -> list[int]:
    """Per seed (in seed order), the first step whose mean entropy is below half the run's step-1 value."""
    events = entropy_events(folder, name)
    return [events[seed]["collapse"][0] for seed in sorted(events)]


def _lx_quotes() -> list[tuple]:
    events = recorded_events(LX, LX_GROUPS)
    runs = [run for name in LX_GROUPS for run in group(LX, name)["runs"]]
    assert len(runs) == 9 and all(run["last_step"] == 500 for run in runs)
    exploded = run_of(LX, "algo=justrl", 3)
    calm_ratio = max(run["entropy_peak"] / run["entropy_first"] for run in runs if run is not exploded)
    rising = sum(run["series"]["held_out_acc"]["500"] > run["series"]["held_out_acc"]["150"] for run in runs)
    return [
        (R, "| held-out acc, step 0 | {} | {} | {} | | |", *[stat(LX, g, "initial_acc") for g in LX_GROUPS]),
        (R, "| mean entropy, step 1 | {} | {} | {} | | |", *[stat(LX, g, "entropy_first", 4) for g in LX_GROUPS]),
        *[(R, f"| {title} | {{}} | {{}} | {{}} | {{}} | {{}} |", *[stat(LX, g, quantity, digits) for g in LX_GROUPS],
           paired(LX, "algo=stapo", quantity, digits), paired(LX, "algo=grpo", quantity, digits))
          for title, quantity, digits in LX_ROWS],
        *[(R, f"| {row} | {{}} | {{}} | {{}} |", *[counted(events[g], kind) for g in LX_GROUPS])
          for row, kind in EVENT_ROWS],
        (R, "in the other eight runs the largest mean entropy of a step stayed within {}x of the run's step-1 value",
         num(calm_ratio, 2)),
        (R, "first at steps {} (JustRL), {} (STAPO) and {} (GRPO)",
         *[", ".join(map(str, first_collapses(LX, g))) for g in LX_GROUPS]),
        (R, "held-out accuracy rose from {} at step 150 to {} at step 500 (JustRL's mean; STAPO's {} to {}, GRPO's {} "
            "to {}), higher at step 500 than at step 150 in {} of the 9 runs",
         *[f for g in LX_GROUPS for f in (series_mean(LX, g, "held_out_acc", 150),
                                          series_mean(LX, g, "held_out_acc", 500))], rising),
    ]


def _lx_bullets() -> list[tuple]:
    events = entropy_events(LX, "algo=justrl")
    exploded = {seed: e["explosion"] for seed, e in events.items() if e["explosion"]}
    assert list(exploded) == [3] and exploded[3] == [184, 185] and not any(e["tail"] for e in events.values())
    ratios = {name: [tail_ratio(LX, name, run["seed"]) for run in group(LX, name)["runs"]] for name in LX_GROUPS}
    tail = run_of(LX, "algo=justrl", 3)["series"]["tail_mass"]
    assert max(tail, key=tail.get) == "185"
    stress = entropy_events(TL, "algo=justrl")
    accuracy = group(LX, "algo=stapo")["stats"]["final_acc"]["mean"]
    below_line = sorted(tail_ratio(TL, "algo=justrl", seed) for seed, e in stress.items()
                        if e["explosion"] and not e["tail"])
    return [
        (R, "JustRL's seed 3 passed twice its step-1 entropy at steps 184 and 185 ({} at step 184, against {} at step "
            "1); its filler mass a position was {}x and {}x its step-1 value at those two steps, its largest of the "
            "run, just under the rule's 10x line", series(LX, "algo=justrl", 3, "entropy", 184, 4),
         series(LX, "algo=justrl", 3, "entropy", 1, 4), *[num(tail[step] / tail["1"], 1) for step in ("184", "185")]),
        (R, "The largest filler mass a position of any step, over the run's step-1 value, seeds 1, 2 and 3: JustRL {}, "
            "GRPO {}, STAPO {}", *[", ".join(num(r, 1) + "x" for r in ratios[name])
                                   for name in ("algo=justrl", "algo=grpo", "algo=stapo")]),
        (R, "STAPO's filler mass a position over the run is lower than JustRL's in {} seeds ({}), the S2T tokens' "
            "share of the exact grad norm lower in {} ({}), its largest mean entropy of a step lower in {} ({})",
         lower_in(LX, "algo=stapo", "tail_mass"), paired(LX, "algo=stapo", "tail_mass", 6),
         lower_in(LX, "algo=stapo", "norm_share"), paired(LX, "algo=stapo", "norm_share", 4),
         lower_in(LX, "algo=stapo", "entropy_peak"), paired(LX, "algo=stapo", "entropy_peak", 4)),
        (R, "STAPO minus JustRL {} at step 500 (per seed {}), GRPO minus JustRL {} (per seed {})",
         paired(LX, "algo=stapo", "final_acc"), ", ".join(deltas(LX, "algo=stapo", "final_acc")),
         paired(LX, "algo=grpo", "final_acc"), ", ".join(deltas(LX, "algo=grpo", "final_acc"))),
        (R, "no token was clipped in any of the {:,} steps of its runs", clipped_steps(LX, "algo=grpo")[1]),
        (R, "as the lr stress's JustRL runs with {}-{}x were not", num(below_line[0], 1), num(below_line[-1], 1)),
        (M, "and STAPO ends above JustRL in each of the three seeds ({} held-out at step 500), too few seeds to call",
         paired(LX, "algo=stapo", "final_acc")),
        (R, "STAPO ends above JustRL in {} seeds: a sign test (two-sided) has p = {} with three, and one evaluation of "
            "512 samples at this accuracy has a binomial standard error of about {}",
         higher_in(LX, "algo=stapo", "final_acc"), f"{sign_test_two_sided(3, 0):.3f}",
         num((accuracy * (1 - accuracy) / 512) ** 0.5, 3)),
    ]


def six_algorithm_tables(folder: str, rows: list[tuple[str, str, int]]) -> list[tuple]:
    """The rows of a tailbed comparison's two tables of the six algorithms (tailbed-t1's layout): each group's
    ``mean ± se``, then each group minus JustRL, paired by seed."""
    return [
        *[(R, f"| {title} |" + TB_CELL * len(TB_GROUPS), *[stat(folder, g, quantity, digits) for g in TB_GROUPS])
          for title, quantity, digits in [("held-out acc, step 0", "initial_acc", 3), *rows]],
        *[(R, f"| {title} |" + TB_CELL * (len(TB_GROUPS) - 1),
           *[paired(folder, g, quantity, digits) for g in TB_GROUPS[1:]])
          for title, quantity, digits in rows],
    ]


TB_QUOTES = [
    *six_algorithm_tables(TB, TB_ROWS),
    (R, "STAPO silenced {} % of the response tokens", pct(TB, "algo=stapo", "mask_ratio", 3)),
    (R, "the wall times ({}-{} min a run)",
     *[str(round(f(r["wall_s"] for g in load(TB)["groups"] for r in g["runs"]) / 60)) for f in (min, max)]),
    (R, "STAPO's filler mass a position, averaged over the 100 steps, is lower in each seed ({}), the largest filler "
        "mass at any single position lower in each seed ({}), and the S2T tokens' share of the positive tokens' exact "
        "gradient norm lower in each seed ({}); the largest mean entropy of a step is lower in {} seeds ({})",
     *[paired(TB, "algo=stapo", q, d) for q, d in (("tail_mass", 6), ("tail_mass_peak", 4), ("norm_share", 4))],
     lower_in(TB, "algo=stapo", "entropy_peak"), paired(TB, "algo=stapo", "entropy_peak", 4)),
    (R, "the filler mass over the last 10 steps is lower in {} seeds ({}), the mean entropy at step 100 lower in {} "
        "({})", lower_in(TB, "algo=stapo", "tail_mass_late"), paired(TB, "algo=stapo", "tail_mass_late", 6),
     lower_in(TB, "algo=stapo", "entropy_last"), paired(TB, "algo=stapo", "entropy_last", 4)),
    (R, "Held-out at step 100 {} against JustRL (lower in {} seeds), train reward over the last 10 steps {} (lower "
        "in each seed)", paired(TB, "algo=entropy20", "final_acc"), lower_in(TB, "algo=entropy20", "final_acc"),
     paired(TB, "algo=entropy20", "late_reward")),
    (R, "more mass on the fillers ({} a position over the run, JustRL {})", mean(TB, "algo=entropy20", "tail_mass", 6),
     mean(TB, "algo=justrl", "tail_mass", 6)),
    (R, "in seed 4 its mean entropy climbed from {} at step 1 to {} at step 100 (JustRL's {}), its filler mass {} a "
        "position over the last 10 steps (JustRL's {})", run_value(TB, "algo=entropy20", 4, "entropy_first", 4),
     run_value(TB, "algo=entropy20", 4, "entropy_last", 4), run_value(TB, "algo=justrl", 4, "entropy_last", 4),
     run_value(TB, "algo=entropy20", 4, "tail_mass_late", 6), run_value(TB, "algo=justrl", 4, "tail_mass_late", 6)),
    (R, "In seed 4 GRPO's entropy ended at {} and its filler mass over the last 10 steps at {} (JustRL's {} and {})",
     run_value(TB, "algo=grpo", 4, "entropy_last", 4), run_value(TB, "algo=grpo", 4, "tail_mass_late", 6),
     run_value(TB, "algo=justrl", 4, "entropy_last", 4), run_value(TB, "algo=justrl", 4, "tail_mass_late", 6)),
    (M, "20-Entropy loses held-out accuracy ({} against JustRL, lower in {} seeds) and in one seed its entropy "
        "climbed from {} to {} over the 100 steps", paired(TB, "algo=entropy20", "final_acc"),
     lower_in(TB, "algo=entropy20", "final_acc"),
     run_value(TB, "algo=entropy20", 4, "entropy_first", 4), run_value(TB, "algo=entropy20", 4, "entropy_last", 4)),
    (R, "STAPO against JustRL {} (per seed {}), against GRPO {}", paired(TB, "algo=stapo", "final_acc"),
     ", ".join(deltas(TB, "algo=stapo", "final_acc")), paired_vs(TB, "algo=stapo", "algo=grpo", "final_acc")),
    (R, "Against JustRL, TACO's filler mass a position over the run is {} (lower in {} seeds), over the last 10 steps "
        "{} (lower in {}), its largest single-position filler mass {} (lower in {}), the S2T tokens' share of the "
        "exact gradient norm {} (lower in {}) and its mean entropy at step 100 {} (lower in {})",
     *[x for q, d in (("tail_mass", 6), ("tail_mass_late", 6), ("tail_mass_peak", 4), ("norm_share", 4),
                      ("entropy_last", 4))
       for x in (paired(TB, "algo=taco", q, d), lower_in(TB, "algo=taco", q))]),
    (R, "TACO minus STAPO, seed by seed: filler mass over the run {}, over the last 10 steps {}, exact grad-norm share "
        "{}", paired_vs(TB, "algo=taco", "algo=stapo", "tail_mass", 6),
     paired_vs(TB, "algo=taco", "algo=stapo", "tail_mass_late", 6),
     paired_vs(TB, "algo=taco", "algo=stapo", "norm_share", 4)),
    (R, "TACO's held-out accuracy at step 100 is {} against JustRL (per seed {})", paired(TB, "algo=taco", "final_acc"),
     ", ".join(deltas(TB, "algo=taco", "final_acc"))),
    (R, "Lopti's held-out accuracy at step 100 is {} against JustRL (per seed {}), its train reward over the last 10 "
        "steps {}", paired(TB, "algo=lopti", "final_acc"), ", ".join(deltas(TB, "algo=lopti", "final_acc")),
     paired(TB, "algo=lopti", "late_reward")),
    (R, "its largest mean entropy of a step is higher in {} seeds ({}) and its filler mass a position over the run "
        "higher in {} ({})", higher_in(TB, "algo=lopti", "entropy_peak"), paired(TB, "algo=lopti", "entropy_peak", 4),
     higher_in(TB, "algo=lopti", "tail_mass"), paired(TB, "algo=lopti", "tail_mass", 6)),
    (R, "in seed 3 its mean entropy ended at {} (JustRL's {}) and its filler mass over the last 10 steps at {} "
        "(JustRL's {})", run_value(TB, "algo=lopti", 3, "entropy_last", 4), run_value(TB, "algo=justrl", 3,
                                                                                      "entropy_last", 4),
     run_value(TB, "algo=lopti", 3, "tail_mass_late", 6), run_value(TB, "algo=justrl", 3, "tail_mass_late", 6)),
    (R, "Lopti's second update a step clipped tokens in {} of its {} steps", *clipped_steps(TB, "algo=lopti")),
    (M, "TACO's soft weight trims the tail further and to the end of the run (filler mass over the last 10 steps {} "
        "against JustRL, lower in {} seeds; held-out {}, unsettled); Lopti's second update a step raises the filler "
        "mass and the entropy (largest mean entropy of a step higher in {} seeds)",
     paired(TB, "algo=taco", "tail_mass_late", 6), lower_in(TB, "algo=taco", "tail_mass_late"),
     paired(TB, "algo=taco", "final_acc"), higher_in(TB, "algo=lopti", "entropy_peak")),
]

TX = "tailbed-decodings-xeon"
T07_STEP_100 = ("held-out acc at T=0.7 / top-p=0.9, step 100", "final_acc@T0.7", 3)


def largest_of(folder: str, name: str, seed: int, key: str, digits: int = 4) -> tuple[str, str]:
    """(value, step) of a run's largest logged ``key``."""
    found = run_of(folder, name, seed)["series"][key]
    step = max(found, key=found.get)
    return num(found[step], digits), step


def _tx_quotes() -> list[tuple]:
    events = recorded_events(TX, TB_GROUPS)
    assert [s for s, e in events["algo=justrl"].items() if e["tail"]] == [4, 5]
    assert [s for s, e in events["algo=taco"].items() if e["collapse"]] == [3, 5]
    taco_both = seed_deltas(TB, "algo=taco", "final_acc") + seed_deltas(TX, "algo=taco", "final_acc")
    higher, lower = sum(d > 0 for d in taco_both), sum(d < 0 for d in taco_both)
    assert (higher, lower, len(taco_both)) == (9, 0, 10)
    walls = [r["wall_s"] / 60 for g in load(TX)["groups"] for r in g["runs"]]
    t07_means = [group(TX, g)["stats"]["final_acc@T0.7"]["mean"] for g in TB_GROUPS]
    return [
        *six_algorithm_tables(TX, TB_ROWS + [T07_STEP_100]),
        (R, "| held-out acc at T=0.7 / top-p=0.9, step 0 |" + TB_CELL * len(TB_GROUPS),
         *[stat(TX, g, "initial_acc@T0.7") for g in TB_GROUPS]),
        *[(R, f"| {row} |" + TB_CELL * len(TB_GROUPS), *[counted(events[g], kind) for g in TB_GROUPS])
          for row, kind in EVENT_ROWS],
        (R, "the wall times, {}-{} min a run", str(round(min(walls))), str(round(max(walls)))),
        (R, "STAPO silenced {} % of the response tokens", pct(TX, "algo=stapo", "mask_ratio", 3)),
        (R, "in seed 4 the mean entropy went from {} at step 1 to {} at step 100, still rising, its filler mass a "
            "position to {}x its step-1 value; in seed 5 to {} at step {} (filler mass {}x)",
         series(TX, "algo=justrl", 4, "entropy", 1, 4), series(TX, "algo=justrl", 4, "entropy", 100, 4),
         num(tail_ratio(TX, "algo=justrl", 4), 1), *largest_of(TX, "algo=justrl", 5, "entropy"),
         num(tail_ratio(TX, "algo=justrl", 5), 1)),
        (R, "20-Entropy in seed 4 ({} at step {}, filler mass {}x), Lopti in seed 3 ({} at step {}, filler mass {}x",
         *largest_of(TX, "algo=entropy20", 4, "entropy"), num(tail_ratio(TX, "algo=entropy20", 4), 1),
         *largest_of(TX, "algo=lopti", 3, "entropy"), num(tail_ratio(TX, "algo=lopti", 3), 1)),
        (R, "STAPO's largest mean entropy of any run was {}x its step-1 value (seed 4), TACO's {}x",
         num(over_step_1(TX, "algo=stapo", 4, "entropy"), 2),
         num(max(over_step_1(TX, "algo=taco", r["seed"], "entropy") for r in group(TX, "algo=taco")["runs"]), 2)),
        (R, "(p = {}); it is the direction", num(fisher_two_sided(
            runs_with(events["algo=justrl"], "explosion"), 5, runs_with(events["algo=stapo"], "explosion"), 5), 3)),
        (R, "STAPO's filler mass a position is lower in each seed over the run ({}) and over the last 10 steps ({}), "
            "the S2T tokens' share of the exact gradient norm lower in each seed ({}), the mean entropy at step 100 "
            "lower in each seed ({}), the train reward over the last 10 steps higher in each seed ({})",
         paired(TX, "algo=stapo", "tail_mass", 6), paired(TX, "algo=stapo", "tail_mass_late", 6),
         paired(TX, "algo=stapo", "norm_share", 4), paired(TX, "algo=stapo", "entropy_last", 4),
         paired(TX, "algo=stapo", "late_reward")),
        (R, "(the mean entropy at step 100, seed by seed: {})", ", ".join(deltas(TX, "algo=stapo", "entropy_last", 4))),
        (R, "Held-out accuracy is not told apart: {} (per seed {})", paired(TX, "algo=stapo", "final_acc"),
         ", ".join(deltas(TX, "algo=stapo", "final_acc"))),
        (R, "Its filler mass a position over the run is {} against JustRL, its largest single-position entropy {}, "
            "each lower in {} seeds, and its held-out accuracy at step 100 {} (per seed {})",
         paired(TX, "algo=taco", "tail_mass", 6), paired(TX, "algo=taco", "entropy_max_peak"),
         lower_in(TX, "algo=taco", "tail_mass"), paired(TX, "algo=taco", "final_acc"),
         ", ".join(deltas(TX, "algo=taco", "final_acc"))),
        (R, "With tailbed-t1 on the AMD EPYC ({}, no seed lower) TACO is above JustRL in {} of the 10 seeds of the two "
            "builds and equal in the tenth (a two-sided sign test on the nine: p = {})",
         paired(TB, "algo=taco", "final_acc"), higher, f"{sign_test_two_sided(higher, lower):.4f}"),
        (R, "in seeds 3 and 5 it ends below half its step-1 value ({} and {} at step 100)",
         run_value(TX, "algo=taco", 3, "entropy_last", 4), run_value(TX, "algo=taco", 5, "entropy_last", 4)),
        (R, "Held-out at step 100 {} against JustRL, lower in {} seeds (tailbed-t1: {}, lower in {})",
         paired(TX, "algo=entropy20", "final_acc"), lower_in(TX, "algo=entropy20", "final_acc"),
         paired(TB, "algo=entropy20", "final_acc"), lower_in(TB, "algo=entropy20", "final_acc")),
        (R, "lower than JustRL's in {} seeds ({}), where on the AMD EPYC it was higher in {}",
         lower_in(TX, "algo=lopti", "tail_mass"), paired(TX, "algo=lopti", "tail_mass", 6),
         higher_in(TB, "algo=lopti", "tail_mass")),
        (R, "its own runs peaked at {}x and {}x their step-1 entropy (seeds 3 and 5). Held-out {}",
         num(over_step_1(TX, "algo=lopti", 3, "entropy"), 2), num(over_step_1(TX, "algo=lopti", 5, "entropy"), 2),
         paired(TX, "algo=lopti", "final_acc")),
        (R, "{} held-out at step 0, {}-{} at step 100; the largest difference from JustRL is Lopti's {} (STAPO {})",
         mean(TX, "algo=justrl", "initial_acc@T0.7"), num(min(t07_means), 3), num(max(t07_means), 3),
         paired(TX, "algo=lopti", "final_acc@T0.7"), paired(TX, "algo=stapo", "final_acc@T0.7")),
        (R, "(STAPO minus JustRL {} here, {} on the AMD EPYC)", paired(TX, "algo=stapo", "final_acc"),
         paired(TB, "algo=stapo", "final_acc")),
        (M, "20-Entropy's held-out accuracy lower ({}, {} seeds); JustRL's entropy runs away by the tail in {} runs on "
            "that build", paired(TX, "algo=entropy20", "final_acc"), lower_in(TX, "algo=entropy20", "final_acc"),
         counted(events["algo=justrl"], "tail")),
        (M, "TACO's held-out accuracy is above JustRL's in {} of the 10 seeds of the two builds and equal in the tenth "
            "({} there)", higher, paired(TX, "algo=taco", "final_acc")),
    ]



# the tau_p x q ablation, set beside the decodings set's STAPO (its centre) and JustRL (its floor) by `stapo compare`
TAX = "tailbed-threshold-ablation-xeon"
TA_VS_STAPO, TA_VS_JUSTRL = f"{TAX}/against-stapo", f"{TAX}/against-justrl"
TA_CELLS = tuple(f"tau_p={tau_p},entropy_quantile={q}" for tau_p in ("0.002", "0.02") for q in ("0.5", "1.0"))
TA_ROWS = [
    ("held-out acc, step 100", "final_acc", 3),
    T07_STEP_100,
    ("filler mass a position, mean over steps", "tail_mass", 6),
    ("filler mass a position, last 10 steps", "tail_mass_late", 6),
    ("S2T tokens' share of the exact grad norm", "norm_share", 4),
    ("largest mean entropy of a step", "entropy_peak", 4),
]
TA_MASK = ("mask ratio (% of response tokens)", "mask_ratio", 4)


def _ta_quotes() -> list[tuple]:
    groups = (*TA_CELLS, "algo=stapo", "algo=justrl")
    events = recorded_events(TA_VS_STAPO, groups)
    cell = " {} |"
    title, quantity, digits = TA_MASK
    return [
        *[(R, f"| {row} |" + cell * len(groups), *[stat(TA_VS_STAPO, g, quantity, digits) for g in groups])
          for row, quantity, digits in TA_ROWS],
        (R, f"| {title} |" + cell * len(groups), *[stat(TA_VS_STAPO, g, quantity, digits, scale=100)
                                                   for g in groups[:-1]], "-"),
        *[(R, f"| runs with {row} |" + cell * len(groups), *[counted(events[g], kind) for g in groups])
          for row, kind in EVENT_ROWS],
        *[(R, f"| {row} |" + cell * len(TA_CELLS), *[paired(TA_VS_STAPO, g, quantity, digits) for g in TA_CELLS])
          for row, quantity, digits in TA_ROWS],
        (R, f"| {title} |" + cell * len(TA_CELLS),
         *[paired_vs(TA_VS_STAPO, g, "algo=stapo", quantity, digits, 100) for g in TA_CELLS]),
        *[(R, f"| {row} |" + cell * len(TA_CELLS),
           *[paired(TA_VS_JUSTRL, g, quantity, digits) for g in TA_CELLS]) for row, quantity, digits in TA_ROWS],
        *_ta_reading(events),
    ]


def same_run_pairs() -> tuple[list[tuple[str, int]], int, list[int]]:
    """The (q, seed) pairs whose two tau_p cells logged the same value at every step (step times aside), the number
    of values a run keeps, and the first step where the other pairs part (their mean entropy)."""
    same, parts, counts = [], [], set()
    for q in ("0.5", "1.0"):
        low, high = (group(TA_VS_STAPO, f"tau_p={tau_p},entropy_quantile={q}") for tau_p in ("0.002", "0.02"))
        others = {run["seed"]: run["series"] for run in high["runs"]}
        for run in low["runs"]:
            kept = [(key, step, value) for key, values in run["series"].items() if key != "step_s"
                    for step, value in values.items()]
            counts.add(len(kept))
            if all(others[run["seed"]][key].get(step) == value for key, step, value in kept):
                same.append((q, run["seed"]))
            else:
                entropy, other = run["series"]["entropy"], others[run["seed"]]["entropy"]
                parts.append(min(int(step) for step in entropy if entropy[step] != other.get(step)))
    (count,) = counts
    return same, count, parts


def _ta_reading(events) -> list[tuple]:
    low05, low10, high10 = TA_CELLS[0], TA_CELLS[1], TA_CELLS[3]
    for name in (TA_CELLS[0], TA_CELLS[2]):  # both q 0.5 cells: one explosion, seed 4, not by the tail
        assert {kind: [s for s, e in events[name].items() if e[kind]] for kind in ("explosion", "tail")} == \
            {"explosion": [4], "tail": []}
    assert [s for s, e in events["algo=justrl"].items() if e["tail"]] == [4, 5]
    same, count, parts = same_run_pairs()
    assert same == [("0.5", 2), ("0.5", 4), ("0.5", 5), ("1.0", 2)]
    vs_centre = [paired_group(TA_VS_STAPO, g)["diff"]["final_acc"] for g in TA_CELLS]
    vs_floor = [paired_group(TA_VS_JUSTRL, g)["diff"]["final_acc"]["mean"] for g in TA_CELLS]
    assert all(higher_in(TA_VS_JUSTRL, g, "final_acc") in ("4 of 5", "5 of 5") for g in TA_CELLS)
    t07 = [group(TA_VS_STAPO, g)["stats"]["final_acc@T0.7"]["mean"] for g in TA_CELLS]
    last_starts = [read_json(path)["segments_s"][-1] / 60
                   for path in (RESULTS / TAX / "runs").glob("*/*/sweep_run.json")]
    return [
        (R, "20 runs of {}-{} min (the last start of each", *[str(round(f(last_starts))) for f in (min, max)]),
        (R, "In {} of the 10 seed pairs (seeds 2, 4 and 5 at q 0.5, seed 2 at q 1.0) the two tau_p cells trained the "
            "same run: all {:,} values a run keeps", str(len(same)), count),
        (R, "the runs part at steps {}-{}", min(parts), max(parts)),
        (R, "fewer tokens are silenced than in the centre ({} points, lower in {} seeds); the filler mass over the run "
            "is higher than the centre's in {} seeds ({}) and the largest mean entropy of a step in {} ({})",
         paired_vs(TA_VS_STAPO, low05, "algo=stapo", "mask_ratio", 4, 100), lower_in(TA_VS_STAPO, low05, "mask_ratio"),
         higher_in(TA_VS_STAPO, low05, "tail_mass"), paired(TA_VS_STAPO, low05, "tail_mass", 6),
         higher_in(TA_VS_STAPO, low05, "entropy_peak"), paired(TA_VS_STAPO, low05, "entropy_peak", 4)),
        (R, "lower than the centre's in {} seeds at tau_p 0.002 ({}) and {} at 0.02 ({}); its mask ratio is not higher "
            "({})", lower_in(TA_VS_STAPO, low10, "tail_mass"), paired(TA_VS_STAPO, low10, "tail_mass", 6),
         lower_in(TA_VS_STAPO, high10, "tail_mass"), paired(TA_VS_STAPO, high10, "tail_mass", 6),
         paired_vs(TA_VS_STAPO, low10, "algo=stapo", "mask_ratio", 4, 100)),
        (R, "Against the centre {} to {} in the mean (standard errors {}-{})",
         *[num(f(d["mean"] for d in vs_centre), 3, True) for f in (min, max)],
         *[num(f(d["se"] for d in vs_centre), 3) for f in (min, max)]),
        (R, "in 4 or 5 of 5 seeds ({} to {}), and so is STAPO's own cell ({}, {} seeds)",
         *[num(f(vs_floor), 3, True) for f in (min, max)], paired(TA_VS_JUSTRL, "algo=stapo", "final_acc"),
         higher_in(TA_VS_JUSTRL, "algo=stapo", "final_acc")),
        (M, "tau_p is inert there (in {} of the 10 seed pairs the two values trained the same run, the strays sit far "
            "below both), a lower q lets more of the tail through, and no cell's held-out accuracy differs from "
            "STAPO's own ({} to {} in the mean)", str(len(same)),
         *[num(f(d["mean"] for d in vs_centre), 3, True) for f in (min, max)]),
        (R, "the ceiling ({}-{} at step 100; STAPO {}, JustRL {})", *[num(f(t07), 3) for f in (min, max)],
         mean(TA_VS_STAPO, "algo=stapo", "final_acc@T0.7"), mean(TA_VS_STAPO, "algo=justrl", "final_acc@T0.7")),
    ]


# the confirmatory TACO set: its registered test (registered-test.json, stapo/runs/registered.py) and its comparison
TC = "tailbed-taco-confirm-xeon"


@cache
def registered_test(folder: str) -> dict:
    return json.loads((RESULTS / folder / "registered-test.json").read_text(encoding="utf-8"))


def _tc_quotes() -> list[tuple]:
    test = registered_test(TC)
    primary, t_test = test["primary"], test["primary"]["t_test"]
    secondary = {row["quantity"]: row for row in test["secondary"]}
    events = recorded_events(TC, ("algo=justrl", "algo=taco"))
    walls = [r["wall_s"] / 60 for g in load(TC)["groups"] for r in g["runs"]]
    verdict = "confirmed" if primary["rejects"] else "not confirmed"
    # the after-the-fact reading it was run to confirm: tailbed-decodings-xeon's TACO row, with tailbed-t1's seeds
    before = seed_deltas(TB, "algo=taco", "final_acc") + seed_deltas(TX, "algo=taco", "final_acc")
    rows = [("held-out acc at T=0.7 / top-p=0.9, step 100", "final_acc@T0.7", 3),
            ("best held-out acc (steps 25-100)", "best_acc", 3),
            ("filler mass a position, mean over steps", "tail_mass", 6),
            ("filler mass a position, last 10 steps", "tail_mass_late", 6),
            ("largest mean entropy of a step", "entropy_peak", 4), ("mean entropy, step 100", "entropy_last", 4)]
    assert [row for _, row, _ in rows] == test["registration"]["secondary"]
    for _, quantity, _ in rows:  # the registered test's rows are the comparison's
        assert secondary[quantity]["mean"] == pytest.approx(paired_group(TC, "algo=taco")["diff"][quantity]["mean"])
    collapsed = {name: [s for s, e in entropy_events(folder, "algo=taco").items() if e["collapse"]]
                 for name, folder in (("t1", TB), ("xeon", TX))}
    assert len(collapsed["t1"]) == len(collapsed["xeon"])  # "2 of 5 each"
    return [
        (R, "| TACO minus JustRL, held-out acc at step 100 (8 seeds) | {} |",
         f"{primary['mean']:+.4f} ± {primary['se']:.4f}"),
        (R, "| paired t, 7 degrees of freedom | {} |", f"{t_test['t']:.3f}"),
        (R, "| one-sided p (TACO higher), at alpha 0.05 | {}: {} |", f"{t_test['p']:.4f}", verdict),
        (R, "| seeds TACO higher / lower / equal | {} / {} / {} (two-sided sign test p = {}) |", primary["higher"],
         primary["lower"], primary["equal"], f"{primary['sign_test_two_sided']:.4f}"),
        (R, "On the 8 new seeds TACO's held-out accuracy at step 100 is {} against JustRL (per seed {}), t = {}, "
            "one-sided p = {}", paired(TC, "algo=taco", "final_acc"), ", ".join(deltas(TC, "algo=taco", "final_acc")),
         f"{t_test['t']:.2f}", f"{t_test['p']:.2f}"),
        (R, "the fact on tailbed-decodings-xeon, {} there and TACO above JustRL in {} of the 10 seeds of the two "
            "builds",
         paired(TX, "algo=taco", "final_acc"), sum(d > 0 for d in before)),
        *[(R, f"| {title} | {{}} | {{}} | {{}} | {{}} of 8 |", stat(TC, "algo=justrl", quantity, digits),
           stat(TC, "algo=taco", quantity, digits), paired(TC, "algo=taco", quantity, digits),
           secondary[quantity]["lower"]) for title, quantity, digits in rows],
        (R, "TACO's held-out accuracy above JustRL's in {}\nof the 10 seeds of tailbed-t1 and tailbed-decodings-xeon "
            "was found after the fact", sum(d > 0 for d in before)),
        (R, "16 runs of {}-{} min, two at a time", *[str(round(f(walls))) for f in (min, max)]),
        (R, "JustRL's entropy explodes in {} runs (seed {}, not by the tail) and TACO's in none; TACO's collapses "
            "(below half its step-1 value) in {} (seed {}), where tailbed-t1 and tailbed-decodings-xeon had {} of\n5 "
            "each", counted(events["algo=justrl"], "explosion"),
         and_list([s for s, e in events["algo=justrl"].items() if e["explosion"]]),
         counted(events["algo=taco"], "collapse"),
         and_list([s for s, e in events["algo=taco"].items() if e["collapse"]]), len(collapsed["t1"])),
        (R, "the registered test on seeds 6-13 did not confirm it (tailbed-taco-confirm-xeon below,\n  {}, one-sided "
            "p = {})", paired(TC, "algo=taco", "final_acc"), f"{t_test['p']:.2f}"),
        (R, "| yes: outcome, one-sided paired t at 0.05, seeds 6-13 (commit 5b1a5a5, 22:08:00 UTC; first run "
            "22:08:14) | yes, {} runs | {}: {}, one-sided p = {}; the after-the-fact {} of 10 seeds does not "
            "replicate |",
         len(walls), verdict, paired(TC, "algo=taco", "final_acc"), f"{t_test['p']:.2f}", sum(d > 0 for d in before)),
        (M, "(results/tailbed-taco-confirm-xeon: seeds 6-13) {} it", "confirmed" if primary["rejects"]
         else "did not confirm"),
        (REGISTRATION, "TACO's held-out accuracy was above JustRL's in {} of the 10 seeds of two earlier sets",
         sum(d > 0 for d in before)),
        (REGISTRATION, "The test run as registered (the command in its COMMAND) {} the earlier reading",
         "confirmed" if primary["rejects"] else "did not\nconfirm"),
    ]


def _summary_quotes() -> list[tuple]:
    """results/README.md's table of the sets (its figures; the rest is words)."""
    tx = recorded_events(TX, ("algo=justrl", "algo=stapo", "algo=taco"))
    tl = {name: entropy_events(TL, name) for name in ("algo=justrl", "algo=stapo", "algo=grpo")}
    long_amd = len(list((RESULTS / "tailbed-long-horizon" / "runs").glob("*/seed-*")))
    assert not runs_with(tx["algo=stapo"], "tail") and not runs_with(tx["algo=taco"], "tail")
    assert not runs_with(tl["algo=stapo"], "explosion")
    return [
        (R, "| yes, 30 runs | the tail rules' trim replicates; JustRL runs away by the tail in {} runs, STAPO and TACO "
            "in none |", counted(tx["algo=justrl"], "tail")),
        (R, "| yes, {} of 9 runs | unfinished: nothing quoted |", long_amd),
        (R, "| JustRL explodes in {} runs, STAPO in none, GRPO in {} (read afterwards, two-sided) |",
         counted(tl["algo=justrl"], "explosion"), counted(tl["algo=grpo"], "explosion")),
    ]


def _more_quotes() -> list[tuple]:
    """Figures of the readings the tables above leave out."""
    ta_cells = [g["group"] for g in load(TA)["groups"]]
    late = {run_value(TA, cell, 2, "late_reward") for cell in ta_cells}
    (late_2,) = late  # seed 2's late reward, the same in all four cells
    entropy_cells = {cell: mean(TA, cell, "entropy_last") for cell in ta_cells}
    by_q = [{entropy_cells[c] for c in ta_cells if c.endswith(f"={q}")} for q in ("0.5", "1.0")]
    assert all(len(values) == 1 for values in by_q)
    grid = group(A8, "algo=stapo")["threshold_grid"]["cells"]
    shown = (1, 50, 100, 150, 200, 256)
    apart = max(abs(float(entropy_at(LH, "algo=grpo", s)) - float(entropy_at(LH, "algo=stapo", s))) for s in shown)
    s5 = seed_deltas(S5, "algo=entropy20", "entropy_last")
    assert all(d > 0 for d in s5)
    s60_last = [group(S60, g)["stats"]["entropy_last"]["mean"] for g in ("algo=grpo", "algo=stapo", "algo=entropy20")]
    sm_acc = sum(g["stats"]["final_acc"]["mean"] for g in load(SM)["groups"]) / len(load(SM)["groups"])
    sm_d = paired_group(SM, "algo=stapo")["diff"]["final_acc"]
    tx_events = recorded_events(TX, ("algo=justrl",))["algo=justrl"]
    tb_events = entropy_events(TB, "algo=justrl")
    assert runs_with(tb_events, "explosion") == 0
    vs_centre = [paired_group(TA_VS_STAPO, g)["diff"][q] for g in TA_CELLS for q in ("tail_mass", "tail_mass_late",
                                                                                     "entropy_peak")]
    ta_events = recorded_events(TA_VS_STAPO, ("algo=justrl",))["algo=justrl"]
    in_each = {lower_in(TA_VS_JUSTRL, g, q) for g in TA_CELLS for q in ("tail_mass", "tail_mass_late", "norm_share",
                                                                        "entropy_peak")}
    (every,) = in_each
    kinds = json.loads((REPO / "benchmarks" / "machine_kinds" / "2026-11-28-xeon-avx512.json").read_text())["settings"]
    control = REPO / "benchmarks" / "tailbed"

    def rates(name: str) -> tuple[str, str]:
        found = json.loads((control / name).read_text())
        return f"{found['greedy_pass_rate']:.3f}", f"{found['t1_pass_rate']:.3f}"

    beta = {name: f"{json.loads((control / name).read_text())['beta']:.2f}"
            for name in ("stapo_tailbed-2026-11-28-xeon-avx512.json", "stapo_tailbed.json")}
    return [
        # testbed-threshold-ablation
        *[(R, f"| mask ratio (% of tokens), {tau_p} | {{}} | {{}} |",
           *[stat(TA, f"tau_p={tau_p},entropy_quantile={q}", "mask_ratio", 3, scale=100) for q in ("0.5", "1.0")])
          for tau_p in ("0.002", "0.02")],
        (R, "| entropy at step 60, every cell | {} | {} |", *[next(iter(values)) for values in by_q]),
        (R, "Seed 2's late training reward is the same\n  in all four ({})", late_2),
        (R, "Held-out accuracy is ordered as the mask ratio is: from {} in the cell that silences least\n  to {} in "
            "the one that silences most", *[num(f(group(TA, c)["stats"]["final_acc"]["mean"] for c in ta_cells), 3)
                                        for f in (min, max)]),
        (R, "spans\n  only {} % to {} % of the tokens", *[num(f(100 * c["mean"] for c in grid), 3)
                                                           for f in (min, max)]),
        # testbed-long-horizon
        (R, "from {} to {}, while both keep learning", entropy_at(LH, "algo=grpo", 1),
         entropy_at(LH, "algo=grpo", 256)),
        (R, "held-out accuracy {} and {} at step 256 ({} for JustRL after 60\n  steps", mean(LH, "algo=grpo",
                                                                                          "final_acc"),
         mean(LH, "algo=stapo", "final_acc"), mean(A8, "algo=justrl", "final_acc")),
        (R, "entropy within {} at every step shown", num(apart, 3)),
        # testbed-addition-5seeds
        (R, "| JustRL | {} | {} | {} |", stat(S5, "algo=justrl", "final_acc"), stat(S5, "algo=justrl", "late_reward"),
         stat(S5, "algo=justrl", "entropy_last")),
        (R, "keeps the policy's entropy higher: {}\n  at step 60, positive on all {} seeds",
         paired(S5, "algo=entropy20", "entropy_last", 4), len(s5)),
        (R, "It also learns the training task more slowly: {} in training reward",
         paired(S5, "algo=entropy20", "late_reward")),
        (R, "Held-out accuracy does not resolve it yet\n  ({})", paired(S5, "algo=entropy20", "final_acc")),
        # testbed-addition-60steps
        (R, "(entropy {} -> {}-{} in 60 steps", mean(S60, "algo=grpo", "entropy_first"), num(min(s60_last), 3),
         num(max(s60_last), 3)),
        (R, "STAPO's paired difference to GRPO,\n{}, is {} and {} of 512 held-out samples",
         paired(S60, "algo=stapo", "final_acc"),
         *[str(round(512 * d)) for d in seed_deltas(S60, "algo=stapo", "final_acc")]),
        # smollm2-arithmetic-4steps
        (R, "one\nproblem is {} of the score, and a 64-problem accuracy has a binomial standard error of about {}",
         num(1 / 64, 3), num((sm_acc * (1 - sm_acc) / 64) ** 0.5, 2)),
        (R, "STAPO's paired difference to GRPO, {}, is {}, {} and {} problems fewer",
         paired(SM, "algo=stapo", "final_acc"),
         *[str(round(-64 * d)) for d in seed_deltas(SM, "algo=stapo", "final_acc")]),
        (R, "that is t = {} on 2 degrees of freedom (two-sided p about {})", t_value(SM, "algo=stapo", "final_acc"),
         num(2 * student_t_sf(abs(sm_d["mean"]) / sm_d["se"], 2), 2)),
        (R, "its paired standard error\n({}) is as large as its difference",
         num(paired_group(SM, "algo=entropy20")["diff"]["final_acc"]["se"], 3)),
        # testbed-lr5e-5
        (R, "The original leaned STAPO's way on {} seeds", higher_in(LR, "algo=stapo", "final_acc")),
        # tailbed-t1, the decodings sets, the ablation
        (R, "yet small and, at t = {} on 5 seeds, not a settled gain", t_value(TB, "algo=taco", "final_acc")),
        (R, "(none of {} on the AMD EPYC, {} here)", len(tb_events), counted(tx_events, "explosion")),
        (R, "TACO's held-out accuracy above JustRL's in {} of 10 seeds over the two builds",
         sum(d > 0 for d in seed_deltas(TB, "algo=taco", "final_acc") + seed_deltas(TX, "algo=taco", "final_acc"))),
        (R, "are each within about {} standard errors",
         num(max(abs(d["mean"]) / d["se"] for d in vs_centre), 1)),
        (R, "lower than\nJustRL's in {} seeds in each of the four cells", every),
        (R, "no cell has a tail-driven\nexplosion (JustRL: {})", counted(ta_events, "tail")),
        # docs/reproducibility.md: the builds on each kind of machine, from the measurement files it names
        ("docs/reproducibility.md", "a greedy / T=1 held-out pass\nrate of {} / {}",
         *rates("testbed-control-2026-11-28-xeon-avx512.json")),
        ("docs/reproducibility.md", "against the AMD EPYC's\n{} / {}", *rates("testbed-control.json")),
        ("docs/reproducibility.md", "a calibration beta of {} against {}",
         beta["stapo_tailbed-2026-11-28-xeon-avx512.json"], beta["stapo_tailbed.json"]),
        ("docs/reproducibility.md", "did not give the AMD EPYC's build either ({} /\n{},",
         *rates("testbed-control-2026-11-28-xeon-avx2-capped.json")),
        ("docs/reproducibility.md", "the last setting took {}x the first's time",
         num(kinds["portable"]["seconds"] / kinds["native"]["seconds"], 1)),
    ]


QUOTES = [
    # README.md's summary of the recorded comparisons
    (M, "held-out {}-{} at step 60 across the eight algorithms; {}-{} after 256 steps",
     num(min(g["stats"]["final_acc"]["mean"] for g in load(A8)["groups"]), 3),
     num(max(g["stats"]["final_acc"]["mean"] for g in load(A8)["groups"]), 3),
     mean(LH, "algo=stapo", "final_acc"), mean(LH, "algo=grpo", "final_acc")),
    (M, "CISPO falls behind at step 60 (held-out {} on 3 seeds", paired(TE, "algo=cispo", "final_acc")),
    (M, "STAPO's silenced tokens, {} % of the tokens, carry {} % of the positive-advantage",
     pct(A8, "algo=stapo", "mask_ratio", 3), pct(A8, "algo=stapo", "grad_share", 0)),
    # docs/reproducibility.md: the same run on another kind of CPU
    ("docs/reproducibility.md", "measured a greedy held-out pass rate of {}", num(read_json(
        RESULTS / RERUN / "testbed-build.json")["heldout_pass_rate"]["greedy"], 3)),
    ("docs/reproducibility.md", "step-1 entropy ({} against {}) and held-out {} at step 60 against the recorded {}",
     num(group(RERUN, "algo=justrl")["runs"][0]["entropy_first"], 4),
     num(group(LR, "algo=justrl")["runs"][0]["entropy_first"], 4),
     num(group(RERUN, "algo=justrl")["runs"][0]["final_acc"], 3),
     num(group(LR, "algo=justrl")["runs"][0]["final_acc"], 3)),
    # testbed-lr5e-5 and its replication
    (R, "| JustRL held-out acc, step 60 | {} | {} |", stat(LR, "algo=justrl", "final_acc"),
     stat(RERUN, "algo=justrl", "final_acc")),
    (R, "| STAPO held-out acc, step 60 | {} | {} |", stat(LR, "algo=stapo", "final_acc"),
     stat(RERUN, "algo=stapo", "final_acc")),
    (R, "| paired Δ held-out, step 60 | {} | {} |", paired(LR, "algo=stapo", "final_acc"),
     paired(RERUN, "algo=stapo", "final_acc")),
    (R, "| paired Δ best held-out (steps 20, 40, 60) | withdrawn (below) | {} |",
     paired(RERUN, "algo=stapo", "best_acc")),
    (R, "| paired Δ train reward, last 10 steps | {} | {} |", paired(LR, "algo=stapo", "late_reward"),
     paired(RERUN, "algo=stapo", "late_reward")),
    (R, "| paired Δ entropy, step 60 | {} | {} |", paired(LR, "algo=stapo", "entropy_last", 4),
     paired(RERUN, "algo=stapo", "entropy_last", 4)),
    (R, "of {} as the one that passes two standard errors", paired(LR, "algo=stapo", "best_acc")),
    (R, "seeds 4 and 5 have the same best in both groups ({} and\n  {})",
     *[num(run["best_acc"], 3) for run in group(LR, "algo=justrl")["runs"][3:]]),
    (R, "The replication's best held-out of the trained steps is {}", paired(RERUN, "algo=stapo", "best_acc")),
    (R, "(replication: {} at step 0, {} for JustRL at\n  step 60, against {} at lr 1e-5",
     stat(RERUN, "algo=justrl", "initial_acc"), stat(RERUN, "algo=justrl", "final_acc"),
     stat(A8, "algo=justrl", "final_acc")),
    (R, "(original {} -> {})", mean(LR, "algo=justrl", "entropy_first"), mean(LR, "algo=justrl", "entropy_last")),
    (R, "JustRL's seed 3 in the replication reads {} at step 40 ({}\n  at step 20, {} at step 60); STAPO's seed 3 "
        "reads {} there", series(RERUN, "algo=justrl", 3, "held_out_acc", 40),
     series(RERUN, "algo=justrl", 3, "held_out_acc", 20), series(RERUN, "algo=justrl", 3, "held_out_acc", 60),
     series(RERUN, "algo=stapo", 3, "held_out_acc", 40)),
    (R, "(seed 2:\n  {} at step 40, {} at step 60)", series(RERUN, "algo=stapo", 2, "held_out_acc", 40),
     series(RERUN, "algo=stapo", 2, "held_out_acc", 60)),
    (R, "(held-out\n  {}, {}, {}, {}, {}; training reward {}, {}, {}, {}, {})", *deltas(LR, "algo=stapo", "final_acc"),
     *deltas(LR, "algo=stapo", "late_reward", 2)),
    (R, "It silenced {} % of the response tokens in the original\n  and {} % in the replication (on {}, {} and {} "
        "of a run's 60 steps)", pct(LR, "algo=stapo", "mask_ratio", 3), pct(RERUN, "algo=stapo", "mask_ratio", 3),
     *[str(sum(1 for v in run["series"]["num_spurious"].values() if v > 0))
       for run in group(RERUN, "algo=stapo")["runs"]]),
    (R, "carrying {} % ± {} % and\n  {} % ± {} % of the positive-advantage", pct(LR, "algo=stapo", "grad_share", 1),
     num(100 * group(LR, "algo=stapo")["stats"]["grad_share"]["se"], 1), pct(RERUN, "algo=stapo", "grad_share", 1),
     num(100 * group(RERUN, "algo=stapo")["stats"]["grad_share"]["se"], 1)),
    # testbed-two-epochs
    (R, "| STAPO | {} | {} | {} |", paired(TE, "algo=stapo", "final_acc"), paired(TE, "algo=stapo", "late_reward"),
     paired(TE, "algo=stapo", "entropy_last", 4)),
    (R, "| CISPO | **{}** | {} | {} |", paired(TE, "algo=cispo", "final_acc"), paired(TE, "algo=cispo", "late_reward"),
     paired(TE, "algo=cispo", "entropy_last", 4)),
    (R, "| GSPO | {} | {} | {} |", paired(TE, "algo=gspo", "final_acc"), paired(TE, "algo=gspo", "late_reward"),
     paired(TE, "algo=gspo", "entropy_last", 4)),
    (R, "JustRL reaches {} held-out at step 60 against\n  {} with one pass", stat(TE, "algo=justrl", "final_acc"),
     stat(A8, "algo=justrl", "final_acc")),
    (R, "lower on all three seeds ({}, {}, {}; t = {} on 2 degrees of freedom)",
     *deltas(TE, "algo=cispo", "final_acc"), t_value(TE, "algo=cispo", "final_acc")),
    (R, "its training reward over the last 10 steps\n  too ({})", paired(TE, "algo=cispo", "late_reward")),
    (R, "by {} (t = {}): a hint.", paired(TE, "algo=gspo", "late_reward"), t_value(TE, "algo=gspo", "late_reward")),
    (R, "Its mask silences {} % of the tokens (as with one pass), which\n  carry {} %",
     pct(TE, "algo=stapo", "mask_ratio", 4), pct(TE, "algo=stapo", "grad_share", 0)),
    (R, "Its entropy is lower by\n  {} (t = {})", paired(TE, "algo=stapo", "entropy_last", 4, sign=False).lstrip("-"),
     t_value(TE, "algo=stapo", "entropy_last")),
    # testbed-addition-8algos
    *[(R, f"| {label} | {n} | {{}} | {{}} | {{}} |", stat(A8, name, "final_acc"), stat(A8, name, "late_reward"),
       stat(A8, name, "entropy_last"))
      for label, name, n in (("JustRL", "algo=justrl", 5), ("DAPO", "algo=dapo", 3), ("Dr.GRPO", "algo=drgrpo", 3),
                             ("GSPO", "algo=gspo", 3), ("CISPO", "algo=cispo", 3))],
    (R, "| Dr.GRPO | {} | {} | {} |", paired(A8, "algo=drgrpo", "final_acc"), paired(A8, "algo=drgrpo", "late_reward"),
     paired(A8, "algo=drgrpo", "entropy_last", 4)),
    (R, "| GSPO | {} | {} | {} |", paired(A8, "algo=gspo", "final_acc"), paired(A8, "algo=gspo", "late_reward"),
     paired(A8, "algo=gspo", "entropy_last", 4)),
    (R, "**GSPO**: held-out {} is a hint (t = {} on 2 degrees of freedom", paired(A8, "algo=gspo", "final_acc"),
     t_value(A8, "algo=gspo", "final_acc")),
    # testbed-threshold-ablation
    (R, "| held-out acc, 0.002 | {} | {} |", stat(TA, "tau_p=0.002,entropy_quantile=0.5", "final_acc"),
     stat(TA, "tau_p=0.002,entropy_quantile=1.0", "final_acc")),
    (R, "| held-out acc, 0.02 | {} | {} |", stat(TA, "tau_p=0.02,entropy_quantile=0.5", "final_acc"),
     stat(TA, "tau_p=0.02,entropy_quantile=1.0", "final_acc")),
    (R, "by {} and {} paired", paired(TA, "tau_p=0.02,entropy_quantile=0.5", "final_acc"),
     paired(TA, "tau_p=0.02,entropy_quantile=1.0", "final_acc")),
    (R, "STAPO's own cell reads {} over 5 seeds, and JustRL,\n  which silences nothing, {}",
     stat(A8, "algo=stapo", "final_acc"), stat(A8, "algo=justrl", "final_acc")),
    # testbed-long-horizon
    (R, "| GRPO entropy | {} | {} | {} | {} | {} | {} |",
     *[entropy_at(LH, "algo=grpo", s) for s in (1, 50, 100, 150, 200, 256)]),
    (R, "| STAPO entropy | {} | {} | {} | {} | {} | {} |",
     *[entropy_at(LH, "algo=stapo", s) for s in (1, 50, 100, 150, 200, 256)]),
    (R, "training reward +{} (GRPO) and +{} (STAPO)", mean(LH, "algo=grpo", "late_reward"),
     mean(LH, "algo=stapo", "late_reward")),
    (R, "held-out accuracy {} and {} at step 256", mean(LH, "algo=grpo", "final_acc"),
     mean(LH, "algo=stapo", "final_acc")),
    (R, "{} % of the response tokens (against {} % in\n  the first 60 steps", pct(LH, "algo=stapo", "mask_ratio", 3),
     pct(A8, "algo=stapo", "mask_ratio", 3)),
    (R, "carrying {} % of the positive-advantage tokens'\n  gradient-norm bound over the run",
     pct(LH, "algo=stapo", "grad_share", 1)),
    # testbed-addition-5seeds
    *[(R, f"| {label} | {{}} | {{}} | {{}} |", stat(S5, name, "final_acc"), stat(S5, name, "late_reward"),
       stat(S5, name, "entropy_last"))
      for label, name in (("STAPO", "algo=stapo"), ("GRPO", "algo=grpo"), ("20-Entropy", "algo=entropy20"))],
    (R, "entropy at step 60 (from {})", mean(S5, "algo=justrl", "entropy_first")),
    (R, "| STAPO | {} | {} | {} |", paired(S5, "algo=stapo", "final_acc"), paired(S5, "algo=stapo", "late_reward"),
     paired(S5, "algo=stapo", "entropy_last", 4)),
    (R, "| GRPO | {} | {} | {} |", paired(S5, "algo=grpo", "final_acc"), paired(S5, "algo=grpo", "late_reward"),
     paired(S5, "algo=grpo", "entropy_last", 4)),
    (R, "| 20-Entropy | {} | **{}** | **{}** |", paired(S5, "algo=entropy20", "final_acc"),
     paired(S5, "algo=entropy20", "late_reward"), paired(S5, "algo=entropy20", "entropy_last", 4)),
    (R, "last 10 steps (t = {} on 4 degrees of freedom)", t_value(S5, "algo=entropy20", "late_reward")),
    (R, "GRPO's entropy is lower by {} (t = {})", paired(S5, "algo=grpo", "entropy_last", 4).lstrip("-"),
     t_value(S5, "algo=grpo", "entropy_last")),
    (R, "the S2T mask silenced {} % of the response tokens", pct(S5, "algo=stapo", "mask_ratio", 3)),
    (R, "{} % ± {} % of the positive-advantage tokens' bound", pct(S5, "algo=stapo", "grad_share", 0),
     num(100 * group(S5, "algo=stapo")["stats"]["grad_share"]["se"], 1)),
    # testbed-addition-60steps
    (R, "| STAPO | {} / {} | {} | {} | {}e-4 / {}e-4 |", *per_seed(S60, "algo=stapo", "final_acc"),
     stat(S60, "algo=stapo", "final_acc"), paired(S60, "algo=stapo", "final_acc"),
     *[num(1e4 * r["mask_ratio"], 1) for r in group(S60, "algo=stapo")["runs"]]),
    (R, "| GRPO | {} / {} | {} |", *per_seed(S60, "algo=grpo", "final_acc"), stat(S60, "algo=grpo", "final_acc")),
    (R, "| 20-Entropy | {} / {} | {} | {} |", *per_seed(S60, "algo=entropy20", "final_acc"),
     stat(S60, "algo=entropy20", "final_acc"), paired(S60, "algo=entropy20", "final_acc")),
    (R, "is {} and {} of 512 held-out samples",
     *[str(round(512 * d)) for d in seed_deltas(S60, "algo=stapo", "final_acc")]),
    # smollm2-arithmetic-4steps
    (R, "| GRPO | {} / {} / {} | {} |", *per_seed(SM, "algo=grpo", "final_acc"), stat(SM, "algo=grpo", "final_acc")),
    (R, "| STAPO | {} / {} / {} | {} | {} | {} % / {} % / {} % |", *per_seed(SM, "algo=stapo", "final_acc"),
     stat(SM, "algo=stapo", "final_acc"), paired(SM, "algo=stapo", "final_acc"),
     *[num(100 * r["mask_ratio"], 2) for r in group(SM, "algo=stapo")["runs"]]),
    (R, "| 20-Entropy | {} / {} / {} | {} | {} |", *per_seed(SM, "algo=entropy20", "final_acc"),
     stat(SM, "algo=entropy20", "final_acc"), paired(SM, "algo=entropy20", "final_acc")),
    (R, "is {}, {} and {} problems fewer on seeds 1, 2 and 3",
     *[str(round(-64 * d)) for d in seed_deltas(SM, "algo=stapo", "final_acc")]),
    (R, "that is t = {} on 2 degrees of freedom", t_value(SM, "algo=stapo", "final_acc")),
    (R, "The runs took {}-{} min each", *[str(round(f(r["wall_s"] for g in load(SM)["groups"] for r in g["runs"]) / 60))
                                          for f in (min, max)]),
    *TB_QUOTES,
    *TD_QUOTES,
    *TL_QUOTES,
    *_lx_quotes(),
    *_lx_bullets(),
    *_tx_quotes(),
    *_ta_quotes(),
    (R, "(the testbed's ablation below could not separate its cells: the mask silenced {}-{} % of the tokens there)",
     *[num(f(100 * g["stats"]["mask_ratio"]["mean"] for g in load(TA)["groups"]), 3) for f in (min, max)]),
    *_tc_quotes(),
    *_summary_quotes(),
    *_more_quotes(),
]
# every seed's paired difference has the sign the reading says ("lower in each seed")
LOWER_IN_EACH_SEED = [
    *[(TB, "algo=stapo", q) for q in ("tail_mass", "tail_mass_peak", "norm_share")],
    *[(TB, "algo=taco", q) for q in ("tail_mass", "tail_mass_late", "tail_mass_peak", "norm_share", "entropy_last")],
    (TB, "algo=entropy20", "late_reward"),
    (TL, "algo=stapo", "entropy_peak"),
    (TL, "algo=grpo", "final_acc"),
    *[(TX, "algo=stapo", q) for q in ("tail_mass", "tail_mass_late", "norm_share", "entropy_last")],
    *[(TX, name, "tail_mass") for name in ("algo=taco", "algo=lopti")],
    # "lower than JustRL's in each of the 8 seeds, as in each of the 10 seeds before" (the confirmatory TACO set)
    *[(folder, "algo=taco", q) for folder in (TB, TX, TC) for q in ("tail_mass", "tail_mass_late", "entropy_last")],
    (TX, "algo=entropy20", "final_acc"),
    *[(TA_VS_JUSTRL, name, q) for name in TA_CELLS
      for q in ("tail_mass", "tail_mass_late", "norm_share", "entropy_peak")],
]


def _id(entry) -> str:
    return entry[1].replace("{}", "_")[:60]


def flat(text: str) -> str:
    """Runs of white space as one space: a figure may be wrapped onto the next line."""
    return " ".join(text.split())


def places(doc: str) -> list[str]:
    """Where a piece keyed to ``doc`` may stand: README.md's narrative moves, verbatim, to docs/findings.md."""
    return [doc, FINDINGS] if doc == M else [doc]


def read_doc(doc: str) -> str:
    path = REPO / doc
    return path.read_text(encoding="utf-8") if path.is_file() else ""


@pytest.mark.parametrize("entry", QUOTES, ids=[_id(e) for e in QUOTES])
def test_a_quoted_figure_is_the_one_its_file_holds(entry):
    doc, text, *figures = entry
    expected = flat(text.format(*figures))
    assert any(expected in flat(read_doc(place)) for place in places(doc)), (
        f"{' or '.join(places(doc))} should say {expected!r}, recomputed from the files under results/")


# What counts as a quoted figure (the module's docstring): a number with a decimal point, or a count ``k of n``
FIGURE = re.compile(r"(?<![\w./-])[+-]?\d[\d,]*\.\d+(?=x\b|\.(?!\d)|[^\w.]|$)|\b\d+ of (?:the )?\d+\b")
# a run's settings written as numbers: a figure inside a match is a setting, not a measurement
SETTINGS = {
    r"T=0\.7 / top-p=0\.9|T=0\.7|top-p=?\s?0\.9|temperature 0\.7": "the paper's second decoding (stapo.val_decodings)",
    r"tau_p (?:= |in \{|from |between |\()?0\.\d+(?:(?:, | or | to | and )0\.\d+)?[})]?": "tau_p, a run's threshold",
    r"\bq (?:= |in \{|from )?[01]\.\d+(?:(?:, | or | to )[01](?:\.\d+)?)?\}?": "q (entropy_quantile), a run's setting",
    r"\((?:0\.002|0\.02), (?:0\.5|0\.75|1\.0)\)": "a (tau_p, q) cell's name",
    r"tau_p \\ q \| 0\.5 \| 1\.0 \||\), 0\.0?02 \|": "the testbed ablation's table: q across, tau_p down",
    r"clip \(?0\.2 ?/ ?0\.28?\)?": "the clip range (algo presets)",
    r"(?:KL term|KL loss)[^.;|]{0,40}?0\.001|k3, 0\.001": "the KL coefficient (GRPO's preset)",
    r"(?:at|alpha) 0\.05": "a registered test's level",
    r"1 - 0\.9 \(1 - exp\(-r\)\)|log 0\.01|p < 0\.5": "TACO's and Lopti's constants (docs/algorithm.md)",
    r"clip 0\.0003/0\.0004|capped at 1\.2": "GSPO's and CISPO's presets",
}
# figures from outside this project's files, each said so where it stands
OUTSIDE = {
    "+3.73 % against +11.49 %": "the paper's own figures (v4/v5), quoted as the paper's",
    "1.1-1.8 %": "measured outside the project (issue 34), said so",
    "about 0.01 % of tokens": "the paper's claim, quoted as the paper's",
    "was reported at 0.96": "the first testbed build's pass rate in conf/model_preset/testbed.yaml's notes",
}
# every paragraph of results/README.md is results; elsewhere a paragraph that names a recorded set or results/
WHOLLY = (R,)
SETS = sorted(path.name for path in RESULTS.iterdir() if path.is_dir())
NAMES_A_SET = re.compile(r"(?<![\w-])(?:results/|" + "|".join(map(re.escape, SETS)) + r")(?![\w-])")
# docs whose figures another test recomputes from their own files
CHECKED_ELSEWHERE = {
    "docs/benchmarks-history.md": "benchmark measurements, recomputed by tests/benchmarks/test_testbed_scripts.py",
}
NOT_TEXT = re.compile(r"```.*?```|`[^`\n]*`|\]\([^)]*\)", re.S)


def scanned_docs() -> list[str]:
    docs = [R, M, *sorted(f"docs/{path.name}" for path in (REPO / "docs").glob("*.md"))]
    return [doc for doc in docs if (REPO / doc).is_file() and doc not in CHECKED_ELSEWHERE]


def unchecked_figures(doc: str, raw: str | None = None) -> list[str]:
    """The figures of ``doc``'s results-bearing paragraphs (its text: ``raw``, default the file's) that no piece,
    setting or outside figure accounts for."""
    pieces = [flat(text.format(*figures)) for place, text, *figures in QUOTES if doc in places(place)]
    allowed = [*SETTINGS, *map(re.escape, OUTSIDE)]
    raw = read_doc(doc) if raw is None else raw
    # code spans, fenced blocks and link targets hidden, their white space kept: both texts flatten to one length
    hidden = NOT_TEXT.sub(lambda match: re.sub(r"\S", "\0", match.group(0)), raw)
    found = []
    for paragraph, masked in zip(re.split(r"\n\s*\n", raw), re.split(r"\n\s*\n", hidden), strict=True):
        if doc not in WHOLLY and not NAMES_A_SET.search(paragraph):
            continue
        text, shown = flat(paragraph), flat(masked)
        covered = [False] * len(text)
        for pattern, where in [*((re.escape(piece), text) for piece in pieces), *((rule, shown) for rule in allowed)]:
            for match in re.finditer(pattern, where):
                covered[match.start():match.end()] = [True] * (match.end() - match.start())
        for match in FIGURE.finditer(shown):
            if not all(covered[match.start():match.end()]):
                context = shown[max(0, match.start() - 70):match.end() + 20].replace("\0", "")
                found.append(f"{doc}: {match.group(0)!r} in ...{context}...")
    return found


@pytest.mark.parametrize("doc", scanned_docs())
def test_every_figure_in_the_docs_is_one_the_test_recomputes(doc):
    """A figure (``FIGURE``) in a results-bearing paragraph stands in a piece of ``QUOTES``, a setting or an outside
    figure; a figure added to a doc without a piece that recomputes it fails here."""
    unchecked = unchecked_figures(doc)
    assert not unchecked, "figures no piece of QUOTES recomputes:\n" + "\n".join(unchecked)


def test_a_figure_added_without_a_piece_is_found():
    """The scan is not vacuous: a new figure or count in results/README.md, or in a paragraph of another doc that
    names a set, is reported; a setting, a figure in code, and a paragraph naming no set are not."""
    added = ("\n\nIn tailbed-t1 STAPO's held-out accuracy is 0.8123 at T=0.7 / top-p=0.9, higher in 4 of 5 seeds "
             "(`lr 0.25`).\n\nA paragraph about nothing recorded: 0.777.\n")
    found = unchecked_figures(R, read_doc(R) + added)
    assert [line.split(" in ")[0] for line in found] == [f"{R}: '0.8123'", f"{R}: '4 of 5'", f"{R}: '0.777'"]
    found = unchecked_figures("docs/tailbed.md", read_doc("docs/tailbed.md") + added)
    assert [line.split(" in ")[0] for line in found] == ["docs/tailbed.md: '0.8123'", "docs/tailbed.md: '4 of 5'"]


def test_the_folders_recorded_before_the_like_with_like_rules_trained_every_run_to_the_same_step():
    """results/README.md says so of the folders that cannot be regenerated: their final columns compare like
    with like because every run reached the configured last step."""
    for folder in (TE, A8, TA, LH, S5, S60, SM):
        steps = {n for g in load(folder)["groups"] for n in g["steps_trained"]}
        assert len(steps) == 1, (folder, steps)


@pytest.mark.parametrize("folder, name, quantity", LOWER_IN_EACH_SEED)
def test_lower_in_each_seed_is_true_of_every_seed(folder, name, quantity):
    assert all(delta < 0 for delta in seed_deltas(folder, name, quantity)), seed_deltas(folder, name, quantity)


def test_the_clip_never_acted_in_the_tailbed_cell():
    """results/README.md says GRPO differs from JustRL there only by its KL term because one on-policy update a step
    leaves every ratio at 1: no step of any run clipped a token, but in Lopti's, whose second update a step starts
    from weights the first one moved."""
    runs = [run for g in load(TB)["groups"] if g["group"] != "algo=lopti" for run in g["runs"]]
    assert all(value == 0 for run in runs for value in run["series"]["pg_clipfrac"].values() if value is not None)


@pytest.mark.parametrize("hit_a, n_a, hit_b, n_b", [(5, 8, 0, 8), (2, 8, 0, 8), (6, 8, 0, 8), (4, 8, 0, 8),
                                                     (3, 5, 1, 6), (0, 4, 0, 4), (2, 5, 0, 5)])
def test_the_fisher_p_value_is_the_share_of_relabellings_no_more_likely(hit_a, n_a, hit_b, n_b):
    """The quoted p-values' function (two-sided) against brute force: every way to place the runs with an event among
    all runs, counting the placements whose table is no more likely than the one seen."""
    from collections import Counter
    from itertools import combinations

    hits, total = hit_a + hit_b, n_a + n_b
    in_a = Counter(sum(index < n_a for index in placed) for placed in combinations(range(total), hits))
    seen = in_a[hit_a]
    extreme = sum(count for count in in_a.values() if count <= seen)
    assert fisher_two_sided(hit_a, n_a, hit_b, n_b) == pytest.approx(extreme / sum(in_a.values()), rel=1e-12)


NAMES = {"algo=justrl": "JustRL", "algo=grpo": "GRPO", "algo=entropy20": "20-Entropy", "algo=stapo": "STAPO",
         "algo=taco": "TACO", "algo=lopti": "Lopti"}
ARCHIVED_SETS = {
    # folder: (the finished runs, README's sentence, what COMMAND must say of the code, the runs' last step)
    "tailbed-long-horizon": (["GRPO seed 1", "JustRL seed 1", "JustRL seed 2", "STAPO seed 1", "STAPO seed 2"],
                             "Finished so far: GRPO seed 1, JustRL seeds 1 and 2 and STAPO seeds 1 and 2.",
                             "commit 0777993", 500),
    "tailbed-long-horizon-xeon": ([f"{algo} seed {seed}" for algo in ("GRPO", "JustRL", "STAPO") for seed in (1, 2, 3)],
                                  "seeds 1-3, made session by session on the 2-core Intel Xeon kind",
                                  "checkout of 61b6e2f", 500),
    "tailbed-decodings-xeon": ([f"{algo} seed {seed}" for algo in (NAMES[cell] for cell in sorted(NAMES))
                                for seed in (1, 2, 3, 4, 5)],
                               "`runs/` keeps every one",
                               "checkout of 1cebbee", 100),
    "tailbed-threshold-ablation-xeon": ([f"tau_p={tau_p},entropy_quantile={q} seed {seed}"
                                        for tau_p in ("0.002", "0.02") for q in ("0.5", "1.0")
                                        for seed in (1, 2, 3, 4, 5)],
                                       "`runs/` keeps every one", "checkout of 0f9e5eb", 100),
    "tailbed-taco-confirm-xeon": ([f"{algo} seed {seed}" for algo in ("JustRL", "TACO")
                                   for seed in (10, 11, 12, 13, 6, 7, 8, 9)],
                                  "two at a time; `runs/` keeps every one. The test was run as registered",
                                  "checkout of 64f12ad", 100),
}


@pytest.mark.parametrize("folder", sorted(ARCHIVED_SETS))
def test_an_archived_set_holds_the_finished_runs_results_md_names(folder):
    """results/<folder>/runs: runs kept by ``stapo sweep --archive``, each finished at the set's last step, from the
    code COMMAND names, on one kind of machine; the README lists exactly these as finished so far."""
    from stapo.runs.folder import read_record, read_run_metrics
    from stapo.sweep.cli import is_finished

    expected, sentence, code, last_step = ARCHIVED_SETS[folder]
    runs = sorted((RESULTS / folder / "runs").glob("*/seed-*"))
    names, kinds = [], set()
    for run in runs:
        record = read_record(run)
        steps = read_run_metrics(run)
        kinds.add(record.get("machine"))
        assert is_finished(run) and record["returncode"] == 0
        assert max(step for step, metrics in steps.items() if "timing_s/step" in metrics) == last_step
        names.append(f"{NAMES.get(record['cell'], record['cell'])} seed {record['seed']}")
    assert names == expected
    assert len(kinds - {None}) <= 1  # one kind of machine a set (records before 46dc118 name none)
    readme = " ".join((RESULTS / "README.md").read_text().split())
    assert sentence in readme
    assert code in " ".join((RESULTS / folder / "COMMAND").read_text().split())


def test_the_builds_across_machine_kinds_are_what_the_reproducibility_doc_quotes():
    """docs/reproducibility.md: the testbed's held-out pass rates and the tailbed's calibration on the AMD EPYC, on the
    Intel Xeon, and on the Xeon capped to AVX2, each from the measurement file it names."""
    folder = REPO / "benchmarks" / "tailbed"
    doc = " ".join((REPO / "docs" / "reproducibility.md").read_text().split())

    def rates(name: str) -> str:
        control = read_json(folder / name)
        return f"{control['greedy_pass_rate']:.3f} / {control['t1_pass_rate']:.3f}"

    assert (f"a greedy / T=1 held-out pass rate of {rates('testbed-control-2026-11-28-xeon-avx512.json')} "
            f"(`benchmarks/tailbed/testbed-control-2026-11-28-xeon-avx512.json`) against the AMD EPYC's "
            f"{rates('testbed-control.json')}") in doc
    assert f"either ({rates('testbed-control-2026-11-28-xeon-avx2-capped.json')}," in doc
    beta = {name: read_json(folder / name)["beta"]
            for name in ("stapo_tailbed-2026-11-28-xeon-avx512.json", "stapo_tailbed.json")}
    assert (f"a calibration beta of {beta['stapo_tailbed-2026-11-28-xeon-avx512.json']:.2f} against "
            f"{beta['stapo_tailbed.json']:.2f}") in doc


# what the long horizon's identity checks compared: every logged value but timings, throughput and memory
IDENTITY_SKIP = ("timing", "perf/", "throughput", "memory", "time", "mfu")
IDENTITY_CHECKS = {
    # checks/<folder>: (the archived run it must equal, up to step, the count COMMAND quotes)
    "grpo-2-61b6e2f-to-step-51": ("algo-grpo/seed-2", 51, "the same {} logged values"),
    "grpo-1-stopped-at-step-86": ("algo-grpo/seed-1", 86, "the same {} values"),
}


def raw_values(path: Path, upto: int) -> dict[int, dict]:
    """A gzipped metrics file's values per step up to ``upto`` as logged (null and text too), timings aside."""
    import gzip

    values: dict[int, dict] = {}
    for line in gzip.decompress(path.read_bytes()).decode("utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line torn by the stop
            continue
        if row["step"] <= upto:
            values.setdefault(row["step"], {}).update(
                {key: value for key, value in row["data"].items() if not any(cut in key for cut in IDENTITY_SKIP)})
    return values


@pytest.mark.parametrize("check", sorted(IDENTITY_CHECKS))
def test_the_long_horizons_identity_checks_logged_what_the_archived_runs_logged(check):
    """results/tailbed-long-horizon-xeon/checks: a run of another checkout (61b6e2f against 0777993's GRPO seed 2) and
    a run stopped by a session's end (GRPO seed 1), each logging, step by step, the values of the archived run that
    COMMAND says it matched, as many as COMMAND says."""
    folder = RESULTS / "tailbed-long-horizon-xeon"
    run, upto, quoted = IDENTITY_CHECKS[check]
    checked = raw_values(folder / "checks" / check / "metrics.jsonl.gz", upto)
    archived = raw_values(folder / "runs" / run / "metrics.jsonl.gz", upto)
    assert sorted(checked) == list(range(upto + 1)) and checked == archived
    count = sum(len(values) for values in checked.values())
    assert quoted.format(f"{count:,}") in " ".join((folder / "COMMAND").read_text().replace("#", " ").split())


def _shared_with_the_long_horizon() -> list[str]:
    """The decodings set's archived runs whose cell and seed the Xeon long horizon also ran."""
    decodings, horizon = RESULTS / "tailbed-decodings-xeon" / "runs", RESULTS / "tailbed-long-horizon-xeon" / "runs"
    return sorted(str(run.relative_to(decodings)) for run in decodings.glob("*/seed-*")
                  if (horizon / run.relative_to(decodings)).is_dir())


@pytest.mark.parametrize("run", _shared_with_the_long_horizon())
def test_the_xeon_decodings_runs_trained_what_the_xeon_long_horizon_trained_in_its_first_100_steps(run):
    """Two sets on the Intel Xeon, from checkouts of 1cebbee and 61b6e2f: a 100-step run validated every 25 steps at
    two decodings logs, at steps 0-100, every value its seed's 500-step run (validated every 50 steps at T=1) logged,
    the same to the bit, and nothing more than its extra validations: neither the run's length nor its validations
    touch training (results/tailbed-decodings-xeon/COMMAND quotes two of the counts)."""
    decodings = raw_values(RESULTS / "tailbed-decodings-xeon" / "runs" / run / "metrics.jsonl.gz", 100)
    horizon = raw_values(RESULTS / "tailbed-long-horizon-xeon" / "runs" / run / "metrics.jsonl.gz", 100)
    assert sorted(decodings) == sorted(horizon) == list(range(101))
    for step, values in horizon.items():
        assert {key: decodings[step].get(key) for key in values} == values, f"step {step}"
        extra = set(decodings[step]) - set(values)
        assert all(key.startswith("val") and (step in (25, 75) or "@T0.7" in key) for key in extra), f"step {step}"
    count = f"{sum(len(values) for values in horizon.values()):,}"
    quoted = {"algo-justrl/seed-1": f"JustRL seed 1 logged the same {count} values",
              "algo-stapo/seed-1": f"the same {count} values as the long horizon's STAPO seed 1",
              "algo-grpo/seed-1": f"GRPO seed 1 the same {count} values"}
    if run in quoted:
        assert quoted[run] in " ".join((RESULTS / "tailbed-decodings-xeon" / "COMMAND").read_text().replace("#", " ")
                                       .split())


@pytest.mark.parametrize("folder, baseline", [(TA_VS_STAPO, "algo=stapo"), (TA_VS_JUSTRL, "algo=justrl")])
def test_the_ablations_comparisons_with_its_centre_and_floor_are_what_stapo_compare_writes_from_the_archives(
        folder, baseline, tmp_path):
    """results/tailbed-threshold-ablation-xeon/against-*: `stapo compare` over the archived runs of the ablation and
    of the decodings set's STAPO and JustRL (the command its COMMAND shows), written again here: the same numbers,
    and the only settings that differ from the baseline are the ablated ones (and the token mask, for JustRL)."""
    from stapo.runs.compare_cli import main

    decodings = RESULTS / "tailbed-decodings-xeon" / "runs"
    argv = [str(RESULTS / TAX / "runs"), str(decodings / "algo-stapo"), str(decodings / "algo-justrl"),
            "--baseline", baseline, "--out", str(tmp_path)]
    assert main(argv) == 0
    again = json.loads((tmp_path / "comparison.json").read_text(encoding="utf-8"))
    kept = load(folder)
    assert len(again["compared_runs"]) == 30 and not again.get("warnings")
    for key in ("compared_at", "held_out_at", "paired", "settings"):
        assert again[key] == kept[key], key
    assert [(g["group"], g["seeds"], g["stats"]) for g in again["groups"]] == \
        [(g["group"], g["seeds"], g["stats"]) for g in kept["groups"]]
    ablated = {"actor_rollout_ref.actor.policy_loss.tau_p", "actor_rollout_ref.actor.policy_loss.entropy_quantile",
               "actor_rollout_ref.actor.policy_loss.token_mask"}
    assert set().union(*again["settings"]["differ"].values()) <= ablated
