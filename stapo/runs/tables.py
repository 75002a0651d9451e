"""The markdown of a comparison (``comparison.md``), written from the document ``stapo.runs.compare`` builds.

Text only: every number here is read from the document, so the tables and ``comparison.json`` cannot
disagree.
"""

from __future__ import annotations

from stapo.eval.core import DECODING
from stapo.rundir import ENTROPY_TOKEN_MEAN
from stapo.runs.summary import (
    ACC,
    DECODING_ACC,
    ENTROPY,
    ENTROPY_MAX,
    GRAD_BOUND,
    LATE_STEPS,
    MASK,
    NORM_SHARE,
    TAIL_MASS,
    TAIL_MASS_MAX,
    TAIL_QUANTITIES,
    TOKEN_MEAN,
)

NOT_TOKEN_MEAN = " †"
ENTROPY_NOTE = (
    f"\n†: `{ENTROPY}` aggregated with this run's `loss_agg_mode` (not {TOKEN_MEAN}), as verl logs it, from runs "
    f"without `{ENTROPY_TOKEN_MEAN}`: not the mean entropy of a response token, so not comparable with the other "
    "rows' entropy.\n"
)


def entropy_is_token_mean(group: dict) -> bool:
    return group.get("entropy_token_mean", True)


def cell(stat: dict, digits: int, of: int | None = None) -> str:
    """``mean ± se`` of a group's quantity; with ``of`` (the group's runs, or its seeds paired), followed by
    ``(n=k of N)`` when fewer runs entered the mean, so a run whose value is missing or not finite (left out by
    ``mean_se``) never vanishes from a table that still lists its seed. '-': no run had a value (with
    ``(n=0 of N)`` when some had a non-finite one)."""
    n = stat.get("n")
    short = f" (n={n} of {of})" if of is not None and n is not None and n < of else ""
    if stat["mean"] is None:
        return "-" + (short if stat.get("nonfinite") else "")
    text = f"{stat['mean']:.{digits}f}"
    return text + (f" ± {stat['se']:.{digits}f}" if stat["se"] is not None else "") + short


def runs_of(group: dict) -> int:
    """The number of runs a group's means are over at most (its listed seeds)."""
    return len(group["seeds"])


def step_line(document: dict) -> str:
    """Which step the tables compare, and which runs they leave out (short of it)."""
    at, acc_step = document["compared_at"], document.get("held_out_at")
    mode = "the last step every run reached" if document.get("at_shared_step") else "the configured last step"
    line = f"Every run compared at step {at} ({mode}); held-out accuracy at step {acc_step}"
    best = document.get("best_steps") or []
    line += f", best of steps {', '.join(str(s) for s in best)} (step 0, before training, never counts).\n" if best \
        else " (no held-out step after step 0: no best).\n"
    unfinished = document.get("unfinished") or []
    if unfinished:
        line += (
            f"\n**Left out, short of step {at}** ({len(unfinished)} run(s); `--at-shared-step` compares every run "
            "at the last step they all reached):\n\n"
        )
        line += "\n".join(
            f"- {run['group']} seed {run['seed']}: last step {run['last_step']} ({run['run_dir']})"
            for run in unfinished
        ) + "\n"
    return line + "\n"


def markdown_table(groups: list[dict]) -> str:
    header = (
        "| group | seeds | held-out acc, step 0 | final held-out acc | best held-out acc "
        f"| train reward, last {LATE_STEPS} steps | entropy first -> last | mask ratio | spurious grad share "
        "| wall time (s) |"
    )
    rows = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    for group in groups:
        s, of = group["stats"], runs_of(group)
        seeds = ",".join("?" if seed is None else str(seed) for seed in group["seeds"])
        entropy = f"{cell(s['entropy_first'], 3, of)} -> {cell(s['entropy_last'], 3, of)}"
        entropy += "" if entropy_is_token_mean(group) else NOT_TOKEN_MEAN
        rows.append(
            f"| {group['group']} | {seeds} | {cell(s['initial_acc'], 3, of)} | {cell(s['final_acc'], 3, of)} "
            f"| {cell(s['best_acc'], 3, of)} | {cell(s['late_reward'], 3, of)} | {entropy} "
            f"| {cell(s['mask_ratio'], 5, of)} | {cell(s['grad_share'], 4, of)} | {cell(s['wall_s'], 0, of)} |"
        )
    note = (
        "\nmean ± standard error over seeds (sample std / sqrt(n); no ± with one seed). Held-out accuracy: "
        f"`{ACC}` (or derived from `val-core/*/acc/mean@n`), '-' when no validation ran. Mask ratio: "
        f"mean over steps of `{MASK}`, the silenced share of response tokens; spurious grad share: "
        f"`{GRAD_BOUND[0]}` summed over steps over `{GRAD_BOUND[1]}` summed over steps, the silenced tokens' "
        "share of the positive-advantage tokens' bound on the squared logit-gradient norm (docs/algorithm.md "
        "section 5); '-' for algorithms without the S2T mask. Wall time: the sweep's clock summed over a "
        "run's segments (start-up included), or the logged step times when runs are compared before their "
        "last step. (n=k of N): only k of the group's N runs had a finite value there (the others are left out "
        "of that mean; comparison.json, `groups[].runs[]`, holds each run's). Per-step values of every run: "
        "`comparison.json`, `groups[].runs[].series`.\n"
    )
    if not all(entropy_is_token_mean(group) for group in groups):
        note += ENTROPY_NOTE
    return "\n".join(rows) + "\n" + note


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
        d, of = group["diff"], len(group["seeds"])
        seeds = ",".join(str(seed) for seed in group["seeds"]) or "none"
        rows.append(
            f"| {group['group']} | {seeds} | {cell(d['final_acc'], 3, of)} | {cell(d['best_acc'], 3, of)} "
            f"| {cell(d['late_reward'], 3, of)} | {cell(d['entropy_last'], 4, of)}"
            f"{'' if entropy_is_token_mean(group) else NOT_TOKEN_MEAN} | {cell(d['wall_s'], 0, of)} |"
        )
    if not all(entropy_is_token_mean(group) for group in differences):
        rows.append(ENTROPY_NOTE)
    return "\n".join(rows) + "\n"


# the tail's columns: (stat, title, digits), the same for the groups and the paired differences
TAIL_COLUMNS = (
    ("tail_mass", "unused mass, mean", 6),
    ("tail_mass_late", f"unused mass, last {LATE_STEPS} steps", 6),
    ("tail_mass_peak", "unused mass, largest position", 4),
    ("entropy_max_peak", "largest position entropy", 3),
    ("entropy_peak", "largest mean entropy", 4),
    ("norm_share", "S2T tokens' exact grad-norm share", 4),
)
TAIL_NOTE = (
    f"\nThe tail, over steps 1..step compared (docs/algorithm.md section 5): unused mass: `{TAIL_MASS}`, the mean "
    "probability a response position puts on tokens the task never needs (mean over steps, and over the last "
    f"{LATE_STEPS}); largest position: the largest `{TAIL_MASS_MAX}` of any step; largest position entropy: the "
    f"largest `{ENTROPY_MAX}` of any step; largest mean entropy: the largest mean entropy of a response token of "
    f"any step; exact grad-norm share: `{NORM_SHARE}`, the S2T tokens' share (silenced, or would-be-silenced "
    "at the run's tau_p and q for algorithms without the mask) of the positive-advantage tokens' exact "
    "logit-gradient norm, mean over steps. '-': not logged (vLLM rollouts, a model without unused tokens).\n"
)


def has_tail(rows: list[dict], key: str) -> bool:
    """Some row logged the driver's tail metrics (every run has a mean entropy, so its peak does not count)."""
    return any(row[key][stat]["mean"] is not None for row in rows for stat in TAIL_QUANTITIES if stat != "entropy_peak")


def tail_table(groups: list[dict]) -> str:
    """The tail metrics per group (mean ± SE over seeds); empty when no group logged any."""
    if not has_tail(groups, "stats"):
        return ""
    rows = [
        "\n| group | seeds | " + " | ".join(title for _, title, _ in TAIL_COLUMNS) + " |",
        "|---|---|" + "---|" * len(TAIL_COLUMNS),
    ]
    for group in groups:
        seeds = ",".join("?" if seed is None else str(seed) for seed in group["seeds"])
        cells = " | ".join(cell(group["stats"][stat], digits, runs_of(group)) for stat, _, digits in TAIL_COLUMNS)
        rows.append(f"| {group['group']} | {seeds} | {cells} |")
    return "\n".join(rows) + "\n" + TAIL_NOTE


def paired_tail_table(differences: list[dict], baseline: str) -> str:
    """The tail metrics paired by seed with the baseline; empty when none was logged."""
    if not has_tail(differences, "diff"):
        return ""
    rows = [
        f"\nThe tail, paired by seed: group minus `{baseline}`, mean ± standard error over the seeds both ran.\n",
        "| group | seeds paired | " + " | ".join(f"Δ {title}" for _, title, _ in TAIL_COLUMNS) + " |",
        "|---|---|" + "---|" * len(TAIL_COLUMNS),
    ]
    for group in differences:
        seeds = ",".join(str(seed) for seed in group["seeds"]) or "none"
        cells = " | ".join(cell(group["diff"][stat], digits, len(group["seeds"])) for stat, _, digits in TAIL_COLUMNS)
        rows.append(f"| {group['group']} | {seeds} | {cells} |")
    return "\n".join(rows) + "\n"


def decodings_in(rows: list[dict], key: str) -> list[str]:
    """The further decoding settings some row holds a held-out accuracy for (``stapo.val_decodings``)."""
    def held(row: dict, name: str) -> bool:
        stats = (row[key].get(f"{stat}@{name}") for stat in ("initial_acc", "final_acc"))
        return any(stat is not None and stat["mean"] is not None for stat in stats)

    return [name for name in DECODING if any(held(row, name) for row in rows)]


def setting(name: str) -> str:
    return f"{name} (T={DECODING[name]['temperature']}, top-p={DECODING[name]['top_p']})"


def decoding_table(groups: list[dict]) -> str:
    """Held-out accuracy at each further decoding the runs validated at, beside the main table's (at
    ``val_kwargs``); empty when no run validated at one."""
    names = decodings_in(groups, "stats")
    if not names:
        return ""
    rows = [
        "\n| group | seeds | " + " | ".join(f"{setting(n)}: step 0 | {n}: final" for n in names) + " |",
        "|---|---|" + "---|---|" * len(names),
    ]
    for group in groups:
        seeds = ",".join("?" if seed is None else str(seed) for seed in group["seeds"])
        s, of = group["stats"], runs_of(group)
        cells = " | ".join(f"{cell(s[f'initial_acc@{n}'], 3, of)} | {cell(s[f'final_acc@{n}'], 3, of)}" for n in names)
        rows.append(f"| {group['group']} | {seeds} | {cells} |")
    note = (
        "\nHeld-out accuracy at a further decoding setting: the same problems, samples per problem and sampler "
        f"seeds as the main table's, sampled at that setting (`stapo.val_decodings`, logged as "
        f"`{DECODING_ACC[names[0]]}`), at step 0 and at the held-out step compared. The main table's accuracy is "
        "at the run's `actor_rollout_ref.rollout.val_kwargs`.\n"
    )
    return "\n".join(rows) + "\n" + note


def paired_decoding_table(differences: list[dict], baseline: str) -> str:
    """The final held-out accuracy at each further decoding, paired by seed with the baseline; empty when none."""
    names = decodings_in(differences, "diff")
    if not names:
        return ""
    rows = [
        f"\nAt the further decodings, paired by seed: group minus `{baseline}`, mean ± standard error.\n",
        "| group | seeds paired | " + " | ".join(f"Δ final held-out acc, {setting(n)}" for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for group in differences:
        seeds = ",".join(str(seed) for seed in group["seeds"]) or "none"
        cells = " | ".join(cell(group["diff"][f"final_acc@{n}"], 3, len(group["seeds"])) for n in names)
        rows.append(f"| {group['group']} | {seeds} | {cells} |")
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
                cells.append(cell(group["stats"][stat], digits, runs_of(group)) if group else "-")
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n".join(out) + "\n"
