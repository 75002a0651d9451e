"""The kind of CPU this process runs on, as a run folder, a sweep record and a built model's marker name it.

A module of its own, importing nothing of the project, because both sides of a run's provenance need it: the
model builders (``stapo.models.cache`` records the kind that built a model) and the run records
(``stapo.runs.machine`` compares that with the kind a run was made on). docs/reproducibility.md says why the
kind matters: the CPU trainer is bit-for-bit reproducible on one kind of machine, not across kinds.
"""

from __future__ import annotations

import platform
from pathlib import Path

# the widest vector extension the kernels can pick, widest first (flags as /proc/cpuinfo names them)
EXTENSIONS = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def cpuinfo_fields(cpuinfo: str | None = None) -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (or of ``cpuinfo``'s text); empty where there is none."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.is_file() else ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def machine_kind(cpuinfo: str | None = None) -> str:
    """``"<CPU model name> (<widest vector extension>)"``, from ``/proc/cpuinfo`` (or ``cpuinfo``'s text)."""
    fields = cpuinfo_fields(cpuinfo)
    model = fields.get("model name") or platform.processor() or "unknown CPU"
    flags = set(fields.get("flags", "").split())
    widest = next((name for flag, name in EXTENSIONS if flag in flags), "no AVX2")
    return f"{model} ({widest})" if flags else model
