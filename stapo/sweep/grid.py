"""The grid of a sweep: axes of Hydra overrides x seeds -> one planned run per (cell, seed).

``--grid algo=stapo,grpo --grid actor_rollout_ref.actor.policy_loss.tau_p=1e-3,2e-3`` is two axes;
their product gives the cells. Values split at commas outside brackets and quotes, so a list value
stays whole (``--grid 'trainer.logger=[console,file],[console]'``). Each run gets its own folder
``OUT/runs/<cell>/seed-<S>`` and the overrides that make it that run: the cell's, the seed (to
``data.seed``, the data order, and ``actor_rollout_ref.rollout.seed``, the rollout sampling; see
docs/reproducibility.md), the run folder and a checkpoint folder inside it (so an interrupted run
resumes with ``trainer.resume_mode=auto``).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from stapo.algorithm.validation import STAPOConfigError

SEED_KEYS = ("data.seed", "actor_rollout_ref.rollout.seed")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")  # no "=" or ",": the path is a Hydra override value


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class PlannedRun:
    cell: str  # e.g. "algo=stapo,tau_p=0.001"
    cell_overrides: tuple[str, ...]
    seed: int
    run_dir: Path

    def overrides(self, common: list[str]) -> list[str]:
        """Everything main_stapo gets for this run; the grid and the seed come last so they win."""
        seed = [f"{key}={self.seed}" for key in SEED_KEYS]
        slug = _UNSAFE.sub("_", f"{self.cell.replace('=', '-')}-seed{self.seed}")
        return [
            *common,
            *self.cell_overrides,
            *seed,
            f"stapo.run_dir={self.run_dir}",
            f"trainer.default_local_dir={self.run_dir / 'checkpoints'}",
            "trainer.resume_mode=auto",
            f"trainer.experiment_name={slug}",
        ]


def split_values(text: str) -> list[str]:
    """Comma-separated values, commas inside [], {}, () or quotes kept."""
    values, depth, quote, current = [], 0, "", []
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            values.append("".join(current))
            current = []
            continue
        current.append(char)
    values.append("".join(current))
    return [v.strip() for v in values]


def parse_axis(text: str) -> Axis:
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise STAPOConfigError(f"--grid {text!r}: expected KEY=V1,V2,... (a Hydra override key and its values)")
    parsed = tuple(split_values(values))
    if any(not v for v in parsed):
        raise STAPOConfigError(f"--grid {text!r}: an empty value (two commas in a row?)")
    if len(set(parsed)) != len(parsed):
        raise STAPOConfigError(f"--grid {text!r}: a value is listed twice")
    return Axis(key, parsed)


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(v) for v in split_values(text)]
    except ValueError:
        raise STAPOConfigError(f"--seeds {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise STAPOConfigError(f"--seeds {text!r}: seeds must be distinct integers >= 0")
    return seeds


def axis_label(key: str, axes: list[Axis]) -> str:
    """The key's last component when that names it uniquely among the axes ("algo", "tau_p")."""
    leaf = key.lstrip("+~").rsplit(".", 1)[-1]
    clashes = [a for a in axes if a.key.lstrip("+~").rsplit(".", 1)[-1] == leaf]
    return leaf if len(clashes) == 1 else key.lstrip("+~")


def plan(axes: list[Axis], seeds: list[int], out_dir: Path) -> list[PlannedRun]:
    keys = [a.key.lstrip("+~") for a in axes]
    if len(set(keys)) != len(keys):
        raise STAPOConfigError(f"--grid: the same key twice in {keys}")
    for key in SEED_KEYS:
        if key in keys:
            raise STAPOConfigError(f"--grid {key}: the seed keys come from --seeds")
    cells = []
    for combo in itertools.product(*(a.values for a in axes)) if axes else [()]:
        pairs = [(axis, value) for axis, value in zip(axes, combo, strict=True)]
        cell = ",".join(f"{axis_label(axis.key, axes)}={value}" for axis, value in pairs) or "base"
        overrides = tuple(f"{axis.key}={value}" for axis, value in pairs)
        cells.append((cell, overrides, _UNSAFE.sub("_", cell.replace(",", "__").replace("=", "-"))))
    # seed by seed: a sweep cut short (or the first --max-parallel jobs) holds every cell of the seeds it
    # reached, so what it has is already a paired comparison
    return [
        PlannedRun(cell, overrides, seed, (out_dir / "runs" / folder / f"seed-{seed}").resolve())
        for seed in seeds
        for cell, overrides, folder in cells
    ]


def found_seeds(axes: list[Axis], out_dir: Path) -> list[int]:
    """The seeds with a run folder (``seed-<S>``) under any of the grid's cells in ``out_dir``, in order:
    what ``--compare-only`` compares when no ``--seeds`` is given."""
    cell_dirs = {run.run_dir.parent for run in plan(axes, [0], out_dir)}
    seeds = set()
    for cell_dir in cell_dirs:
        for path in cell_dir.glob("seed-*"):
            if path.is_dir() and (seed := path.name.removeprefix("seed-")).isdigit():
                seeds.add(int(seed))
    return sorted(seeds)
