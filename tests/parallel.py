"""How the suite splits over pytest-xdist workers (``make test`` runs ``pytest -n 2``).

A trainer run keeps about 1.3 of the 2 cores busy (its processes take turns: rollout, old-policy
pass, update), so two tests side by side finish the end-to-end part sooner than one after the other.
Every run stays bit for bit what it is alone: the CPU trainer's numbers do not depend on the load
(docs/reproducibility.md).

The unit a worker takes whole (so that a fixture wider than a test is set up once):
- every module that reads a shared trainer run (``tests/e2e/shared_runs.py``): one unit, the
  ``shared-runs`` modules below, whatever their folder;
- ``tests/launch/``: one unit (its loopback two-node cluster is a package fixture);
- every other module: its own unit (module fixtures).

The unit is decided from the test's node id alone, because xdist's controller, which hands out the
work, sees node ids and nothing else. xdist's own ``--dist loadgroup`` (marks folded into the node
id by the workers) does nothing on pytest 9.2, whose node ids no longer take that rewrite; this
scheduler does not depend on it. What the node id cannot say (which fixture a test asks for) is
checked at collection instead: a test that reads a shared run from a module not listed below stops
the collection with a message naming the module, serial or parallel.

Units holding an end-to-end or slow test are collected first (the biggest ones, named in
``FIRST``, at the head), so xdist hands each free worker a long unit while there are any and the
short unit-test modules fill the end. Without xdist the order changes nothing else.
"""

from __future__ import annotations

import pytest

from tests.e2e.shared_runs import SHARED_RUN_FIXTURES

SHARED_RUNS = "shared-runs"
# the modules whose tests read a shared run: they run on one worker, so each run starts once
SHARED_RUN_MODULES = frozenset({
    "tests/bench/test_algos_train.py",
    "tests/demo/test_train_command.py",
    "tests/e2e/test_custom_rule_runs.py",
    "tests/e2e/test_paired.py",
    "tests/e2e/test_reproducible.py",
    "tests/e2e/test_trainer_cpu.py",
    "tests/export/test_export_e2e.py",
})
PACKAGE_UNITS = ("tests/launch/",)
# the longest units, handed out first (a long unit started last would leave the other worker idle)
FIRST = (SHARED_RUNS, "tests/launch/", "tests/bench/test_sweep_e2e.py")
HEAVY_MARKS = ("e2e", "slow")


def unit_of(nodeid: str) -> str:
    """The work unit of a test, from its node id (``tests/e2e/test_x.py::test_y[param]``)."""
    module = nodeid.split("::", 1)[0]
    if module in SHARED_RUN_MODULES:
        return SHARED_RUNS
    for package in PACKAGE_UNITS:
        if module.startswith(package):
            return package
    return module


def reads_shared_run(item: pytest.Item) -> bool:
    """Asks for a shared run by name, or through a parameter naming one (``request.getfixturevalue``)."""
    if SHARED_RUN_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(value, str) and value in SHARED_RUN_FIXTURES for value in params.values())


def heavy_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` grouped by unit: ``FIRST``, then the other units with a long test, then the rest;
    collection order within each (stable, so every worker computes the same order)."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)
    heavy = {unit for unit, members in units.items()
             if any(item.get_closest_marker(mark) for item in members for mark in HEAVY_MARKS)}

    def rank(unit: str) -> tuple[int, int]:
        if unit in FIRST:
            return 0, FIRST.index(unit)
        return (1 if unit in heavy else 2), 0

    return [item for unit in sorted(units, key=rank) for item in units[unit]]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # (a module outside the rootdir has an empty path in its node id: name its file)
    strays = sorted({item.nodeid.split("::", 1)[0] or str(item.path) for item in items
                     if reads_shared_run(item) and unit_of(item.nodeid) != SHARED_RUNS})
    if strays:
        raise pytest.UsageError(
            f"{', '.join(strays)} read(s) a shared trainer run: add it to SHARED_RUN_MODULES in "
            "tests/parallel.py, or two pytest-xdist workers would each start the run"
        )
    items[:] = heavy_first(items)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's; without xdist it is never called
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Every load-balancing ``--dist`` mode hands out this suite's units; ``each`` and ``no`` are xdist's."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup", "worksteal"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    # the units in collection order (heavy first, above), not xdist's largest-count-first
    config.option.loadscopereorder = False
    return SuiteScheduling(config, log)
