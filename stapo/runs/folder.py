"""One run folder as the bench sees it: its metrics per step, its group (algorithm / grid cell) and seed.

Metrics come from the folder's ``metrics.jsonl`` segments (``stapo.run_dir``) or, when a run logged
only to wandb in offline mode, from its ``wandb/offline-run-*`` log (``stapo.wandb_offline``).

The group of a run, in order of precedence: the grid cell ``stapo sweep`` wrote into
``sweep_run.json``; the value of a config key (``group_by``, read from the run's ``config.yaml``);
the folder name without a trailing seed (``stapo-seed2`` -> ``stapo``), or, for a folder named
only by its seed (``runs/stapo/seed-2``), its parent's name.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from stapo.files import write_atomically, write_text_atomically
from stapo.rundir import GZIP_SUFFIX, metric_segments, read_metrics
from stapo.wandb_offline import read_history, wandb_files

SWEEP_RECORD = "sweep_run.json"
STEP_TIME = "timing_s/step"  # verl logs it once for every step it trains
_SEED_SUFFIX = re.compile(r"^(?P<stem>.*?)(?:^|[-_.=])(?:seed|s)[-_=]?(?P<seed>\d+)$", re.IGNORECASE)


@dataclass
class RunData:
    path: Path
    steps: dict[int, dict[str, float]]
    group: str
    seed: int | None
    record: dict = field(default_factory=dict)  # sweep_run.json, when the sweep ran it


def read_run_metrics(path: str | Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl if the folder has it, else its wandb offline log."""
    path = Path(path)
    if path.is_dir() and metric_segments(path):
        return read_metrics(path)
    if wandb_files(path):
        return read_history(path)
    raise FileNotFoundError(f"{path}: neither metrics.jsonl nor a wandb offline run (wandb/offline-run-*)")


def read_record(path: Path) -> dict:
    file = path / SWEEP_RECORD
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return {}


def write_record(run, **fields) -> None:
    """``sweep_run.json`` of a planned run (``stapo.sweep.grid.PlannedRun``): its cell, seed and how it ran."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    record = {"cell": run.cell, "seed": run.seed, "cell_overrides": list(run.cell_overrides), **fields}
    write_text_atomically(run.run_dir / SWEEP_RECORD, json.dumps(record, indent=2) + "\n")


def earlier_segments(run_dir: Path) -> list[float]:
    """The seconds of the run's earlier, unfinished segments, before it is started again (it resumes from its
    checkpoint, so they are part of its wall time); none when the folder holds no metrics (a fresh start)."""
    if not metric_segments(run_dir) and not wandb_files(run_dir):
        return []
    return recorded_segments(read_record(run_dir))


def recorded_segments(record: dict) -> list[float]:
    """A sweep record's segment times: ``segments_s``, or for a record from before segments were kept its
    ``seconds``; none when the sweep did not time the run."""
    if record.get("segments_s") is not None:
        return [float(s) for s in record["segments_s"]]
    return [float(record["seconds"])] if record.get("seconds") is not None else []


CONFIG = "config.yaml"


def load_run_config(path: Path):
    """The run's resolved config as OmegaConf, from ``config.yaml`` or, in an archived run, ``config.yaml.gz``
    (results/ keeps it gzipped: eighty nearly identical copies were a fifth of the archive); None when absent.

    Read-only, and parsed once per version of the file: `stapo compare` asks for each run's config four times (its
    steps, its aggregation, its group, its settings), and parsing a verl config takes about 0.3 s, most of a
    comparison's time. A file written again is read again: the key is the file's inode, change time, modification
    time and size, so a replacement by rename (``os.replace``, a new inode and change time) is seen even when it
    has the old file's size and modification time."""
    plain, packed = Path(path) / CONFIG, Path(path) / f"{CONFIG}.gz"
    for file in (plain, packed):
        if file.is_file():
            stat = file.stat()
            version = (stat.st_ino, stat.st_ctime_ns, stat.st_mtime_ns, stat.st_size)
            return _parsed_config(str(file.resolve()), version)
    return None


@functools.lru_cache(maxsize=1024)
def _parsed_config(file: str, version: tuple[int, int, int, int]):
    """One version of a run's config file, parsed (``version`` only keys the cache)."""
    from omegaconf import OmegaConf

    data = Path(file).read_bytes()
    config = OmegaConf.create(gzip.decompress(data).decode("utf-8") if file.endswith(".gz") else data.decode("utf-8"))
    OmegaConf.set_readonly(config, True)  # shared by every caller: a change would reach the others
    return config


def has_run_config(path: Path) -> bool:
    return any((Path(path) / name).is_file() for name in (CONFIG, f"{CONFIG}.gz"))


def config_value(path: Path, key: str):
    """A dotted key of the run's resolved ``config.yaml`` (None when absent)."""
    config = load_run_config(path)
    if config is None:
        return None
    from omegaconf import OmegaConf

    return OmegaConf.select(config, key, default=None)


def name_and_seed(path: Path) -> tuple[str, int | None]:
    """Group name and seed from the folder's name (see the module docstring)."""
    match = _SEED_SUFFIX.match(path.name)
    if match is None:
        return path.name, None
    stem = match.group("stem") or path.parent.name
    return stem, int(match.group("seed"))


def load_run(path: str | Path, group_by: str | None = None) -> RunData:
    path = Path(path).resolve()
    record = read_record(path) if path.is_dir() else {}
    name, seed = name_and_seed(path)
    if group_by:
        value = config_value(path, group_by)
        group = f"{group_by.rsplit('.', 1)[-1]}={value}" if value is not None else name
    else:
        group = record.get("cell") or name
    if record.get("seed") is not None:
        seed = int(record["seed"])
    elif seed is None and (data_seed := config_value(path, "data.seed")) is not None:
        seed = int(data_seed)
    return RunData(path, read_run_metrics(path), group, seed, record)


SKIPPED = {"checkpoints", "plots", "wandb"}  # what a run folder holds besides its metrics


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and bool(metric_segments(path) or wandb_files(path))


def find_runs(path: Path) -> list[Path]:
    """``path`` itself when it is a run folder, else every run folder under it (not inside another run's)."""
    if is_run_folder(path):
        return [path]
    if not path.is_dir():
        return []
    found = []
    for child in sorted(path.iterdir()):
        if child.is_dir() and child.name not in SKIPPED:
            found += find_runs(child)
    return found


def group_runs(runs: list[RunData]) -> dict[str, list[RunData]]:
    """Runs by group, groups in first-seen order, runs by seed inside a group."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    for members in groups.values():
        members.sort(key=lambda run: (run.seed is None, run.seed or 0, str(run.path)))
    return groups


ARCHIVED_FILES = (SWEEP_RECORD,)  # besides the metrics segments and the config (gzipped: load_run_config reads it)


def archive_run(run_dir: Path, dest: Path) -> list[Path]:
    """A finished run's record, config (gzipped) and metrics segments (gzipped) copied into ``dest``: what the
    comparisons read, without checkpoints, logs and token samples, small enough to commit. A sweep whose
    ``--out`` holds such folders reads them and skips them as finished, so runs made in several sessions or on
    several machines join one comparison. The gzip header carries no time or name: the same run archives to
    the same bytes. Returns the files written."""
    segments = metric_segments(run_dir)
    if not segments:
        raise FileNotFoundError(f"{run_dir}: no metrics to archive")
    written = []
    for segment in segments:
        data = segment.read_bytes()
        if segment.name.endswith(GZIP_SUFFIX):
            name = segment.name
        else:
            name, data = segment.name + GZIP_SUFFIX, gzip.compress(data, compresslevel=9, mtime=0)
        written.append(write_atomically(dest / name, lambda tmp, data=data: tmp.write_bytes(data)))
    for name in ARCHIVED_FILES:
        if (run_dir / name).is_file():
            written.append(write_atomically(dest / name, lambda tmp, name=name: shutil.copyfile(run_dir / name, tmp)))
    if (run_dir / CONFIG).is_file():
        packed = gzip.compress((run_dir / CONFIG).read_bytes(), compresslevel=9, mtime=0)
        written.append(write_atomically(dest / f"{CONFIG}{GZIP_SUFFIX}", lambda tmp: tmp.write_bytes(packed)))
    return written
