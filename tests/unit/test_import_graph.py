"""The package's modules import one another without a circle.

A circle (a imports b, b imports a, even from inside a function) means neither module can be read, tested or
moved on its own; the last one, ``stapo.models.cache`` <-> ``stapo.runs.machine``, was broken by giving the
machine kind a module of its own (``stapo.machine_kind``). The graph is read from the source (every
``import stapo...`` and ``from stapo... import``, at any depth of the file), so a lazy import inside a function
counts too. A module importing its own parent package is not an edge: Python imports the parent first anyway.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def module_names(root: Path) -> dict[str, Path]:
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("stapo"):
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    targets.add(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name.startswith("stapo"))
        # importing an ancestor package is implied by being its module
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_circles_are_found():
    """The finder on a hand-made graph: one circle of three, a self-contained chain, a two-module circle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": set(), "f": {"g"}, "g": {"f", "e"}}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["f", "g"]]
    assert circles({"x": {"y"}, "y": set()}) == []


def test_package_has_no_import_circle():
    graph = import_graph(REPO / "stapo")
    assert "stapo.runs.machine" in graph and "stapo.models.cache" in graph
    assert circles(graph) == [], "modules importing one another in a circle"
