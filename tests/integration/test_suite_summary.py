"""The suite's own summary (tests/conftest.py, issue 62): its slowest modules, their worker time, and the wall time
with the machine it was taken on, printed at the end of every run, under pytest-xdist too.

A real pytest process runs the project's conftest as a plugin over a small generated module in a folder of its own:
the lines are what a contributor and CI see, not a call of the hook.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from stapo.machine_kind import machine_kind

pytestmark = [pytest.mark.slow]  # starts a pytest process: out of make test-fast

REPO = Path(__file__).resolve().parents[2]

MODULE = """
import time

def test_slow():
    time.sleep(0.3)

def test_fast():
    pass
"""


def test_the_end_of_a_run_names_its_slowest_modules_its_wall_time_and_its_machine(tmp_path):
    """Under two pytest-xdist workers, as `make test` runs: the workers' reports reach the controller's hook."""
    (tmp_path / "test_generated.py").write_text(MODULE)
    other = tmp_path / "test_other.py"
    other.write_text("def test_nothing():\n    pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-n", "2",
         "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "slowest 2 modules (setup + call + teardown)" in out, out
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if "slowest 2 modules" in line)
    ranked, total, machine = lines[first + 1: first + 3], lines[first + 3], lines[first + 4]
    # which module ranks first is not fixed: a worker's first test also pays the project's autouse fixtures
    seconds = {line.split()[-1]: float(line.split()[0]) for line in ranked}
    assert set(seconds) == {"test_generated.py", "test_other.py"}, out
    assert list(seconds.values()) == sorted(seconds.values(), reverse=True), out
    assert seconds["test_generated.py"] >= 0.3, out
    summed = re.fullmatch(r"\s*([\d.]+) s  all 2 modules \(worker time\)", total)
    assert summed and float(summed.group(1)) == pytest.approx(sum(seconds.values()), abs=0.11), out
    wall = re.fullmatch(r"\s*([\d.]+) s  wall, on (.+), (\d+) CPUs, load average [\d.]+", machine)
    assert wall, out
    assert float(wall.group(1)) >= 0.3 and wall.group(2) == machine_kind() and int(wall.group(3)) >= 1, out
