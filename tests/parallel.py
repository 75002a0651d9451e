"""How the suite splits over pytest-xdist workers (``make test`` runs ``-n 2 --dist loadgroup``).

A trainer run keeps about 1.3 of the 2 cores busy (its processes take turns: rollout, old-policy pass,
update), so two tests side by side finish the end-to-end part in well under the time one after the
other takes. Every run stays bit for bit what it is alone: the CPU trainer's numbers do not depend on
the load (docs/reproducibility.md).

Each test gets an ``xdist_group``; a group runs whole on one worker, so a fixture is set up once:
- tests that read a shared trainer run (tests/e2e/shared_runs.py): one group, whatever their module;
- tests/launch/: one group (its loopback cluster is a package fixture);
- every other test: its module's group (module fixtures).
Groups holding an end-to-end or slow test are queued first (xdist then hands each free worker the
next group), so the short unit-test modules fill the end instead of a long run starting last.
Without xdist the marks change nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.shared_runs import SHARED_RUN_FIXTURES

HEAVY_MARKS = ("e2e", "slow")


def uses_shared_run(item: pytest.Item) -> bool:
    """Asks for a shared run by name, or through a parameter naming one (``request.getfixturevalue``)."""
    if SHARED_RUN_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(value, str) and value in SHARED_RUN_FIXTURES for value in params.values())


def group_of(item: pytest.Item, tests_root: Path) -> str:
    if uses_shared_run(item):
        return "shared-runs"
    module = Path(str(item.path)).relative_to(tests_root)
    if module.parts[0] == "launch":
        return "launch"
    return module.as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_root = Path(__file__).parent
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        name = group_of(item, tests_root)
        item.add_marker(pytest.mark.xdist_group(name))
        groups.setdefault(name, []).append(item)
    heavy = {name for name, members in groups.items()
             if any(item.get_closest_marker(mark) for item in members for mark in HEAVY_MARKS)}
    # stable: collection order within the heavy groups and within the rest
    ordered = sorted(groups, key=lambda name: name not in heavy)
    items[:] = [item for name in ordered for item in groups[name]]
