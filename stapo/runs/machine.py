"""The kind of machine a run was made on, kept in its sweep record.

The CPU trainer's runs are bit for bit the same on one kind of machine, not across kinds: the kernels PyTorch picks
depend on the instruction set, and a model this project builds (``stapo://testbed``, ``stapo://tailbed``) is built
on the machine that first asks for it (docs/reproducibility.md). A comparison whose runs were made on several kinds
is still a valid replication, but its runs of one seed are no longer paired bit for bit, so the sweep says so.
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


def mixed_machines(records: list[dict]) -> str | None:
    """A warning when the records name more than one kind of machine (records without one are not counted)."""
    kinds = sorted({record["machine"] for record in records if record.get("machine")})
    if len(kinds) < 2:
        return None
    return (f"the compared runs were made on {len(kinds)} kinds of machine ({'; '.join(kinds)}): runs of one seed are "
            "not paired bit for bit across kinds, and a model the project builds differs between them "
            "(docs/reproducibility.md)")
