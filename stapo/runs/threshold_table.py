"""What the S2T mask would have silenced at other thresholds, over seeds: the logged threshold grid as a table.

Every run logs, each step, the share of response tokens each (tau_p, q) of the grid in
``stapo.algorithm.ablation`` would have silenced among its positive-advantage tokens
(``actor/stapo/ablation/pos/tau_p=..,q=../mask_ratio``, stapo/algorithm/ablation.py), from the same old-pass
tensors the mask reads. Per run: the mean over its steps; per group: mean ± SE over seeds, tau_p down,
q across. It says, before any training ablation is spent, how far apart the grid's cells are on this
task: two cells that silence the same tokens cannot train differently.

The counterfactual is of the run's own rollouts: under another threshold the policy, and so the later
rollouts, would have differed.
"""

from __future__ import annotations

import re

from stapo.runs.folder import RunData
from stapo.runs.stats import mean_se

CELL = re.compile(r"^actor/stapo/ablation/pos/tau_p=([^,]+),q=([^/]+)/mask_ratio$")


def run_cells(run: RunData) -> dict[tuple[str, str], float]:
    """{(tau_p, q): mean over the run's steps of that cell's mask ratio}."""
    sums: dict[tuple[str, str], list[float]] = {}
    for metrics in run.steps.values():
        for key, value in metrics.items():
            if (match := CELL.match(key)) is not None:
                sums.setdefault(match.groups(), []).append(value)
    return {cell: sum(values) / len(values) for cell, values in sums.items()}


def threshold_table(name: str, runs: list[RunData]) -> tuple[dict, str] | None:
    """(JSON, markdown) of the group's grid, mean ± SE over its runs; None when no run logged the grid."""
    per_run = [cells for run in runs if (cells := run_cells(run))]
    if not per_run:
        return None
    cells = sorted({cell for run in per_run for cell in run}, key=lambda c: (float(c[0]), float(c[1])))
    tau_ps = sorted({c[0] for c in cells}, key=float)
    qs = sorted({c[1] for c in cells}, key=float)
    stats = {}
    for cell in cells:
        mean, se, _ = mean_se([run[cell] for run in per_run if cell in run])
        stats[cell] = {"mean": mean, "se": se}
    lines = [
        f"\nWhat the S2T mask would have silenced in `{name}`'s own rollouts ({len(per_run)} runs): the share of "
        "response tokens, in %, mean over steps, mean ± SE over seeds; tau_p down, q across "
        "(`actor/stapo/ablation/pos/*`)\n",
        "| tau_p \\ q | " + " | ".join(qs) + " |",
        "|---|" + "---|" * len(qs),
    ]
    for tau_p in tau_ps:
        row = []
        for q in qs:
            stat = stats.get((tau_p, q))
            if stat is None or stat["mean"] is None:
                row.append("-")
            else:
                se = f" ± {100 * stat['se']:.4f}" if stat["se"] is not None else ""
                row.append(f"{100 * stat['mean']:.4f}{se}")
        lines.append(f"| {tau_p} | " + " | ".join(row) + " |")
    document = {"runs": len(per_run), "cells": [{"tau_p": t, "q": q, **stats[(t, q)]} for t, q in cells]}
    return document, "\n".join(lines) + "\n"
