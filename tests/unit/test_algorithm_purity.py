"""stapo/algorithm/ is pure: its modules import only the standard library, torch, numpy and each other.

The README says the algorithm is pure tensor functions; this keeps it true (a verl, Ray or Hydra import,
or one of the package's command-line, run-folder or plugin modules, fails here).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ALGORITHM = Path(__file__).resolve().parents[2] / "stapo" / "algorithm"
ALLOWED_THIRD_PARTY = {"torch", "numpy"}  # numpy: the exact quantile's partition (quantile.py)


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module)
    return roots


def test_the_algorithm_imports_only_stdlib_torch_and_itself():
    offenders = {}
    for path in sorted(ALGORITHM.glob("*.py")):
        bad = sorted(
            name
            for name in imported_roots(path)
            if not (
                name.split(".")[0] in sys.stdlib_module_names
                or name.split(".")[0] in ALLOWED_THIRD_PARTY
                or name.startswith("stapo.algorithm")
                or name == "__future__"
            )
        )
        if bad:
            offenders[path.name] = bad
    assert not offenders, f"stapo/algorithm/ must stay pure: {offenders}"


def test_the_checker_sees_a_forbidden_import(tmp_path):
    (tmp_path / "x.py").write_text("import verl\nfrom stapo.rundir import x\nimport torch\n")
    assert imported_roots(tmp_path / "x.py") == {"verl", "stapo.rundir", "torch"}
