"""Run a function right after a named module is imported, in whichever process imports it.

Why: the plugin is loaded by ``import verl`` in every process of a run (the driver, the TaskRunner and each
Ray worker), but each registration is needed only where verl reads the registry it fills: the trainer in the
TaskRunner, the policy losses in the actor, the HF rollout where rollouts are built, the CPU patches in the
FSDP worker. Importing them all everywhere cost most of a CPU run's processes seconds of imports they never
use (docs/benchmarks-history.md, "lazy registrations", has the start-up before and after). So each registration waits
for the module holding its registry: ``after_import("verl.trainer.ppo.v1", register)`` calls
``register(module)`` once that module has run to its end, or at once if it already has.

A callback runs while the import that triggered it is still on the stack: the modules that import the target
may be half-executed. So a callback touches the target module (complete by then) and modules the target
itself imported, and imports nothing that imports the target's importers; each registration in
``stapo.verl_plugin.registration`` says why it is safe where it is hooked.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from types import ModuleType
from typing import Callable

Callback = Callable[[ModuleType], None]


class _CallbackLoader(importlib.abc.Loader):
    """The module's own loader, then the callbacks waiting for it; everything else is the real loader's."""

    def __init__(self, loader, name: str, finder: "_AfterImportFinder"):
        self._loader, self._name, self._finder = loader, name, finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for callback in self._finder.take(self._name):
            callback(module)

    def __getattr__(self, attribute):  # get_source, is_package, get_resource_reader, ...
        return getattr(self._loader, attribute)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: for a module with waiting callbacks, the spec the other finders give, with
    its loader wrapped; for any other module, nothing (the next finder answers)."""

    def __init__(self):
        self._waiting: dict[str, list[Callback]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, callback: Callback) -> None:
        with self._lock:
            self._waiting.setdefault(name, []).append(callback)

    def take(self, name: str) -> list[Callback]:
        with self._lock:
            return self._waiting.pop(name, [])

    def waiting(self) -> list[str]:
        with self._lock:
            return sorted(self._waiting)

    def find_spec(self, fullname, path, target=None):
        if fullname not in self._waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _CallbackLoader(spec.loader, fullname, self)
                return spec
        return None


_FINDER = _AfterImportFinder()


def _finder() -> _AfterImportFinder:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return _FINDER


def _imported(name: str) -> ModuleType | None:
    """The module if it has run to its end in this process (a module still executing is not)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is None or getattr(spec, "_initializing", False):
        return None
    return module


def after_import(name: str, callback: Callback) -> None:
    """``callback(module)`` once module ``name`` has been imported in this process: now if it already has,
    else right after its import finishes. An exception in the callback fails that import, loudly."""
    module = _imported(name)
    if module is not None:
        callback(module)
        return
    _finder().add(name, callback)
    module = _imported(name)  # imported by another thread meanwhile: its loader was not wrapped
    if module is not None:
        for waiting in _FINDER.take(name):
            waiting(module)


def waiting_for() -> list[str]:
    """The modules whose callbacks have not run yet in this process (for error messages and tests)."""
    return _FINDER.waiting()
