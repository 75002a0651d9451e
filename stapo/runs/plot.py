"""`stapo plot RUN_DIR [RUN_DIR ...]`: the paper's training curves from any runs' logged metrics.

Reads each run folder's ``metrics.jsonl`` segments (``stapo.run_dir``; CPU demo or GPU cluster), or
a run that logged only to wandb in offline mode (its ``wandb/offline-run-*`` log), and draws one PNG
per quantity: reward and accuracy, policy entropy, and STAPO's mask ratio and entropy threshold tau_h.

Runs are grouped by algorithm (the ``stapo sweep`` cell, a config key given with ``--group-by``, or
the folder name without its seed, see ``stapo.runs.folder``): one line per group, the mean over its
seeds, with a band of +- one standard error where two or more seeds logged the step. ``--per-run``
draws one line per folder instead. ``comparison.md`` / ``.json`` next to the PNGs hold the numbers.

A set's folder (a sweep's ``--out``, an archived set under results/) stands for the run folders under its
``runs/``. The repository keeps no plots: ``stapo plot results/<set> --out DIR`` draws them again; for a
recorded set whose run folders are gone, from the per-run series its ``comparison.json`` kept
(``stapo.runs.archive``), and only those.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from stapo.algorithm.validation import did_you_mean
from stapo.rundir import ENTROPY_KEYS
from stapo.runs.archive import has_comparison, runs_from_comparison
from stapo.runs.compare import ComparisonError, add_step_option, write_comparison
from stapo.runs.folder import RunData, find_runs, group_runs, is_run_folder, load_run, load_run_config, read_run_metrics
from stapo.runs.stats import mean_se


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]  # the first key a run has is drawn
    ylabel: str


FIGURES: dict[str, tuple[Panel, ...]] = {
    "reward": (
        Panel("training reward (mean)", ("critic/score/mean", "critic/rewards/mean"), "reward"),
        Panel("training accuracy", ("reward/acc/mean",), "accuracy"),
        Panel("held-out accuracy (validation)", ("val/average/acc",), "accuracy"),
    ),
    # the driver's token mean first: actor/entropy is aggregated with the run's loss_agg_mode
    "entropy": (Panel("policy entropy (mean over response tokens)", ENTROPY_KEYS, "nats"),),
    "mask": (
        Panel("STAPO mask ratio (silenced / response tokens)", ("actor/stapo/mask_ratio",), "ratio"),
        Panel("silenced tokens' share of the gradient bound (positive tokens)",
              ("actor/stapo/grad_bound_share_spurious",), "share"),
        Panel("entropy threshold tau_h", ("actor/stapo/tau_h",), "nats"),
    ),
}


def series(steps: dict[int, dict[str, float]], keys: tuple[str, ...]) -> tuple[str, list[int], list[float]] | None:
    """(key, steps, values) of the first key any step has, or None."""
    for key in keys:
        points = [(step, metrics[key]) for step, metrics in steps.items() if key in metrics]
        if points:
            return key, [p[0] for p in points], [p[1] for p in points]
    return None


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Folder names, made unique with their parent's name where two runs share one."""
    names = [path.resolve().name for path in run_dirs]
    return [
        f"{path.resolve().parent.name}/{name}" if names.count(name) > 1 else name
        for path, name in zip(run_dirs, names, strict=True)
    ]


def _draw_figures(out_dir: Path, draw_panel, legend: dict) -> list[Path]:
    """One PNG per figure of ``FIGURES`` that has data. ``draw_panel(ax, panel)`` draws the panel's
    series and returns how many; axes, titles and the empty-panel note are the same for every plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, panels in FIGURES.items():
        fig, axes = plt.subplots(len(panels), 1, figsize=(7, 3 * len(panels)), squeeze=False)
        drawn = 0
        for ax, panel in zip(axes[:, 0], panels, strict=True):
            drawn += draw_panel(ax, panel)
            ax.set_title(panel.title)
            ax.set_xlabel("step")
            ax.set_ylabel(panel.ylabel)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(**legend)
            else:
                ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center", transform=ax.transAxes)
        if drawn:
            fig.tight_layout()
            path = out_dir / f"{name}.png"
            fig.savefig(path, dpi=100)
            written.append(path)
        plt.close(fig)
    return written


# A per-step curve longer than this is drawn faint, under its trailing mean over SMOOTH_WINDOW steps:
# a step's accuracy on 64 samples has a standard error near 0.06, which hides a rise of 0.1 over 100
# steps; the mean of 10 steps has a third of that.
SMOOTH_ABOVE = 30
SMOOTH_WINDOW = 10


def trailing_mean(values: list[float], window: int = SMOOTH_WINDOW) -> list[float]:
    """Mean of each value and the ``window - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def plot_series(ax, xs: list[int], ys: list[float], label: str):
    """A curve with markers; a long one faint, with its trailing mean as the labelled line. Returns that line."""
    if len(xs) <= SMOOTH_ABOVE:
        return ax.plot(xs, ys, marker="o", markersize=3, label=label)[0]
    (faint,) = ax.plot(xs, ys, linewidth=0.8, alpha=0.3)
    return ax.plot(xs, trailing_mean(ys), color=faint.get_color(), linewidth=2,
                   label=f"{label} ({SMOOTH_WINDOW}-step mean)")[0]


def draw(runs: dict[str, dict[int, dict[str, float]]], out_dir: Path) -> list[Path]:
    """One line per run; returns the files written."""

    def draw_panel(ax, panel: Panel) -> int:
        drawn = 0
        for label, steps in runs.items():
            found = series(steps, panel.keys)
            if found is not None:
                _, xs, ys = found
                plot_series(ax, xs, ys, label)
                drawn += 1
        return drawn

    return _draw_figures(out_dir, draw_panel, {})


def summary_rows(runs: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    """A markdown table: steps, held-out accuracy first -> last, mean mask ratio, seconds per step."""
    rows = ["| run | steps | held-out acc (first -> last) | mean mask ratio | s/step |", "|---|---|---|---|---|"]
    for label, steps in runs.items():
        val = series(steps, ("val/average/acc",))
        mask = series(steps, ("actor/stapo/mask_ratio",))
        timing = series(steps, ("timing_s/step",))
        acc = f"{val[2][0]:.3f} -> {val[2][-1]:.3f}" if val else "-"
        mask_mean = f"{sum(mask[2]) / len(mask[2]):.4f}" if mask else "-"
        per_step = f"{sum(timing[2]) / len(timing[2]):.1f}" if timing else "-"
        trained = sum(1 for metrics in steps.values() if "timing_s/step" in metrics)
        rows.append(f"| {label} | {trained} | {acc} | {mask_mean} | {per_step} |")
    return rows


def group_series(runs: list[RunData], keys: tuple[str, ...]) -> tuple[list[int], list[float], list[float | None]]:
    """Steps, mean and standard error over the group's runs (each run's first key of ``keys`` it logged)."""
    per_step: dict[int, list[float]] = {}
    for run in runs:
        found = series(run.steps, keys)
        if found is not None:
            for step, value in zip(found[1], found[2], strict=True):
                per_step.setdefault(step, []).append(value)
    steps = sorted(per_step)
    stats = [mean_se(per_step[step]) for step in steps]
    return steps, [m for m, _, _ in stats], [se for _, se, _ in stats]


def draw_groups(groups: dict[str, list[RunData]], out_dir: Path) -> list[Path]:
    """Per group its mean over seeds and a +- s.e. band; returns the files written."""

    def draw_panel(ax, panel: Panel) -> int:
        drawn = 0
        for label, runs in groups.items():
            steps, means, ses = group_series(runs, panel.keys)
            if not steps:
                continue
            line = plot_series(ax, steps, means, f"{label} (n={len(runs)})")
            lows = [m - se if se is not None else m for m, se in zip(means, ses, strict=True)]
            highs = [m + se if se is not None else m for m, se in zip(means, ses, strict=True)]
            if any(se is not None for se in ses):
                ax.fill_between(steps, lows, highs, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn += 1
        return drawn

    legend = {"title": "mean ± s.e. over seeds", "fontsize": "small", "title_fontsize": "small"}
    return _draw_figures(out_dir, draw_panel, legend)


def plot_groups(
    run_dirs: list[Path], out_dir: Path, group_by: str | None = None, at_shared_step: bool = False
) -> list[Path]:
    """comparison.md / comparison.json (mean +- s.e. per group, stapo.runs.compare) and the grouped figures.
    A comparison that would mislead (two runs of one seed in a group) is refused before anything is drawn."""
    groups = group_runs([load_run(path, group_by) for path in run_dirs])
    write_comparison(groups, out_dir, {"run_dirs": [str(p) for p in run_dirs]}, at_shared_step=at_shared_step)
    written = draw_groups(groups, out_dir)
    print((out_dir / "comparison.md").read_text(encoding="utf-8"))
    return written + [out_dir / "comparison.md", out_dir / "comparison.json"]


def plot_runs(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    runs = {label: read_run_metrics(path) for label, path in zip(run_labels(run_dirs), run_dirs, strict=True)}
    written = draw(runs, out_dir)
    table = "\n".join(summary_rows(runs)) + "\n"
    (out_dir / "summary.md").write_text(table, encoding="utf-8")
    print(table)
    return written


def check_group_by(parser: argparse.ArgumentParser, run_dirs: list[Path], key: str) -> None:
    """``--group-by`` names a key of the runs' config.yaml; a misspelt one would put every run in its own group."""
    from omegaconf import OmegaConf

    configs = [config for config in map(load_run_config, run_dirs) if config is not None]
    if not configs or any(OmegaConf.select(config, key, default=None) is not None for config in configs):
        return
    keys = _dotted_keys(OmegaConf.to_container(configs[0]))
    parser.error(f"--group-by {key}: no run's config.yaml has this key{did_you_mean(key, keys)}")


def _dotted_keys(node, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return [prefix] if prefix else []
    keys = [prefix] if prefix else []
    for name, value in node.items():
        keys += _dotted_keys(value, f"{prefix}.{name}" if prefix else str(name))
    return keys


def set_runs(path: Path) -> Path:
    """Where a set's run folders are: its ``runs/`` (a sweep's ``--out``, an archived set), else the folder."""
    return path / "runs" if (path / "runs").is_dir() else path


def is_set_folder(path: Path) -> bool:
    """A folder that is no run folder but holds run folders (a sweep's ``--out``, results/<set>) or a comparison."""
    return path.is_dir() and not is_run_folder(path) and (bool(find_runs(set_runs(path))) or has_comparison(path))


def expand_sets(paths: list[Path]) -> list[Path]:
    """Each set folder replaced by its run folders; run folders (and wandb logs) as given."""
    run_dirs: list[Path] = []
    for path in paths:
        found = find_runs(set_runs(path)) if is_set_folder(path) else [path]
        run_dirs += [run for run in found if run not in run_dirs]
    return run_dirs


def plot_comparison(folder: Path, out_dir: Path, per_run: bool) -> int:
    """The figures of a recorded comparison whose run folders are gone, from the per-run series its
    ``comparison.json`` keeps (stapo.runs.archive.runs_from_comparison): what it did not keep is not drawn."""
    groups = runs_from_comparison(folder)
    if per_run:
        written = draw({f"{name} seed {run.seed}": run.steps for name, runs in groups.items() for run in runs}, out_dir)
    else:
        written = draw_groups(groups, out_dir)
    for path in written:
        print(f"[plot] wrote {path}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stapo plot", description=__doc__)
    parser.add_argument("run_dirs", nargs="+", type=Path,
                        help="run folders (stapo.run_dir of each run), or a set's folder (a sweep's --out, "
                        "results/<set>)")
    parser.add_argument("--out", type=Path, help="where the PNGs go (default: RUN_DIR/plots of the first run)")
    parser.add_argument("--group-by", metavar="CONFIG_KEY", help="group by this key of each run's config.yaml")
    parser.add_argument("--per-run", action="store_true", help="one line per run folder, no grouping")
    add_step_option(parser)
    args = parser.parse_args(argv)
    for path in args.run_dirs:
        if not path.exists():
            parser.error(f"{path}: does not exist")
        if path.is_file() and path.suffix != ".wandb":
            parser.error(f"{path}: is a file; give its run folder (stapo.run_dir, which holds metrics.jsonl)")
    sets = [path for path in args.run_dirs if is_set_folder(path)]
    if sets and not any(find_runs(set_runs(path)) for path in sets):
        if len(args.run_dirs) > 1:
            parser.error(f"{sets[0]}: a recorded comparison whose run folders are gone is drawn alone")
        return plot_comparison(sets[0], args.out or sets[0] / "plots", args.per_run)
    first, args.run_dirs = args.run_dirs[0], expand_sets(args.run_dirs)
    if args.group_by:
        check_group_by(parser, args.run_dirs, args.group_by)
    out = args.out or (first if first.is_dir() else first.parent) / "plots"
    try:
        empty = [str(path) for path in args.run_dirs if not read_run_metrics(path)]
        if len(empty) == len(args.run_dirs):
            print(f"stapo plot: error: no metric line could be read from {empty}", file=sys.stderr)
            return 1
        if empty:
            print(f"stapo plot: warning: no metric line could be read from {empty}; plotting the other runs",
                  file=sys.stderr)
        if args.per_run:
            written = plot_runs(args.run_dirs, out)
        else:
            written = plot_groups(args.run_dirs, out, args.group_by, args.at_shared_step)
    except FileNotFoundError as error:
        parser.error(str(error))
    except ComparisonError as error:
        print(f"stapo plot: error: {error}", file=sys.stderr)
        return 2
    from stapo.demo.token_map import analysis_plots

    written += analysis_plots(args.run_dirs, out)  # the paper's probability-entropy map, silenced-token table
    for path in written:
        print(f"[plot] wrote {path}")
    return 0
