"""A run folder: one place with everything a run produced, readable by ``stapo plot``.

Set ``stapo.run_dir=PATH`` on any run (CPU demo or GPU cluster) and it holds:

* ``config.yaml``: the resolved config the trainer received;
* ``metrics.jsonl``: verl's ``file`` logger, one ``{"step": N, "data": {...}}`` line per step;
* ``tensorboard/``, ``wandb/`` when those loggers are on;
* ``spurious_tokens.jsonl``: the silenced tokens of sampled steps (STAPO, ``source: old``);
* ``machine.json``: the kind of machine the driver ran on and the kind that built the model
  (``stapo.runs.machine.run_machine``).

verl's file logger truncates its file when it opens it, so a resumed run would erase the metrics
of the steps before the restart: ``rotate_metrics`` renames an existing ``metrics.jsonl`` to
``metrics.prev-N.jsonl`` first, and ``read_metrics`` merges the segments step by step (a step logged
again after a resume: the later segment's record replaces the earlier one's whole). A segment may be
gzipped (``metrics.jsonl.gz``, ``metrics.prev-N.jsonl.gz``): ``stapo sweep --archive`` keeps finished
runs so, small enough for git, and every reader reads them as it reads the plain files.

Pure: file names and readers only. Pointing verl's loggers at the folder (their environment
variables, ``trainer.logger``) is verl knowledge and lives in ``stapo.verl_plugin.training.loggers``.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from stapo.files import write_text_atomically

METRICS_NAME = "metrics.jsonl"
MACHINE_NAME = "machine.json"
TENSORBOARD_NAME = "tensorboard"
WANDB_NAME = "wandb"  # wandb makes this folder itself under the directory it is given
# a metric of ours the readers prefer to verl's: the old pass's entropy averaged over every response token
# of the batch (the driver logs it, stapo.verl_plugin.training.driver_diagnostics). verl's actor/entropy is
# aggregated with the actor's loss_agg_mode, so under Dr.GRPO's or GSPO's it is not this mean
ENTROPY_TOKEN_MEAN = "actor/stapo/entropy_token_mean"
VERL_ENTROPY = "actor/entropy"
# what a tail-driven entropy event shows as (docs/algorithm.md section 5), logged by the driver and read by the
# comparisons (stapo.runs.summary): one position's largest entropy, and the probability mass on tokens the task
# never needs (models whose config names them)
ENTROPY_MAX = "actor/stapo/entropy_max"
TAIL_PREFIX = "actor/stapo/tail/"
TAIL_MASS = TAIL_PREFIX + "unused_mass_mean"
TAIL_MASS_MAX = TAIL_PREFIX + "unused_mass_max"
TAIL_SAMPLED = TAIL_PREFIX + "unused_sampled_frac"
# where both are logged, the readers (progress line, plots) show the first
ENTROPY_KEYS = (ENTROPY_TOKEN_MEAN, VERL_ENTROPY)
_SEGMENT = re.compile(r"metrics\.prev-(\d+)\.jsonl(?:\.gz)?$")
GZIP_SUFFIX = ".gz"


def metric_segments(run_dir: str | Path) -> list[Path]:
    """The metrics files of a run folder, oldest first."""
    run_dir = Path(run_dir)
    previous = sorted(
        (int(match.group(1)), path.name.endswith(GZIP_SUFFIX), path)
        for path in run_dir.glob("metrics.prev-*.jsonl*")
        if (match := _SEGMENT.search(path.name))
    )
    current = [run_dir / (METRICS_NAME + GZIP_SUFFIX), run_dir / METRICS_NAME]  # an archived copy, then the live file
    return [path for *_, path in previous] + [path for path in current if path.exists()]


def read_segment(path: Path) -> str:
    """A metrics segment's text, gzipped or not."""
    if path.name.endswith(GZIP_SUFFIX):
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    return path.read_text(encoding="utf-8")


def rotate_metrics(run_dir: str | Path) -> Path | None:
    """Move a non-empty ``metrics.jsonl`` aside so the next logger does not truncate it."""
    current = Path(run_dir) / METRICS_NAME
    if not current.exists() or current.stat().st_size == 0:
        return None
    index = len(metric_segments(run_dir))  # the current file counts: prev-1, prev-2, ...
    target = current.with_name(f"metrics.prev-{index}.jsonl")
    current.rename(target)
    return target


def read_metrics(run_dir: str | Path) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` merged over the segments; a torn last line (killed run) is skipped."""
    steps: dict[int, dict[str, float]] = {}
    segments = metric_segments(run_dir)
    if not segments:
        raise FileNotFoundError(f"{run_dir}: no {METRICS_NAME} (was the run started with stapo.run_dir set?)")
    for path in segments:
        unreadable: list[int] = []
        segment: dict[int, dict[str, float]] = {}
        for step, data in parse_metric_lines(read_segment(path), unreadable):
            segment.setdefault(step, {}).update(data)  # one segment's lines of a step are one record
        # a step logged again after a resume: the later segment's record replaces the earlier one whole, so no
        # key only the earlier segment logged survives beside the later segment's values
        steps.update(segment)
        if unreadable:
            shown = ", ".join(map(str, unreadable[:5])) + (", ..." if len(unreadable) > 5 else "")
            print(f"stapo: warning: {path}: {len(unreadable)} line(s) are not metric records, skipped (line {shown})",
                  file=sys.stderr)
    return dict(sorted(steps.items()))


def parse_metric_lines(text: str, unreadable: list[int] | None = None) -> list[tuple[int, dict[str, float]]]:
    """``(step, numeric metrics)`` of each line of a metrics file's text that is a record (``{"step": N,
    "data": {...}}``). The text after the last newline is a line still being written (or torn by a kill) and
    is skipped quietly; the numbers of other lines that are not records go to ``unreadable``."""
    records = []
    lines = text.split("\n")  # not splitlines(): U+2028 may be in text
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            step, data = int(record["step"]), record["data"]
            records.append((step, {k: v for k, v in data.items() if isinstance(v, int | float)}))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            if unreadable is not None and line.strip() and number < len(lines):
                unreadable.append(number)
    return records


def write_config(config: DictConfig, run_dir: Path) -> Path:
    """The resolved config, as the trainer will see it."""
    return write_text_atomically(run_dir / "config.yaml", OmegaConf.to_yaml(config, resolve=True))


def write_machine(machine: dict, run_dir: Path) -> Path:
    """Where the run is made (``stapo.runs.machine.run_machine``), written by its driver."""
    return write_text_atomically(run_dir / MACHINE_NAME, json.dumps(machine, indent=2) + "\n")


def read_machine(run_dir: Path) -> dict:
    """``machine.json`` of a run folder; empty when there is none (a run from before it was written) or unreadable."""
    try:
        machine = json.loads((Path(run_dir) / MACHINE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return machine if isinstance(machine, dict) else {}
