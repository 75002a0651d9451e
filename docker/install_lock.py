"""Installs the image's locked environment into the base's Python: docker/Dockerfile's install step.

    python3 docker/install_lock.py deps /opt/stapo      (needs only docker/lock/ and this file)
    python3 docker/install_lock.py project /opt/stapo   (after the sources are copied)

Two steps, so that a change of the project's code rebuilds only the second, which takes seconds.

- the lock is docker/lock/py<major><minor>.txt for the running Python (a base with another Python is refused);
- the base's torch, vLLM, triton, flash-attn, xformers, flashinfer and NVIDIA wheels are held: they were built
  together with the base's CUDA, so they are left as they are (on the stand-in base they are the lock's own);
- everything else is installed at the lock's version and hash, with no resolution at build time, so that two
  builds on different days install the same files;
- then the project itself (editable, no dependencies: the lock has them) and ``pip check``.
Exits 1 if a held package moved, 2 if there is no lock for this Python.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from importlib.metadata import distributions
from pathlib import Path

HELD = re.compile(
    r"^(torch|torchvision|torchaudio|vllm|triton|xformers|flash-attn|flashinfer(-[a-z0-9]+)?|nvidia-[a-z0-9-]+)$"
)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(text: str) -> dict[str, str]:
    """The lock's requirements by normalised name, each with its continuation (hash) lines, comments dropped."""
    entries, current = {}, None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not line.startswith((" ", "\t")):
            current = normalise(stripped.split("==")[0])
            entries[current] = stripped
        elif current is not None:
            entries[current] += "\n    " + stripped
    return entries


def locked_version(entry: str) -> str:
    """The version an entry of :func:`lock_entries` pins (``name==version`` and its hash lines)."""
    return entry.split()[0].split("==")[1]


def held_versions() -> dict[str, str]:
    found = {normalise(dist.metadata["Name"]): dist.version for dist in distributions()}
    return {name: version for name, version in found.items() if HELD.match(name)}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def install_dependencies(project: str) -> int:
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    lock = Path(project) / "docker" / "lock" / f"{tag}.txt"
    if not lock.is_file():
        print(f"install_lock: no lock for Python {tag} ({lock}); the image's locks: "
              f"{sorted(p.name for p in lock.parent.glob('py*.txt'))}", file=sys.stderr)
        return 2
    entries = lock_entries(lock.read_text(encoding="utf-8"))
    held = held_versions()
    for name in sorted(held):
        pinned = locked_version(entries[name]) if name in entries else "not in the lock"
        if pinned != held[name]:
            print(f"install_lock: held from the base: {name} {held[name]} (the lock has {pinned})")
    wanted = [entry for name, entry in entries.items() if name not in held]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(wanted) + "\n")
    pip("install", "--no-deps", "--require-hashes", "-r", handle.name)
    after = held_versions()
    moved = {name: (version, after.get(name)) for name, version in held.items() if after.get(name) != version}
    if moved:
        print(f"install_lock: the base's packages moved: {moved}", file=sys.stderr)
        return 1
    print(f"install_lock: {len(wanted)} packages at {lock.name}'s versions and hashes, {len(held)} held from the base")
    return 0


def install_project(project: str) -> int:
    pip("install", "--no-deps", "--no-build-isolation", "-e", project)
    pip("check")
    return 0


if __name__ == "__main__":
    steps = {"deps": install_dependencies, "project": install_project}
    if len(sys.argv) != 3 or sys.argv[1] not in steps:
        raise SystemExit("usage: install_lock.py deps|project PROJECT_DIR")
    raise SystemExit(steps[sys.argv[1]](sys.argv[2]))
