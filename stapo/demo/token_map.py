"""The paper's analysis plots for any run folder: where the silenced tokens sit, and which they are.

- ``token_map.png``: probability (log scale) against entropy of the sampled response tokens
  (``token_samples.jsonl``, written by the trainer with ``stapo.algorithm.token_sample``), positive- and
  negative-advantage tokens in two panels, with the S2T region (p < tau_p, H < tau_h of the step)
  drawn and the silenced tokens marked;
- the spurious-token table is ``spurious_summary.md`` (``stapo.spurious_log.write_summary``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

SAMPLE_NAME = "token_samples.jsonl"


def read_samples(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / SAMPLE_NAME
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed run
    return records


def draw_token_map(
    run_dir: Path, out: Path, tau_p: float | None = None, tau_h_by_step: dict[int, float] | None = None
) -> Path | None:
    """Scatter of the run's token samples (the last logged step), with the S2T region; None without samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_samples(run_dir)
    if not records:
        return None
    step = max(r["step"] for r in records)
    records = [r for r in records if r["step"] == step and r["prob"] > 0 and math.isfinite(r["entropy"])]
    tau_h = (tau_h_by_step or {}).get(step)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, (title, keep) in zip(
        axes, (("A > 0 (the only ones S2T can silence)", lambda a: a > 0), ("A < 0 (never silenced)", lambda a: a < 0))
    ):
        chosen = [r for r in records if keep(r["advantage"])]
        plain = [r for r in chosen if not r["silenced"]]
        silenced = [r for r in chosen if r["silenced"]]
        axis.scatter([r["entropy"] for r in plain], [r["prob"] for r in plain], s=4, alpha=0.4, label="tokens")
        if silenced:
            axis.scatter(
                [r["entropy"] for r in silenced], [r["prob"] for r in silenced], s=18, c="red", label="silenced"
            )
        if tau_p is not None:
            axis.axhline(tau_p, color="gray", linestyle="--", linewidth=1, label=f"tau_p={tau_p:g}")
        if tau_h is not None and math.isfinite(tau_h):
            axis.axvline(tau_h, color="gray", linestyle=":", linewidth=1, label=f"tau_h={tau_h:.3f}")
            if tau_p is not None:
                axis.fill_between([0, tau_h], [tau_p, tau_p], [1e-12, 1e-12], color="red", alpha=0.08)
        axis.set_yscale("log")
        axis.set_xlabel("entropy H (nats)")
        axis.set_title(f"{title}: {len(chosen)} tokens")
        axis.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("probability p of the sampled token")
    fig.suptitle(f"{Path(run_dir).name}, step {step}: probability vs entropy (S2T region shaded)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def analysis_plots(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """For every run folder with token samples: its probability-entropy map (tau_p from its config.yaml,
    tau_h per step from its metrics) and, where it logged silenced tokens, its spurious-token table."""
    from omegaconf import OmegaConf

    from stapo.runs.folder import read_run_metrics
    from stapo.spurious_log import write_summary

    written = []
    for run_dir in map(Path, run_dirs):
        if not run_dir.is_dir():
            continue
        config = run_dir / "config.yaml"
        tau_p = (
            OmegaConf.select(OmegaConf.load(config), "actor_rollout_ref.actor.policy_loss.tau_p")
            if config.exists()
            else None
        )
        try:
            metrics = read_run_metrics(run_dir)
        except FileNotFoundError:
            metrics = {}
        tau_h = {step: m["actor/stapo/tau_h"] for step, m in metrics.items() if "actor/stapo/tau_h" in m}
        path = draw_token_map(run_dir, Path(out_dir) / f"token_map_{run_dir.resolve().name}.png", tau_p, tau_h)
        if path is not None:
            written.append(path)
        if write_summary(run_dir):
            written.append(run_dir / "spurious_summary.md")
    return written
