"""Build-once model caching shared by the local model builders."""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

BUILT_ON = "built_on"  # the marker's field naming the machine kind of the build


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> str:
    """Return ``target``, building it first if its ``marker`` file is missing.

    One process builds at a time (a lock file beside ``target``): the others wait and then use its
    result, instead of spending the same minutes of CPU on a copy (the testbed takes about 4 on one
    core; parallel tests and a sweep's runs all ask for it at once on a fresh machine). The build
    writes into a temporary sibling folder that is renamed into place, so a build that fails or is
    killed leaves no half-written checkpoint behind; a folder at ``target`` without the marker (left by
    anything else) is replaced, and a finished build that appeared meanwhile is used as it is.
    """
    if (target / marker).exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{target.name}.lock", target):
        if (target / marker).exists():  # built while this process waited
            return str(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(staging)
            if (target / marker).exists():  # finished meanwhile by a writer that does not take the lock
                return str(target)
            if target.exists():
                # a folder without the marker (an earlier layout, a copy made without the lock): incomplete by
                # definition, so replaced instead of failing the rename with "Directory not empty"
                shutil.rmtree(target)
            try:
                staging.rename(target)
            except OSError:
                if not (target / marker).exists():  # not a finished build that won a race: a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)


@contextmanager
def _exclusive(lock_path: Path, target: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``lock_path``, released on exit (and by the OS if the process dies)."""
    with open(lock_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[stapo] waiting for another process to finish building {target}", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save_checkpoint(target: Path, model, tokenizer, marker: str, report: dict) -> None:
    """A built model's folder: the HF checkpoint, its tokenizer and, last, the marker holding the recipe, what
    the build measured and the kind of machine that built it (``build_once`` takes a folder with its marker for a
    finished build). The same recipe and seed build other weights on another kind (docs/reproducibility.md)."""
    import json

    from stapo.machine_kind import machine_kind

    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / marker).write_text(json.dumps({**report, BUILT_ON: machine_kind()}, indent=2) + "\n")


def model_built_on(model_dir: str | Path) -> str | None:
    """The machine kind recorded by the build of a model this project built (its ``stapo_*.json`` marker); None
    for any other folder, a hub id, or a build from before the kind was recorded."""
    import json

    folder = Path(model_dir)
    if not folder.is_dir():
        return None
    for marker in sorted(folder.glob("stapo_*.json")):
        try:
            kind = json.loads(marker.read_text(encoding="utf-8")).get(BUILT_ON)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(kind, str):
            return kind
    return None
