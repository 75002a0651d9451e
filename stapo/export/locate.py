"""Which checkpoint step `stapo export` reads: from a run folder, a checkpoint folder or a step folder.

verl's trainer saves ``<trainer.default_local_dir>/global_step_N/actor/`` (FSDP shards, ``fsdp_config.json``
and a ``huggingface/`` folder with config and tokenizer) and records the last complete step in
``latest_checkpointed_iteration.txt``. A run folder (``stapo.run_dir``) holds the resolved
``config.yaml`` that names that directory. Pure: paths and small text files only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

LATEST = "latest_checkpointed_iteration.txt"
RUN_CONFIG = "config.yaml"
_STEP_DIR = re.compile(r"global_step_(\d+)$")


class ExportError(ValueError):
    """A folder, step or file the export needs is missing; the message says which and what exists."""


@dataclass
class Source:
    ckpt_root: Path
    step: int
    run_dir: Path | None
    steps: list[int]
    notes: list[str] = field(default_factory=list)

    @property
    def actor_dir(self) -> Path:
        return self.ckpt_root / f"global_step_{self.step}" / "actor"


def available_steps(ckpt_root: Path) -> list[int]:
    """Steps with an actor checkpoint folder, ascending."""
    steps = []
    for child in ckpt_root.glob("global_step_*"):
        match = _STEP_DIR.match(child.name)
        if match and (child / "actor").is_dir():
            steps.append(int(match.group(1)))
    return sorted(steps)


def _latest(ckpt_root: Path) -> int | None:
    try:
        return int((ckpt_root / LATEST).read_text().strip())
    except (OSError, ValueError):
        return None


def _ckpt_from_run_dir(run_dir: Path) -> Path:
    config = yaml.safe_load((run_dir / RUN_CONFIG).read_text()) or {}
    directory = (config.get("trainer") or {}).get("default_local_dir")
    if not directory:
        raise ExportError(f"{run_dir / RUN_CONFIG} names no trainer.default_local_dir: pass the checkpoint folder")
    path = Path(directory)
    if not path.is_absolute():
        # relative to where the run was started, which the run folder does not record
        path = Path.cwd() / path
    if not path.is_dir():
        raise ExportError(
            f"the checkpoint folder of run {run_dir}, trainer.default_local_dir={directory}, does not exist "
            f"(looked at {path}): pass the checkpoint folder itself, with --run-dir {run_dir} for its metrics"
        )
    return path


def locate(path: str | Path, step: int | None = None, run_dir: str | Path | None = None) -> Source:
    """The checkpoint to export. ``path``: run folder, checkpoint folder, ``global_step_N`` or its ``actor``."""
    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise ExportError(f"{path} does not exist")
    given_run = Path(run_dir).expanduser().resolve() if run_dir is not None else None
    if given_run is not None and not (given_run / RUN_CONFIG).is_file():
        raise ExportError(f"--run-dir {given_run} has no {RUN_CONFIG} (a folder written with stapo.run_dir=...)")
    if path.name == "actor" and _STEP_DIR.match(path.parent.name):
        path = path.parent
    pinned = _STEP_DIR.match(path.name)
    if pinned:
        if step is not None and step != int(pinned.group(1)):
            raise ExportError(f"{path} is step {pinned.group(1)}, but --step {step} was asked for")
        step, ckpt_root = int(pinned.group(1)), path.parent
    elif (path / LATEST).is_file() or available_steps(path):
        ckpt_root = path
    elif (path / RUN_CONFIG).is_file():
        given_run = given_run or path
        ckpt_root = _ckpt_from_run_dir(path)
    else:
        raise ExportError(
            f"{path} is neither a checkpoint folder (no {LATEST}, no global_step_N/actor/) nor a run folder "
            f"(no {RUN_CONFIG}); pass trainer.default_local_dir of the run or its stapo.run_dir"
        )
    steps = available_steps(ckpt_root)
    if not steps:
        raise ExportError(f"{ckpt_root} holds no saved step (global_step_N/actor/): was trainer.save_freq > 0?")
    notes = []
    if step is None:
        latest = _latest(ckpt_root)
        step = latest if latest in steps else steps[-1]
        if latest is not None and latest not in steps:
            notes.append(f"{LATEST} names step {latest}, which is missing; exporting step {step}")
    elif step not in steps:
        raise ExportError(f"step {step} is not saved in {ckpt_root}; available steps: {', '.join(map(str, steps))}")
    source = Source(ckpt_root, step, given_run, steps, notes)
    check_actor_dir(source.actor_dir)
    return source


def check_actor_dir(actor_dir: Path) -> int:
    """World size of a complete FSDP actor checkpoint; an ExportError naming the first missing file."""
    config = actor_dir / "fsdp_config.json"
    if not config.is_file():
        megatron = (actor_dir / "dist_ckpt").exists() or (actor_dir / "model").is_dir()
        hint = " (a Megatron checkpoint: use python -m verl.model_merger merge --backend megatron)" if megatron else ""
        raise ExportError(f"{config} is missing: only FSDP checkpoints can be exported{hint}")
    world_size = int(json.loads(config.read_text()).get("world_size", 0))
    if world_size < 1:
        raise ExportError(f"{config} has no world_size >= 1")
    for rank in range(world_size):
        shard = actor_dir / f"model_world_size_{world_size}_rank_{rank}.pt"
        if not shard.is_file():
            raise ExportError(f"{shard} is missing: the checkpoint of {world_size} rank(s) is incomplete")
    if not (actor_dir / "huggingface" / "config.json").is_file():
        raise ExportError(f"{actor_dir / 'huggingface' / 'config.json'} is missing (verl saves it with every step)")
    return world_size
