"""Files written whole: every file a reader may open while it is being (re)written goes through here.

``write_atomically`` writes beside the final name and renames over it, so a reader sees the old file or the new
one, never half of one. The temporary name is the writer's own (process id and a random part): the runs of a sweep
start side by side and each prepares the same shared data folder; with one shared temporary name the second rename
found the file already moved (a sweep's first run failed so on a fresh machine). Writers of the same content may
race; the last rename wins.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any, Callable


def write_atomically(path: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` beside ``path``, then rename ``tmp`` over it; the temporary file never outlives the call."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomically(path: Path, text: str) -> Path:
    """``text`` (UTF-8) as the whole of ``path``, by ``write_atomically``."""
    return write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def sha256_file(path: Path) -> str:
    """The hex sha256 of ``path``'s bytes: how a run records, and every process re-checks, a file it executes or
    reads as data (a rule, a loss, a reward, the training files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
