"""The files `stapo data prepare` writes, checked before a row is read and written whole.

Nothing a user gave is overwritten: an output that is the input itself (the same file after symlinks and
relative paths, e.g. ``--input DIR/train.parquet --out DIR``) is always refused, and one that already exists
is replaced only with ``--force``. The checks run before the input is read, so a refusal costs nothing and
leaves nothing behind. A split's three files are written beside their names first and renamed over them only
once all three are whole (as ``stapo.files.write_atomically`` does for one file), so an interrupted or failed
run leaves the old files or the new ones, never half of one, and no parquet without its summary. A run killed
outright (no ``finally`` runs) leaves its temporary files: they carry the host and process id, and the next run
of the split removes those of this host whose process is gone (another host's, on shared storage, it cannot
judge, and leaves). Every failure is a :class:`DataError`: one line naming the path.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from stapo.data.readers import DataError

KINDS = (".parquet", ".skipped.jsonl", ".summary.json")


def split_files(folder: Path, split: str) -> list[Path]:
    """The three files of one split: the rows, the skipped rows, the summary."""
    return [Path(folder) / f"{split}{kind}" for kind in KINDS]


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # symlinks, relative paths and hard links alike
    except OSError:
        return False


def _check_folder(out_dir: Path, folder: Path) -> None:
    """``folder`` can be made and written: its nearest existing ancestor is a writable folder."""
    for place in (folder, *folder.parents):
        if not (place.exists() or place.is_symlink()):
            continue
        if not place.is_dir():
            what = "a file" if place.is_file() else "not a folder"
            raise DataError(f"--out {out_dir}: {place} is {what}; --out names a folder (or one to create)")
        if not os.access(place, os.W_OK | os.X_OK):
            raise DataError(f"--out {out_dir}: {place} is not writable; choose another --out DIR")
        return


def check_outputs(out_dir: Path, folder: Path, split: str, inputs: Iterable[Path], force: bool) -> None:
    """Refuse, before anything is read: an output that is an input (even with ``--force``), an output that is a
    folder, an output that exists without ``--force``, or a folder that cannot be written. A killed run's
    temporary files are removed first (:func:`remove_stale_temporaries`)."""
    out_dir, folder = Path(out_dir), Path(folder)
    _check_folder(out_dir, folder)
    outputs = split_files(folder, split)
    for output in outputs:
        remove_stale_temporaries(output)
    for output in outputs:
        for given in inputs:
            if _same_file(output, given):
                raise DataError(f"--out {out_dir} would overwrite the input {given} with its conversion ({output}); "
                                "choose another --out DIR")
        if output.is_dir():
            raise DataError(f"{output} is a folder; choose another --out DIR")
    existing = [output.name for output in outputs if output.exists() or output.is_symlink()]
    if existing and not force:
        raise DataError(f"{folder}: {', '.join(existing)} already exist(s); --force replaces them "
                        "(or choose another --out DIR)")


def writing(path: Path, error: OSError) -> DataError:
    """The one line for a write that failed after the checks (a full disk, a folder made read-only meanwhile)."""
    return DataError(f"{error.filename or path}: cannot write ({error.strerror or error})")


def _owner() -> str:
    """``HOST-PID``, the part of a temporary name that says whose it is (a host name holds no ``-PID.`` tail)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{_owner()}.{uuid.uuid4().hex[:8]}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """The temporary files of ``path`` that a writer on this host left when it was killed (its process is gone),
    removed; the removed ones. A live writer's, and another host's, are left."""
    prefix = f".{path.name}.{socket.gethostname()}-"
    removed = []
    for tmp in Path(path).parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(prefix):].split(".", 1)[0] if tmp.name.startswith(prefix) else ""
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def write_together(writes: dict[Path, Callable[[Path], object]]) -> None:
    """``write(tmp)`` for every file, each beside its final name, then every ``tmp`` renamed over its file; the
    temporary files never outlive the call (the writer's own names: host and process, :func:`temporary_name`)."""
    for path in writes:
        remove_stale_temporaries(path)
    temps = {path: temporary_name(path) for path in writes}
    try:
        for path, write in writes.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            write(temps[path])
        for path, tmp in temps.items():
            tmp.replace(path)
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
