"""The kind of machine a run was made on, and the kind that built its model, kept in its run folder and sweep record.

The CPU trainer's runs are bit for bit the same on one kind of machine, not across kinds: the kernels PyTorch picks
depend on the instruction set, and a model this project builds (``stapo://testbed``, ``stapo://tailbed``) is built
on the machine that first asks for it (docs/reproducibility.md). A comparison whose runs were made on several kinds
is still a valid replication, but its runs of one seed are no longer paired bit for bit, so the sweep says so.
The trainer's driver writes both kinds to the run folder (``machine.json``), so a run a Ray job made on a cluster's
node names that node's kind, not the kind of the machine that submitted it.
"""

from __future__ import annotations

from stapo.machine_kind import machine_kind
from stapo.models.cache import model_built_on


def run_machine(model_path: str) -> dict[str, str | None]:
    """What a run keeps of where it ran: this machine's kind (``machine``) and, for a model this project built, the
    kind its build recorded (``model_built_on``; None for any other model or a build from before it was recorded)."""
    return {"machine": machine_kind(), "model_built_on": model_built_on(model_path)}


def model_from_another_kind(machine: dict, model_path: str) -> str | None:
    """A note when the model at ``model_path`` was built on another kind than ``machine["machine"]`` (a cache shared
    between kinds of machine, or copied): its runs are this machine's runs of that build, not of this kind's."""
    built, here = machine.get("model_built_on"), machine.get("machine")
    if not built or built == here:
        return None
    return (f"{model_path} was built on another kind of machine ({built}; this one: {here}): this kind builds other "
            "weights from the same recipe, so these runs pair bit for bit only with runs on this build "
            "(docs/reproducibility.md)")


def mixed_machines(records: list[dict]) -> str | None:
    """A warning when the records name more than one kind of machine, or of machine that built the runs' model
    (records without the field are not counted)."""
    warnings = []
    for field, what in (("machine", "the compared runs were made on"),
                        ("model_built_on", "the compared runs' models were built on")):
        kinds = sorted({record[field] for record in records if record.get(field)})
        if len(kinds) > 1:
            warnings.append(f"{what} {len(kinds)} kinds of machine ({'; '.join(kinds)})")
    if not warnings:
        return None
    return (f"{' and '.join(warnings)}: runs of one seed are not paired bit for bit across kinds, and a model the "
            "project builds differs between them (docs/reproducibility.md)")
