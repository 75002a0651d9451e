"""Build-once model caching shared by the local model builders."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> str:
    """Return ``target``, building it first if its ``marker`` file is missing.

    The build writes into a temporary sibling folder that is renamed into place, so concurrent
    processes (Ray workers, parallel tests) never see a half-written checkpoint; a process that
    loses the race drops its copy and uses the winner's.
    """
    if (target / marker).exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        try:
            staging.rename(target)
        except OSError:
            pass  # another process finished first; its result is equivalent
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)
