"""Session-wide test set-up.

The launch scripts, the `stapo` CLI and Ray's own worker start-up call `ray`, `stapo` and `python`
by name, as they do for a user who activated the environment. CI runs `.venv/bin/python -m pytest`
without activating anything, so the interpreter's own bin directory goes first on PATH here, for
the tests and every process they start.
"""

import os
import sys
import time
from pathlib import Path

_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

import pytest  # noqa: E402

# setuptools before anything can import pip: on Python < 3.12 setuptools' distutils shim gives up for good
# once `pip` is imported in a process (it then serves the stdlib distutils), and a later `import setuptools`
# (torch.utils.cpp_extension does it when vLLM is imported in-process) fails its own assertion. Which tests
# share a pytest-xdist worker decides whether an earlier test imported pip; importing setuptools first, as
# here, makes the order irrelevant (reproduced: `import pip` then vLLM's layers fails, the other way round
# passes).
import setuptools  # noqa: E402,F401

# the trainer runs that several test modules share, each run once per session (tests/e2e/shared_runs.py),
# and how the suite splits over pytest-xdist workers (tests/parallel.py)
pytest_plugins = ["tests.e2e.shared_runs", "tests.parallel"]

# The CLI and the doctor set RAY_AUTH_MODE in their own process, as a user's driver needs. In the one
# pytest process that setting would outlive the test and make every later ray.init start a cluster
# that demands a token nobody holds, so each test gets these back.
_RAY_AUTH_KEYS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture(autouse=True)
def _ray_auth_settings_do_not_leak():
    before = {key: os.environ.get(key) for key in _RAY_AUTH_KEYS}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value



# A user's rule or loss file registers into process-wide registries (stapo.algorithm.masks's TOKEN_MASK_REGISTRY
# as custom:NAME, verl's POLICY_LOSS_REGISTRY), as the driver and each worker do once per run. In one pytest
# process those entries would outlive the module that made them (test_custom_rule, an in-process `stapo check`
# of a doc command) and reach the tests that iterate over every registered rule: each module gets the
# registries, and the imported user files, back as they were before it.
USER_FILES = "stapo_user_files."  # stapo.verl_plugin.training.custom_rule.MODULE_PREFIX, without importing verl here


@pytest.fixture(autouse=True, scope="module")
def _user_registrations_do_not_leak():
    from stapo.algorithm.masks import TOKEN_MASK_REGISTRY

    masks_before = set(TOKEN_MASK_REGISTRY)
    files_before = {name for name in sys.modules if name.startswith(USER_FILES)}
    core_algos = sys.modules.get("verl.trainer.ppo.core_algos")
    losses_before = set(core_algos.POLICY_LOSS_REGISTRY) if core_algos is not None else set()
    yield
    for name in set(TOKEN_MASK_REGISTRY) - masks_before:
        if name.startswith("custom:"):
            del TOKEN_MASK_REGISTRY[name]
    core_algos = sys.modules.get("verl.trainer.ppo.core_algos")
    if core_algos is not None:
        registry = core_algos.POLICY_LOSS_REGISTRY
        for name in set(registry) - losses_before:  # verl's and the plugin's own are registered at import: kept
            if not (getattr(registry[name], "__module__", "") or "").startswith(("verl.", "stapo.")):
                del registry[name]
    # the files themselves too: the loader imports a file once a process, so a later module's load registers again
    for name in [name for name in sys.modules if name.startswith(USER_FILES) and name not in files_before]:
        del sys.modules[name]


# The suite's slowest modules, printed at the end (issue 62): each module's setup, call and teardown time summed
# over its tests, so a trainer run a fixture starts counts for the module that started it. Under pytest-xdist the
# workers' reports reach the controller's hook too, so the sums are the whole run's worker time.
SLOWEST_MODULES = 15
_module_seconds: dict[str, float] = {}
_session_started = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _module_seconds:
        return
    ranked = sorted(_module_seconds.items(), key=lambda item: -item[1])
    terminalreporter.write_sep("=", f"slowest {min(SLOWEST_MODULES, len(ranked))} modules (setup + call + teardown)")
    for module, seconds in ranked[:SLOWEST_MODULES]:
        terminalreporter.write_line(f"{seconds:9.1f} s  {module}")
    terminalreporter.write_line(f"{sum(_module_seconds.values()):9.1f} s  all {len(ranked)} modules (worker time)")
    terminalreporter.write_line(machine_line(time.monotonic() - _session_started))


def machine_line(wall_s: float) -> str:
    """Where the figures above were taken: a timing without its machine compares with nothing (CI's machines
    differ in kind and speed, docs/testing.md). The model name is lscpu's, read from /proc/cpuinfo."""
    from stapo.machine_kind import machine_kind

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 0
    return f"{wall_s:9.1f} s  wall, on {machine_kind()}, {cpus} CPUs, load average {os.getloadavg()[0]:.1f}"
