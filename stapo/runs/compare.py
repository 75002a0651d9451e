"""The comparison a sweep writes: per group of runs (one grid cell, several seeds), mean +- standard error.

Per run: final and best held-out accuracy, the training reward of the last ``LATE_STEPS`` steps (one
step's reward is a few prompts' luck), the entropy trajectory, the mean mask ratio against the share of
the policy-gradient bound the masked tokens carry, pooled over the run's steps (docs/algorithm.md
section 5), and the wall time. Per group: the mean over seeds and its standard error (sample standard
deviation with ddof=1 over sqrt(n); undefined, written ``-`` / null, for a single seed). Groups are
compared on the same quantities; the entropy trajectory is averaged step by step over the seeds that
logged that step. Pure Python on the run folders' metrics (no verl, no torch).

Runs of one seed share their data order and sampler seeds (docs/reproducibility.md), so two groups are
also compared *paired*: per seed the difference of a quantity to the baseline group, then its mean and
standard error over the seeds both ran. Common random numbers cancel the seed's own luck (which prompts
came first, which samples were drawn), so the paired standard error is the one that says whether a
difference is there; the unpaired ones of the first table overstate the uncertainty of a difference.

Then, for a sweep over two axes, the ablation layout (``grid_tables``), and for each group that trains
with the S2T mask, the logged threshold grid: what other (tau_p, q) would have silenced
(stapo/runs/threshold_table.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from stapo.eval.val_metrics import benchmark_val_metrics
from stapo.rundir import ENTROPY_TOKEN_MEAN, VERL_ENTROPY
from stapo.runs.folder import RunData, config_value
from stapo.runs.stats import mean_se
from stapo.runs.threshold_table import threshold_table

ACC = "val/average/acc"
ENTROPY = VERL_ENTROPY
# verl aggregates actor/entropy over tokens with the actor's loss_agg_mode: only "token-mean" is the mean
# entropy of a response token (Dr.GRPO's seq-mean-token-sum-norm divides each sequence's sum by the
# maximum response length, so its entropy reads lower by about mean length / maximum length). The driver
# logs that mean for every mode (ENTROPY_TOKEN_MEAN): read first, actor/entropy for runs without it
AGG_MODE = "actor_rollout_ref.actor.loss_agg_mode"
TOKEN_MEAN = "token-mean"
NOT_TOKEN_MEAN = " †"
MASK = "actor/stapo/mask_ratio"
# the spurious tokens' and all positive-advantage tokens' summed gradient-norm bounds, per step
GRAD_BOUND = ("actor/stapo/grad_bound_spurious", "actor/stapo/grad_bound_positive")
REWARD = ("critic/score/mean", "critic/rewards/mean")
STEP_TIME = "timing_s/step"
LATE_STEPS = 10
QUANTITIES = (
    "final_acc", "best_acc", "late_reward", "entropy_first", "entropy_last", "mask_ratio", "grad_share", "wall_s"
)
PAIRED = ("final_acc", "best_acc", "late_reward", "entropy_last", "wall_s")


def accuracy_series(steps: dict[int, dict[str, float]]) -> dict[int, float]:
    """Held-out accuracy per validated step: ``val/average/acc``, else derived from ``val-core/...`` keys."""
    out = {}
    for step, metrics in steps.items():
        if ACC in metrics:
            out[step] = metrics[ACC]
        elif (derived := benchmark_val_metrics(metrics).get(ACC)) is not None:
            out[step] = derived
    return out


def key_series(steps: dict[int, dict[str, float]], key: str) -> dict[int, float]:
    return {step: metrics[key] for step, metrics in steps.items() if key in metrics}


@dataclass
class RunSummary:
    run: RunData
    values: dict[str, float | None]
    entropy: dict[int, float]
    entropy_token_mean: bool  # the entropy series is the mean entropy of a response token
    entropy_agg: str  # the run's loss_agg_mode ("None": no config.yaml beside the metrics)

    def to_json(self) -> dict:
        return {
            "run_dir": str(self.run.path),
            "seed": self.run.seed,
            "steps_trained": self.steps_trained,
            **self.values,
            "entropy_trajectory": {str(k): v for k, v in self.entropy.items()},
            "entropy_token_mean": self.entropy_token_mean,
        }

    @property
    def steps_trained(self) -> int:
        return sum(1 for metrics in self.run.steps.values() if STEP_TIME in metrics)


def step_mean(series: dict[int, float], last: int | None = None) -> float | None:
    """Mean of a per-step series, over its ``last`` steps when given; None when empty."""
    values = [series[step] for step in sorted(series)[-last if last else 0:]]
    return math.fsum(values) / len(values) if values else None


def pooled_share(steps: dict[int, dict[str, float]], part: str, whole: str) -> float | None:
    """``sum(part) / sum(whole)`` over the steps that logged both: the run's share, each step weighted by
    its own total (a mean of per-step ratios would give a step with one positive token the weight of
    a step with thousands). None when nothing was logged or the total is 0."""
    pairs = [(metrics[part], metrics[whole]) for metrics in steps.values() if part in metrics and whole in metrics]
    total = math.fsum(w for _, w in pairs)
    return math.fsum(p for p, _ in pairs) / total if pairs and total > 0 else None


def logged_token_mean_entropy(run: RunData) -> bool:
    return any(ENTROPY_TOKEN_MEAN in metrics for metrics in run.steps.values())


def summarize_run(run: RunData, late_steps: int = LATE_STEPS, token_mean_entropy: bool = True) -> RunSummary:
    """``token_mean_entropy``: read the entropy from ``ENTROPY_TOKEN_MEAN`` where the run logged it (a
    group reads one source for all its runs: ``summarize_group``)."""
    acc = accuracy_series(run.steps)
    entropy = key_series(run.steps, ENTROPY_TOKEN_MEAN) if token_mean_entropy else {}
    agg = str(config_value(run.path, AGG_MODE))
    # None: no config.yaml beside the metrics (then taken as token-mean)
    token_mean = bool(entropy) or agg in ("None", TOKEN_MEAN)
    entropy = entropy or key_series(run.steps, ENTROPY)
    reward = next((s for key in REWARD if (s := key_series(run.steps, key))), {})
    timing = key_series(run.steps, STEP_TIME)
    wall = run.record.get("seconds")
    values = {
        "final_acc": acc[max(acc)] if acc else None,
        "best_acc": max(acc.values()) if acc else None,
        "late_reward": step_mean(reward, late_steps),
        "entropy_first": entropy[min(entropy)] if entropy else None,
        "entropy_last": entropy[max(entropy)] if entropy else None,
        "mask_ratio": step_mean(key_series(run.steps, MASK)),
        "grad_share": pooled_share(run.steps, *GRAD_BOUND),
        # the sweep's own clock (start-up included) where it ran the run, else the logged step times
        "wall_s": float(wall) if wall is not None else (math.fsum(timing.values()) if timing else None),
    }
    return RunSummary(run, values, entropy, token_mean, agg)


def summarize_group(name: str, runs: list[RunData]) -> dict:
    # one entropy source for the whole group: runs from before the driver logged the token mean (a sweep
    # resumed across an upgrade) would otherwise mix it with actor/entropy of another aggregation
    token_mean_entropy = all(logged_token_mean_entropy(run) for run in runs)
    summaries = [summarize_run(run, token_mean_entropy=token_mean_entropy) for run in runs]
    stats = {}
    for quantity in QUANTITIES:
        mean, se, n = mean_se([s.values[quantity] for s in summaries])
        stats[quantity] = {"mean": mean, "se": se, "n": n}
    all_steps = sorted({step for s in summaries for step in s.entropy})
    trajectory = {"step": [], "mean": [], "se": [], "n": []}
    for step in all_steps:
        mean, se, n = mean_se([s.entropy[step] for s in summaries if step in s.entropy])
        for key, value in zip(("step", "mean", "se", "n"), (step, mean, se, n), strict=True):
            trajectory[key].append(value)
    return {
        "group": name,
        "entropy_agg": sorted({s.entropy_agg for s in summaries}),
        "entropy_token_mean": all(s.entropy_token_mean for s in summaries),
        "seeds": [s.run.seed for s in summaries],
        "steps_trained": [s.steps_trained for s in summaries],
        "stats": stats,
        "entropy_trajectory": trajectory,
        "runs": [s.to_json() for s in summaries],
    }


ENTROPY_NOTE = (
    f"\n†: `{ENTROPY}` aggregated with this run's `loss_agg_mode` (not {TOKEN_MEAN}), as verl logs it, from runs "
    f"without `{ENTROPY_TOKEN_MEAN}`: not the mean entropy of a response token, so not comparable with the other "
    "rows' entropy.\n"
)


def entropy_is_token_mean(group: dict) -> bool:
    return group.get("entropy_token_mean", True)


def _cell(stat: dict, digits: int) -> str:
    if stat["mean"] is None:
        return "-"
    text = f"{stat['mean']:.{digits}f}"
    return text + (f" ± {stat['se']:.{digits}f}" if stat["se"] is not None else "")


def markdown_table(groups: list[dict]) -> str:
    header = (
        f"| group | seeds | steps | final held-out acc | best held-out acc | train reward, last {LATE_STEPS} steps "
        "| entropy first -> last | mask ratio | spurious grad share | wall time (s) |"
    )
    rows = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    for group in groups:
        s = group["stats"]
        seeds = ",".join("?" if seed is None else str(seed) for seed in group["seeds"])
        steps = "/".join(str(n) for n in sorted(set(group["steps_trained"])))
        entropy = f"{_cell(s['entropy_first'], 3)} -> {_cell(s['entropy_last'], 3)}"
        entropy += "" if entropy_is_token_mean(group) else NOT_TOKEN_MEAN
        rows.append(
            f"| {group['group']} | {seeds} | {steps} | {_cell(s['final_acc'], 3)} | {_cell(s['best_acc'], 3)} "
            f"| {_cell(s['late_reward'], 3)} | {entropy} | {_cell(s['mask_ratio'], 5)} | {_cell(s['grad_share'], 4)} "
            f"| {_cell(s['wall_s'], 0)} |"
        )
    note = (
        "\nmean ± standard error over seeds (sample std / sqrt(n); no ± with one seed). Held-out accuracy: "
        f"`{ACC}` (or derived from `val-core/*/acc/mean@n`), '-' when no validation ran. Mask ratio: "
        f"mean over steps of `{MASK}`, the silenced share of response tokens; spurious grad share: "
        f"`{GRAD_BOUND[0]}` summed over steps over `{GRAD_BOUND[1]}` summed over steps, the silenced tokens' "
        "share of the positive-advantage tokens' bound on the squared logit-gradient norm (docs/algorithm.md "
        "section 5); '-' for algorithms without the S2T mask.\n"
    )
    if not all(entropy_is_token_mean(group) for group in groups):
        note += ENTROPY_NOTE
    return "\n".join(rows) + "\n" + note


def paired_differences(summary: list[dict], baseline: str) -> list[dict]:
    """Every other group minus ``baseline``, seed by seed: ``{group, seeds, diff: {quantity: mean/se/n}}``.

    Only seeds both groups ran (with a finite value of that quantity) are paired; runs without a seed
    (found outside a sweep) are never paired.
    """
    names = [group["group"] for group in summary]
    if baseline not in names:
        raise ValueError(f"--baseline must be one of the compared groups {names}, got {baseline!r}")
    base = {run["seed"]: run for run in summary[names.index(baseline)]["runs"] if run["seed"] is not None}
    out = []
    for group in summary:
        if group["group"] == baseline:
            continue
        pairs = [(run, base[run["seed"]]) for run in group["runs"] if run["seed"] in base]
        diff = {}
        for quantity in PAIRED:
            deltas = [
                run[quantity] - ref[quantity]
                for run, ref in pairs
                if run[quantity] is not None and ref[quantity] is not None
            ]
            mean, se, n = mean_se(deltas)
            diff[quantity] = {"mean": mean, "se": se, "n": n}
        comparable = entropy_is_token_mean(group) and entropy_is_token_mean(summary[names.index(baseline)])
        out.append({"group": group["group"], "seeds": [run["seed"] for run, _ in pairs], "diff": diff,
                     "entropy_token_mean": comparable})
    return out


def paired_table(differences: list[dict], baseline: str) -> str:
    intro = (
        f"\nPaired by seed: group minus `{baseline}` for the same seed, mean ± standard error over the seeds "
        "both ran.\n"
    )
    header = (
        "| group | seeds paired | Δ final held-out acc | Δ best held-out acc "
        f"| Δ train reward, last {LATE_STEPS} steps | Δ last entropy | Δ wall time (s) |"
    )
    rows = [intro, header, "|---|---|---|---|---|---|---|"]
    for group in differences:
        d = group["diff"]
        seeds = ",".join(str(seed) for seed in group["seeds"]) or "none"
        rows.append(
            f"| {group['group']} | {seeds} | {_cell(d['final_acc'], 3)} | {_cell(d['best_acc'], 3)} "
            f"| {_cell(d['late_reward'], 3)} | {_cell(d['entropy_last'], 4)}"
            f"{'' if entropy_is_token_mean(group) else NOT_TOKEN_MEAN} | {_cell(d['wall_s'], 0)} |"
        )
    if not all(entropy_is_token_mean(group) for group in differences):
        rows.append(ENTROPY_NOTE)
    return "\n".join(rows) + "\n"


# the quantities of a two-axis grid's tables: (stat, title, digits)
GRID_QUANTITIES = (
    ("final_acc", "final held-out acc", 3),
    ("late_reward", f"train reward, last {LATE_STEPS} steps", 3),
    ("entropy_last", "last entropy", 3),
    ("mask_ratio", "mask ratio", 5),
)

GridAxis = tuple[str, list[str]]  # (label as in the group names, e.g. "tau_p"; its values in grid order)


def grid_tables(summary: list[dict], rows: GridAxis, cols: GridAxis) -> str:
    """A sweep over two axes laid out as an ablation table: one table per quantity, ``rows``' values down,
    ``cols``' values across, mean ± SE over seeds in each cell (group ``<row>=<r>,<col>=<c>``)."""
    by_name = {group["group"]: group for group in summary}
    (row_label, row_values), (col_label, col_values) = rows, cols
    out = []
    for stat, title, digits in GRID_QUANTITIES:
        lines = [
            f"\n{title}: {row_label} (rows) x {col_label} (columns), mean ± SE over seeds\n",
            f"| {row_label} \\ {col_label} | " + " | ".join(col_values) + " |",
            "|---|" + "---|" * len(col_values),
        ]
        for r in row_values:
            cells = []
            for c in col_values:
                group = by_name.get(f"{row_label}={r},{col_label}={c}")
                cells.append(_cell(group["stats"][stat], digits) if group else "-")
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n".join(out) + "\n"


def write_comparison(
    groups: dict[str, list[RunData]],
    out_dir: Path,
    meta: dict | None = None,
    baseline: str | None = None,
    paired: bool = True,
    grid: tuple[GridAxis, GridAxis] | None = None,
) -> dict:
    """``comparison.md`` and ``comparison.json`` in ``out_dir``; returns the JSON document.

    With two or more groups (and ``paired``) the paired differences to ``baseline`` (default: the
    first group) follow; with ``grid`` (a sweep over two axes) the ablation-style tables of
    :func:`grid_tables` after them.
    """
    summary = [summarize_group(name, runs) for name, runs in groups.items()]
    document = {**(meta or {}), "acc_key": ACC, "groups": summary}
    table = markdown_table(summary)
    if paired and len(summary) > 1:
        baseline = summary[0]["group"] if baseline is None else baseline
        document["paired"] = {"baseline": baseline, "groups": paired_differences(summary, baseline)}
        table += paired_table(document["paired"]["groups"], baseline)
    if grid is not None:
        table += grid_tables(summary, *grid)
    # the threshold grid of the groups that train with the S2T mask (the others log it too: the same
    # tokens, unmasked; it would repeat the table)
    for group in summary:
        if group["stats"]["mask_ratio"]["mean"] is not None and (found := threshold_table(group["group"],
                                                                                          groups[group["group"]])):
            group["threshold_grid"], text = found
            table += text
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "comparison.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    (out_dir / "comparison.md").write_text(table, encoding="utf-8")
    return document
