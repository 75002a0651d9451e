"""``make test-image-versions`` runs the test modules that reach transformers, and misses none (issue 62).

The step runs only the modules tests/image_modules.txt marks ``run`` (the Makefile reads the file). Leaving a
module out is safe only while its line is true, so this guard fails, by construction and without timing, when:
- a module of the pool (any test module under tests/unit, the modules the file names) has no line: a new module
  must be traced (``.venv/bin/python -m tests.image_modules MODULE`` writes its line);
- a ``skip`` module reaches, statically, a name it did not reach when the tracer cleared it (a model built, a
  config composed, a verl path, a project helper that comes to import verl or transformers): traced again;
- a project module whose import calls transformers, imported by a ``skip`` module, is imported by no ``run`` one;
- a module named by hand (``PINNED``) is not ``run``, or the Makefile's command runs other modules than the
  ``run`` lines.
The static reading and the trace are checked here on small made-up cases; tests/image_modules.py says how both
work and why.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.image_modules import (
    LIST,
    MARKS,
    PINNED,
    REPO,
    TRACE_VAR,
    Line,
    Reach,
    facts_of_source,
    format_list,
    parse_list,
    pool,
    read_list,
    uncovered,
    write_hook,
)

RETRACE = "run `.venv/bin/python -m tests.image_modules {}` (needs `make .venv-image/.installed`) and commit its line"


@pytest.fixture(scope="module")
def reach() -> Reach:
    return Reach()


def test_every_module_of_the_pool_has_one_line_and_every_line_a_module():
    lines = read_list()
    missing = [m for m in pool(lines) if m not in lines]
    assert not missing, f"no line in {LIST.name} for {missing}: " + RETRACE.format(" ".join(missing))
    assert [m for m in lines if not (REPO / m).is_file()] == [], "lines for modules that no longer exist"
    assert {m for m, line in lines.items() if line.action == "run"} >= set(PINNED)
    assert all(line.why for line in lines.values()), "a line without its reason"


def test_a_skipped_module_reaches_nothing_it_did_not_reach_when_traced(reach):
    grown = {m: sorted(reach.names(m) - line.names) for m, line in read_list().items() if line.action == "skip"}
    grown = {m: names for m, names in grown.items() if names}
    assert not grown, f"skipped modules reach new names {grown}: " + RETRACE.format(" ".join(grown))


def test_the_image_step_runs_exactly_the_run_lines():
    """The Makefile's command itself (``make -n``), not a copy of its variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMAGE_", "MAKE"))}
    printed = subprocess.run(["make", "-n", "--no-print-directory", "test-image-versions"], cwd=REPO, env=env,
                             capture_output=True, text=True, check=True, timeout=60).stdout
    (command,) = [line for line in printed.splitlines() if f'-m "{MARKS}"' in line]
    words = shlex.split(command)
    assert words[words.index("pytest") - 1:words.index("pytest") + 3] == ["-m", "pytest", "-q", "-n"], command
    modules = [word for word in words if word.endswith(".py")]
    assert modules == [m for m, line in read_list().items() if line.action == "run"]


def test_what_a_skipped_module_imports_that_calls_transformers_a_run_module_imports(reach):
    """A project module whose import calls transformers (a class derived from one of its classes) is left to the
    run modules that import it; a skipped module whose only importer it would be runs instead."""
    lines = read_list()
    assert uncovered(lines, reach) == {}
    made_up = Line("skip", "tests/unit/test_made_up.py", frozenset(), "no", frozenset({"stapo/models/tiny.py"}))
    assert uncovered({"tests/unit/test_made_up.py": made_up}, reach) == {"tests/unit/test_made_up.py":
                                                                         {"stapo/models/tiny.py"}}


def test_the_list_file_reads_back_what_it_was_written_from():
    lines = {"tests/unit/test_a.py": Line("run", "tests/unit/test_a.py", frozenset(), "test_x: calls f # g"),
             "tests/unit/test_b.py": Line("skip", "tests/unit/test_b.py", frozenset({"verl.x.y", "fixture:z"}), "no",
                                          frozenset({"stapo/a.py", "stapo/b.py"}))}
    assert parse_list(format_list(lines)) == lines
    with pytest.raises(ValueError, match="a second line for tests/unit/test_a.py"):
        parse_list("run tests/unit/test_a.py # one\nskip tests/unit/test_a.py # two\n")
    for wrong in ("keep tests/unit/test_a.py # why", "run # why", "skip tests/unit/test_a.py verl.x # why",
                  "skip tests/unit/test_a.py names=a names=b # why", "skip tests/unit/test_a.py other=a # why"):
        with pytest.raises(ValueError, match="not `run"):
            parse_list(wrong)


@pytest.mark.parametrize("source, expected", [
    ("from stapo.algorithm.masks import build_token_mask\nimport torch\n", set()),
    ("def test_x():\n    from stapo.models.tiny import build_tiny_model\n", {"stapo.models.tiny.build_tiny_model"}),
    ("from transformers import AutoConfig\n", {"transformers.AutoConfig"}),
    ("import peft\n", {"peft"}),  # a package nobody vouched for reaches transformers
    ("from stapo.check import compose_run\n", {"stapo.check.compose_run"}),
    ("from tests.unit.test_masks import CASES\n", set()),  # a pure test module's helpers
    ("CMD = [sys.executable, '-m', 'recipe.stapo.main_stapo']\n", {"recipe.stapo.main_stapo"}),
    ("ARGV = ['stapo', 'check', 'algo=grpo']\nALGOS = ('stapo', 'grpo')\n", {"stapo.cli.main"}),
    ("def test_x(stapo_run):\n    pass\n", {"fixture:stapo_run"}),
    ("CODE = 'import transformers; print(1)'\n", {"code:transformers"}),
    ("import importlib\nNAME = 'x'\nimportlib.import_module(NAME)\n", {"dynamic-import"}),
    ("import importlib\nimportlib.import_module('verl.utils.config')\n", {"verl.utils.config"}),
])
def test_the_static_reach_of_a_module(reach, source, expected):
    """What a test module would reach, for a made-up module in tests/unit."""
    assert reach.names_of(facts_of_source(source, "tests.unit"), "tests.unit.test_made_up") == expected


def test_a_pure_project_module_that_starts_importing_verl_reaches_its_importers(reach):
    """The project's reach is transitive: the masks module is pure today, so its tests reach nothing."""
    assert "stapo.algorithm.masks" not in reach.reaching
    assert "stapo.verl_plugin.training.losses" in reach.reaching
    assert reach.names("tests/unit/test_masks.py") == frozenset()


# the tracer stops tracing at its first run-time call: sys.gettrace() says whether one was counted so far
HOOKED = """\
import importlib.metadata
import importlib.util
import sys
import transformers                                  # transformers' own module bodies: an import
from transformers import PretrainedConfig            # the lazy module's attribute lookup: an import
import fake_library                                  # a library's body that builds a config: its import
importlib.metadata.version("torch")                  # another package's version
# a project module whose body subclasses transformers' DynamicLayer: an import, recorded as the project's
spec = importlib.util.spec_from_file_location("sampling", {sampling!r})
spec.loader.exec_module(sys.modules.setdefault("sampling", importlib.util.module_from_spec(spec)))
assert sys.gettrace() is not None, "counted before the first run-time call"
PretrainedConfig()                                   # the first call at run time
assert sys.gettrace() is None, "the run-time call not counted"
"""
FAKE_LIBRARY = "from transformers import PretrainedConfig\nCONFIG = PretrainedConfig()\n"


def traced(tmp_path: Path, code: str) -> list[dict]:
    """Runs ``code`` in a Python process with the tracer's sitecustomize, as tests.image_modules runs pytest."""
    write_hook(tmp_path)
    (tmp_path / "fake_library.py").write_text(FAKE_LIBRARY)
    out = tmp_path / "trace.jsonl"
    env = dict(os.environ, PYTHONPATH=str(tmp_path), **{TRACE_VAR: str(out)})
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_the_tracer_counts_the_first_run_time_call_and_no_import(tmp_path):
    imported, hit = traced(tmp_path, HOOKED.format(sampling=str(REPO / "stapo/verl_plugin/cpu/sampling.py")))
    assert imported == {"import": "stapo/verl_plugin/cpu/sampling.py"}
    assert hit["called"].startswith("transformers/configuration_utils.py:PreTrainedConfig."), hit


def test_the_tracer_counts_a_version_read_in_a_child_process(tmp_path):
    """verl's version checks read transformers' metadata without calling its code; a child of the traced process
    is traced too (the sitecustomize on the inherited PYTHONPATH)."""
    child = "import importlib.metadata as m; m.version('transformers')"
    (hit,) = traced(tmp_path, f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}], check=True)")
    assert hit["called"] == "importlib/metadata/__init__.py:version" and hit["pid"] != os.getpid(), hit
