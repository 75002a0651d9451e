"""stapo.verl_plugin.import_hooks on real modules written to a temporary folder and imported by Python's own
import system: a callback runs once, after the module's last line, in the process that imports it."""

from __future__ import annotations

import importlib
import sys

import pytest

from stapo.verl_plugin import import_hooks
from stapo.verl_plugin.import_hooks import after_import, waiting_for


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh package name per test, on sys.path, removed from sys.modules afterwards."""
    name = f"hooked_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("LOADED = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, root
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]
    import_hooks._FINDER.take(f"{name}.registry")


def test_a_callback_runs_once_after_the_last_line_of_its_module(package):
    name, root = package
    (root / "registry.py").write_text("REGISTRY = {}\nLAST = 'last line ran'\n")
    seen = []
    after_import(f"{name}.registry", lambda module: seen.append((dict(module.REGISTRY), module.LAST)))
    assert seen == [] and f"{name}.registry" in waiting_for()
    module = importlib.import_module(f"{name}.registry")
    assert seen == [({}, "last line ran")]
    importlib.reload(module)
    importlib.import_module(f"{name}.registry")
    assert len(seen) == 1 and f"{name}.registry" not in waiting_for()


def test_a_module_imported_before_gets_the_callback_at_once(package):
    name, root = package
    (root / "registry.py").write_text("REGISTRY = {}\n")
    module = importlib.import_module(f"{name}.registry")
    after_import(f"{name}.registry", lambda m: m.REGISTRY.setdefault("mine", 1))
    assert module.REGISTRY == {"mine": 1} and f"{name}.registry" not in waiting_for()


def test_the_module_keeps_its_loader_s_behaviour(package):
    name, root = package
    (root / "registry.py").write_text('"""doc"""\nVALUE = 3\n')
    after_import(f"{name}.registry", lambda module: None)
    module = importlib.import_module(f"{name}.registry")
    assert module.__doc__ == "doc" and module.VALUE == 3
    assert module.__spec__.origin == str(root / "registry.py")
    assert "VALUE = 3" in module.__loader__.get_source(module.__name__)  # delegated to the file loader


def test_an_error_in_a_callback_fails_the_import_loudly(package):
    name, root = package
    (root / "registry.py").write_text("REGISTRY = {}\n")

    def broken(module):
        raise RuntimeError("registration failed")

    after_import(f"{name}.registry", broken)
    with pytest.raises(RuntimeError, match="registration failed"):
        importlib.import_module(f"{name}.registry")


def test_a_callback_may_import_a_module_that_imports_the_target(package):
    """The registration pattern: the callback imports a module of ours that itself imports the registry."""
    name, root = package
    (root / "registry.py").write_text("REGISTRY = {}\n")
    (root / "ours.py").write_text(f"from {name}.registry import REGISTRY\nREGISTRY['ours'] = 'registered'\n")
    after_import(f"{name}.registry", lambda module: importlib.import_module(f"{name}.ours"))
    assert importlib.import_module(f"{name}.registry").REGISTRY == {"ours": "registered"}
