"""The suite's split over pytest-xdist workers (tests/parallel.py), with the real pytest and xdist.

A unit (a module, the launch package, the modules of the shared runs) must run whole on one worker:
otherwise a package or session fixture (the two-node cluster, a shared trainer run) starts twice.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.parallel import SHARED_RUNS, unit_of

REPO = Path(__file__).resolve().parents[2]


def test_units_from_node_ids():
    assert unit_of("tests/e2e/test_paired.py::test_x") == SHARED_RUNS
    assert unit_of("tests/bench/test_algos_train.py::test_y[entropy20_run]") == SHARED_RUNS
    assert unit_of("tests/launch/test_cluster.py::test_z") == "tests/launch/"
    assert unit_of("tests/launch/test_static.py::test_w[a::b]") == "tests/launch/"
    assert unit_of("tests/unit/test_loss.py::test_v[0]") == "tests/unit/test_loss.py"
    assert unit_of("tests/unit/test_loss.py::Test::test_v") == "tests/unit/test_loss.py"


def pytest_run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # starts processes: out of make test-fast
def test_each_unit_runs_on_one_worker():
    # two modules of the launch package (one unit) and two plain modules, on two workers
    modules = ["tests/launch/test_port_plan.py", "tests/launch/test_skypilot.py",
               "tests/unit/test_mask_defaults.py", "tests/unit/test_replay_order.py"]
    result = pytest_run("-n", "2", "-v", *modules)
    assert result.returncode == 0, result.stdout[-3000:]
    workers = defaultdict(set)
    for worker, nodeid in re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", result.stdout, re.M):
        workers[unit_of(nodeid)].add(worker)
    assert set(workers) == {"tests/launch/", "tests/unit/test_mask_defaults.py", "tests/unit/test_replay_order.py"}
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)
    # both workers got work: the split is not one worker taking everything
    assert set().union(*workers.values()) == {"gw0", "gw1"}


def test_a_module_reading_a_shared_run_must_be_listed(tmp_path):
    stray = tmp_path / "test_stray.py"
    stray.write_text("def test_reads_it(stapo_run):\n    pass\n")
    # tests/conftest.py is not on the stray module's path: load the suite's plugins by name
    result = pytest_run("--collect-only", "-q", "-p", "tests.e2e.shared_runs", "-p", "tests.parallel",
                        "--rootdir", str(REPO), str(stray))
    assert result.returncode != 0
    assert "SHARED_RUN_MODULES" in result.stdout + result.stderr
    assert "test_stray.py" in result.stdout + result.stderr
