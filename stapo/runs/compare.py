"""The comparison a sweep writes: per group of runs (one grid cell, several seeds), mean ± standard error,
then every group paired seed by seed with a baseline.

Like with like, or nothing:
- every run is compared at one step (``comparison_step``): the configured last step, with the runs short
  of it (crashed, interrupted, still running) left out and listed; or, when asked for
  (``at_shared_step``), every run at the last step they all reached;
- held-out accuracy is read at the validation steps every compared run shares, step 0 (the untrained
  model) reported on its own and never counted as a "best";
- a group holding two runs of one seed is refused, naming both folders: pairing by seed would set one
  baseline run against both.

Per group: the mean over seeds and its standard error (sample standard deviation with ddof=1 over
sqrt(n); undefined, written ``-`` / null, for a single seed). The entropy trajectory is averaged step
by step over the seeds that logged that step.

Runs of one seed share their data order and sampler seeds (docs/reproducibility.md), so two groups are
also compared *paired*: per seed the difference of a quantity to the baseline group, then its mean and
standard error over the seeds both ran. Common random numbers cancel the seed's own luck (which prompts
came first, which samples were drawn), so the paired standard error is the one that says whether a
difference is there; the unpaired ones of the first table overstate the uncertainty of a difference.

The per-run values: ``stapo.runs.summary``; the markdown: ``stapo.runs.tables``; the entropy events counted per
group: ``stapo.runs.events``; the settings each group differs from the baseline in (its runs' config.yaml), and a
warning for a group whose runs differ among themselves: ``stapo.runs.settings``; the logged threshold grid of the
groups that train with the S2T mask: ``stapo.runs.threshold_table``. Pure Python on the run folders' metrics and
configs (no verl, no torch).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from stapo.runs.events import RULE, events_table, group_events
from stapo.runs.folder import RunData
from stapo.runs.machine import mixed_machines
from stapo.runs.settings import (
    differences,
    mixed_warning,
    read_settings,
    settings_markdown,
    token_rules,
    token_rules_markdown,
)
from stapo.runs.stats import mean_se
from stapo.runs.summary import (
    DECODING_ACC,
    QUANTITIES,
    TAIL_QUANTITIES,
    accuracy_series,
    configured_steps,
    last_step,
    logged_token_mean_entropy,
    ran_to_the_end,
    summarize_run,
)
from stapo.runs.tables import (
    GridAxis,
    decoding_table,
    entropy_is_token_mean,
    grid_tables,
    markdown_table,
    paired_decoding_table,
    paired_table,
    paired_tail_table,
    step_line,
    tail_table,
)
from stapo.runs.threshold_table import threshold_table

__all__ = ["ComparisonError", "comparison_step", "mean_se", "paired_differences", "summarize_group",
           "summarize_run", "write_comparison", "write_comparison_and_warn"]

PAIRED = (
    "final_acc", "best_acc", "late_reward", "entropy_last", "wall_s", *TAIL_QUANTITIES,
    *(f"final_acc@{name}" for name in DECODING_ACC),
)


def add_step_option(parser) -> None:
    """``--at-shared-step``, as ``stapo sweep`` and ``stapo plot`` take it."""
    parser.add_argument(
        "--at-shared-step",
        action="store_true",
        help="compare every run at the last step all of them reached (default: at the configured last step, "
        "leaving out and listing the runs short of it)",
    )


class ComparisonError(ValueError):
    """A comparison that would print a wrong number: refused with one line saying why."""


@dataclass
class Selection:
    """Which runs are compared, at which step."""

    at: int
    groups: dict[str, list[RunData]]  # the compared runs (every value read at ``at``)
    unfinished: list[tuple[str, RunData]]  # (group, run) left out: short of ``at``
    at_shared_step: bool


def refuse_duplicate_seeds(groups: dict[str, list[RunData]]) -> None:
    for name, runs in groups.items():
        seen: dict[int, RunData] = {}
        for run in runs:
            if run.seed is None:
                continue
            if run.seed in seen:
                raise ComparisonError(
                    f"group {name!r} holds two runs of seed {run.seed}: {seen[run.seed].path} and {run.path}; a paired "
                    "comparison needs one run per seed and group (compare them as separate groups, or leave one out)"
                )
            seen[run.seed] = run


def truncated(run: RunData, at: int) -> RunData:
    return replace(run, steps={step: metrics for step, metrics in run.steps.items() if step <= at})


def comparison_step(groups: dict[str, list[RunData]], at_shared_step: bool = False) -> Selection:
    """The one step every compared run is read at: the largest configured ``trainer.total_training_steps``
    (runs without a config: the largest last step) with the runs short of it left out; or, with
    ``at_shared_step``, the last step every run reached, all runs kept."""
    runs = [run for members in groups.values() for run in members]
    if not runs:
        raise ComparisonError("no run to compare")
    if at_shared_step:
        at = min(last_step(run) for run in runs)
    else:
        configured = [steps for run in runs if (steps := configured_steps(run)) is not None]
        at = max(configured) if configured else max(last_step(run) for run in runs)
    kept = {name: [run for run in members if last_step(run) >= at] for name, members in groups.items()}
    unfinished = [(name, run) for name, members in groups.items() for run in members if last_step(run) < at]
    return Selection(at, {name: members for name, members in kept.items() if members}, unfinished, at_shared_step)


def held_out_steps(groups: dict[str, list[RunData]], at: int) -> list[int]:
    """The validation steps up to ``at`` every compared run that validated logged a held-out accuracy at (a run
    that never validated, ``trainer.test_freq=-1``, has no held-out column rather than taking it from the others)."""
    per_run = [
        steps for members in groups.values() for run in members
        if (steps := {step for step in accuracy_series(run.steps) if step <= at})
    ]
    return sorted(set.intersection(*per_run)) if per_run else []


def summarize_group(
    name: str, runs: list[RunData], at: int | None = None, acc_steps: list[int] | None = None,
    whole_runs: bool | None = None,
) -> dict:
    """Mean ± SE over the group's runs of every quantity, each run read at ``at`` (default: its own last step,
    for a group compared alone) and its held-out accuracy at ``acc_steps``; ``whole_runs``: see
    ``stapo.runs.summary.summarize_run``."""
    # one entropy source for the whole group: runs from before the driver logged the token mean (a sweep
    # resumed across an upgrade) would otherwise mix it with actor/entropy of another aggregation
    token_mean_entropy = all(logged_token_mean_entropy(run) for run in runs)
    summaries = [
        summarize_run(run, at, acc_steps, token_mean_entropy=token_mean_entropy, whole_runs=whole_runs) for run in runs
    ]
    stats = {}
    for quantity in QUANTITIES:
        values = [s.values[quantity] for s in summaries]
        stats[quantity] = mean_se_entry(values)
    all_steps = sorted({step for s in summaries for step in s.entropy})
    trajectory = {"step": [], "mean": [], "se": [], "n": []}
    for step in all_steps:
        mean, se, n = mean_se([s.entropy[step] for s in summaries if step in s.entropy])
        for key, value in zip(("step", "mean", "se", "n"), (step, mean, se, n), strict=True):
            trajectory[key].append(value)
    per_run = [s.to_json() for s in summaries]
    return {
        "group": name,
        "entropy_agg": sorted({s.entropy_agg for s in summaries}),
        "entropy_token_mean": all(s.entropy_token_mean for s in summaries),
        "seeds": [s.run.seed for s in summaries],
        "steps_trained": [s.steps_trained for s in summaries],
        "stats": stats,
        "entropy_trajectory": trajectory,
        "runs": per_run,
        "events": group_events(per_run),
    }


def mean_se_entry(values: list[float | None]) -> dict:
    """``{mean, se, n}`` over the finite values (``mean_se``), and ``nonfinite``, where some values are numbers but
    not finite: how many runs the mean leaves out although they have a value (the tables say so)."""
    mean, se, n = mean_se(values)
    entry = {"mean": mean, "se": se, "n": n}
    if nonfinite := sum(1 for value in values if value is not None and not math.isfinite(value)):
        entry["nonfinite"] = nonfinite
    return entry


# the steps of one key a warning lists before it counts the rest
SHOWN_STEPS = 5


def nonfinite_warnings(summary: list[dict]) -> tuple[list[dict], list[str]]:
    """Every non-finite value the compared runs' values were read from, by name: ``(records, warnings)``, a record
    ``{group, seed, run_dir, step, key}`` each, and one warning line per run naming its keys and steps."""
    records, warnings = [], []
    for group in summary:
        for run in group["runs"]:
            found = run.get("nonfinite") or []
            if not found:
                continue
            by_key: dict[str, list[int]] = {}
            for item in found:
                records.append({"group": group["group"], "seed": run["seed"], "run_dir": run["run_dir"], **item})
                by_key.setdefault(item["key"], []).append(item["step"])
            named = "; ".join(
                f"{key} at step {', '.join(map(str, steps[:SHOWN_STEPS]))}"
                + (f" (+{len(steps) - SHOWN_STEPS} more)" if len(steps) > SHOWN_STEPS else "")
                for key, steps in by_key.items()
            )
            warnings.append(
                f"run {run['run_dir']} (group {group['group']}, seed {run['seed']}) logged non-finite values, which "
                f"leave the run out of every mean they enter (its cells say n=... of ...): {named}"
            )
    return records, warnings


def paired_differences(summary: list[dict], baseline: str) -> list[dict]:
    """Every other group minus ``baseline``, seed by seed: ``{group, seeds, diff: {quantity: mean/se/n}}``.

    Only seeds both groups ran (with a finite value of that quantity) are paired; runs without a seed
    (found outside a sweep) are never paired. Each group holds one run per seed (``refuse_duplicate_seeds``).
    """
    names = [group["group"] for group in summary]
    if baseline not in names:
        raise ComparisonError(f"--baseline must be one of the compared groups {names}, got {baseline!r}")
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
            diff[quantity] = mean_se_entry(deltas)
        comparable = entropy_is_token_mean(group) and entropy_is_token_mean(summary[names.index(baseline)])
        out.append({"group": group["group"], "seeds": [run["seed"] for run, _ in pairs], "diff": diff,
                     "entropy_token_mean": comparable})
    return out


def build_comparison(
    groups: dict[str, list[RunData]],
    meta: dict | None = None,
    baseline: str | None = None,
    paired: bool = True,
    grid: tuple[GridAxis, GridAxis] | None = None,
    at_shared_step: bool = False,
) -> tuple[dict, str]:
    """(comparison.json's document, comparison.md's text). Raises :class:`ComparisonError` for a duplicate
    seed, no run that reached the compared step, or a baseline with no compared run."""
    refuse_duplicate_seeds(groups)
    selection = comparison_step(groups, at_shared_step)
    if not selection.groups:
        raise ComparisonError(
            f"no run reached step {selection.at}; the last steps are "
            f"{sorted({last_step(run) for _, run in selection.unfinished})} (--at-shared-step compares at the last "
            "step every run reached)"
        )
    if paired and baseline is not None and baseline in groups and baseline not in selection.groups:
        raise ComparisonError(f"no run of the baseline {baseline!r} reached step {selection.at}: nothing to pair with")
    acc_steps = held_out_steps(selection.groups, selection.at)
    whole_runs = all(ran_to_the_end(run, selection.at) for runs in selection.groups.values() for run in runs)
    summary = [
        summarize_group(name, runs, selection.at, acc_steps, whole_runs) for name, runs in selection.groups.items()
    ]
    document = {
        **(meta or {}),
        "compared_at": selection.at,
        "at_shared_step": selection.at_shared_step,
        "held_out_at": acc_steps[-1] if acc_steps and acc_steps[-1] > 0 else None,
        "best_steps": [step for step in acc_steps if step > 0],
        "unfinished": [
            {"group": name, "seed": run.seed, "last_step": last_step(run), "run_dir": str(run.path)}
            for name, run in selection.unfinished
        ],
        "acc_key": "val/average/acc",
        "events_rule": RULE,
        "groups": summary,
    }
    document["nonfinite"], nonfinite = nonfinite_warnings(summary)
    if nonfinite:
        document["warnings"] = [*document.get("warnings", []), *nonfinite]
    configs = group_configs(selection.groups)
    found = differences(configs, summary[0]["group"] if baseline is None else baseline)
    document["settings"] = found
    if rules := token_rules(configs):
        document["token_rules"] = rules
    if (mixed := mixed_warning(found)) is not None:
        document["warnings"] = [*document.get("warnings", []), mixed]
    warnings = "".join(f"**Warning**: {warning}\n\n" for warning in document.get("warnings", []))
    text = warnings + step_line(document) + token_rules_markdown(rules)
    text += markdown_table(summary) + tail_table(summary) + decoding_table(summary)
    if paired and len(summary) > 1:
        baseline = summary[0]["group"] if baseline is None else baseline
        document["paired"] = {"baseline": baseline, "groups": paired_differences(summary, baseline)}
        text += paired_table(document["paired"]["groups"], baseline)
        text += paired_tail_table(document["paired"]["groups"], baseline)
        text += paired_decoding_table(document["paired"]["groups"], baseline)
    text += events_table(summary, document.get("paired", {}).get("baseline"))
    text += settings_markdown(found, len(summary))
    if grid is not None:
        text += grid_tables(summary, *grid)
    # the threshold grid of the groups that train with the S2T mask (the others log it too: the same
    # tokens, unmasked; it would repeat the table)
    for group in summary:
        runs = [truncated(run, selection.at) for run in selection.groups[group["group"]]]
        if group["stats"]["mask_ratio"]["mean"] is not None and (found := threshold_table(group["group"], runs)):
            group["threshold_grid"], table = found
            text += table
    return document, text


def group_configs(groups: dict[str, list[RunData]]) -> dict[str, list[dict]]:
    """Each group's runs' config.yaml, flattened (stapo.runs.settings.read_settings); runs without one left out."""
    return {name: [found for run in runs if (found := read_settings(run.path)) is not None]
            for name, runs in groups.items()}


def settings_differences(groups: dict[str, list[RunData]], baseline: str) -> dict:
    """What the compared groups differ in (stapo.runs.settings), from the compared runs' config.yaml."""
    return differences(group_configs(groups), baseline)


def write_comparison(
    groups: dict[str, list[RunData]],
    out_dir: Path,
    meta: dict | None = None,
    baseline: str | None = None,
    paired: bool = True,
    grid: tuple[GridAxis, GridAxis] | None = None,
    at_shared_step: bool = False,
) -> dict:
    """``comparison.md`` and ``comparison.json`` in ``out_dir`` (see :func:`build_comparison`); returns the
    JSON document. Nothing is written when the comparison is refused."""
    document, text = build_comparison(groups, meta, baseline, paired, grid, at_shared_step)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "comparison.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    (out_dir / "comparison.md").write_text(text, encoding="utf-8")
    return document


def write_comparison_and_warn(groups: dict[str, list[RunData]], out_dir: Path, meta: dict, warn, **options) -> dict:
    """:func:`write_comparison` for a command (``stapo sweep``, ``stapo compare``): a warning when the runs were made
    on more than one kind of machine goes first into the files, and every warning the files carry goes to ``warn``
    (one line each)."""
    mixed = mixed_machines([run.record for runs in groups.values() for run in runs])
    if mixed:
        meta = {**meta, "warnings": [*meta.get("warnings", []), mixed]}
    document = write_comparison(groups, out_dir, meta, **options)
    for warning in document.get("warnings", []):
        warn(warning)
    return document
