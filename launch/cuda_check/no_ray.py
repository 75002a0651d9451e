"""The one stand-in of the CUDA engine check: a ``ray`` package holding only what verl imports at module level.

Why a stub: verl 0.9.1 imports Ray at the top of modules the engine needs (``verl.protocol``, the worker base
class ``verl.single_controller.base.worker``, ``verl.checkpoint_engine.base``, ``verl.utils.ray_utils``), and
Ray cannot travel to the lent GPU machine: its wheel is compiled and larger than the whole 64 MiB the machine
receives. The check drives the worker in-process under torchrun, so no Ray call is ever made; these names only
let the imports finish. ``ray.remote`` hands back what it decorates (verl decorates classes at import time);
the classes are empty (verl's ``isinstance`` checks against them are then False, as for a non-Ray object);
the functions raise. Any other attribute raises AttributeError naming this file, so a verl change that starts
using Ray on the engine's path fails loudly instead of being skipped.

:func:`install` puts the stub into ``sys.modules`` before verl is imported: also where Ray is installed (the
CPU suite), so the suite runs the import chain the GPU machine runs.
"""

from __future__ import annotations

import sys
import types

STUB_NOTE = "launch/cuda_check/no_ray.py: the CUDA engine check runs verl's worker without Ray"


def _refuse(name: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"ray.{name} was called, but Ray is a stub here ({STUB_NOTE})")

    call.__name__ = name.rsplit(".", 1)[-1]
    return call


def remote(*args, **kwargs):
    """``@ray.remote`` and ``@ray.remote(num_cpus=...)``: the decorated class or function itself."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda target: target


def _empty_class(name: str) -> type:
    return type(name, (), {"__doc__": f"Stand-in for Ray's {name} ({STUB_NOTE})."})


# module -> the names verl imports from it (recorded from the engine's import chain, verl 0.9.1)
MODULES: dict[str, dict[str, object]] = {
    "ray": {"remote": remote, "ObjectRef": _empty_class("ObjectRef")},
    "ray.actor": {"ActorHandle": _empty_class("ActorHandle")},
    "ray.util": {},
    "ray.util.collective": {},
    "ray.util.placement_group": {
        "PlacementGroup": _empty_class("PlacementGroup"),
        "placement_group": _refuse("util.placement_group.placement_group"),
    },
    "ray.util.scheduling_strategies": {
        "NodeAffinitySchedulingStrategy": _empty_class("NodeAffinitySchedulingStrategy"),
        "PlacementGroupSchedulingStrategy": _empty_class("PlacementGroupSchedulingStrategy"),
    },
    "ray.experimental": {},
    "ray.experimental.state": {},
    "ray.experimental.state.api": {"get_actor": _refuse("experimental.state.api.get_actor")},
}


def _module(name: str, names: dict[str, object]) -> types.ModuleType:
    module = types.ModuleType(name, f"Stand-in for {name} ({STUB_NOTE}).")
    module.__path__ = []  # a package: its submodules are the other entries of MODULES
    module.__dict__.update(names)

    def missing(attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise AttributeError(
            f"{name}.{attribute} is not in the Ray stub ({STUB_NOTE}); verl reached for Ray on the engine's path: "
            "add the name to MODULES with the reason the check may do without it, or find the call that needs Ray"
        )

    module.__getattr__ = missing
    return module


def install() -> None:
    """Put the stub in ``sys.modules`` (before any verl import). Refused once the real Ray is loaded."""
    loaded = sys.modules.get("ray")
    if loaded is not None and not getattr(loaded, "__ray_stub__", False):
        raise RuntimeError(f"Ray was imported before the stub could be installed ({STUB_NOTE})")
    modules = {name: _module(name, names) for name, names in MODULES.items()}
    for name, module in modules.items():
        module.__ray_stub__ = True
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
