"""Every trainer launch the suite makes is a row of the table in docs/testing.md (issue 62's guard).

A trainer launch (Ray started, verl's trainer built) costs a minute or more of the suite on 2 cores, most of it
before the first step (docs/testing.md, "Where a launch's time goes"). A check that needs the trainer should fold
into a run that already starts (tests/e2e/shared_runs.py): this test makes a new launch visible in review instead
of in CI's clock. It counts by construction, never by timing, so it cannot flake on a busy machine:

- the tests are read (``ast``) for every pytest entry point (a ``test_*`` function or a fixture) that reaches,
  directly or through the suite's helpers (``run_recipe``, ``launch``, ``smoke``, ``stapo_cli``...), something
  that can start the trainer: ``stapo.runs.process.run_recipe_process``, the entry functions of the `stapo`
  commands that run the recipe, or a process whose command names the recipe (``recipe.stapo.main_stapo``), verl's
  own ``main_ppo``, the `stapo` CLI or ``launch/ray/submit.sh``;
- each such entry point is a row of the table between the ``trainer-launches`` markers in docs/testing.md (with
  the launches it makes and the checks it carries), or, when its processes stop before Ray (a refused setting,
  ``--cfg job``, ``--help``, an export), a line of ``STARTS_NO_TRAINER`` below saying why.

Adding a launch: a row in docs/testing.md's table (``| `tests/x/test_y.py::name` | launches | ... |``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "testing.md"
TABLE = re.compile(r"<!-- trainer-launches -->\n(.*?)<!-- /trainer-launches -->", re.DOTALL)
ROW = re.compile(r"^\| `(?P<site>tests/[^`]+?::[\w:]+)` \| (?P<launches>\d+) \|")

# what can start verl's trainer, as the tests call it: (module, function)
ENTRY_FUNCTIONS = {
    ("stapo.runs.process", "run_recipe_process"),
    ("stapo.runs.process", "recipe_command"),
    ("stapo.runs.train", "run_trainer"),
    ("stapo.train_cli", "main"),
    ("stapo.demo.cli", "main"),
    ("stapo.sweep.cli", "main"),
    ("stapo.sweep.cli", "run_local"),
    ("stapo.sweep.cli", "run_all"),
    ("stapo.sweep.cli", "run_local_sweep"),
    ("stapo.sweep.ray_launcher", "submit"),
    ("stapo.sweep.ray_launcher", "run_ray_sweep"),
    ("stapo.doctor.cli", "main"),
    ("stapo.doctor.smoke", "run_smoke"),
    ("recipe.stapo.main_stapo", "run"),
    ("recipe.stapo.main_stapo", "main"),
    ("recipe.stapo.main_stapo", "hydra_main"),
}
# an argument list written out with one of these runs nothing (a plan, a comparison of finished runs, a help)
NOTHING_RUNS = {"--dry-run", "--compare-only", "--help", "-h", "--version", "--cfg"}
# `stapo` itself (stapo.cli.main in-process, ``-m stapo.cli`` as a process): only these commands run the recipe
CLI = ("stapo.cli", "main")
CLI_COMMANDS = {"train", "demo", "sweep", "doctor"}
# a process whose command (or the function that starts it) names one of these can run the trainer
COMMAND_MARKERS = ("recipe.stapo.main_stapo", "verl.trainer.main_ppo", "submit.sh")
PROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call"}

# entry points that start the recipe or a `stapo` command in a way that stops before Ray: why, in a few words
STARTS_NO_TRAINER = {
    "tests/bench/test_sweep_parts.py::test_a_baseline_unlike_the_group_by_names_is_refused_before_any_run":
        "stapo sweep refused before its first run",
    "tests/bench/test_sweep_parts.py::test_an_unknown_baseline_is_refused_before_any_run":
        "stapo sweep refused before its first run",
    "tests/bench/test_sweep_parts.py::test_ray_options_outside_their_range_are_refused_by_name": "refused options",
    "tests/bench/test_sweep_parts.py::test_stapo_plot_command": "stapo plot",
    "tests/data/test_prepare_custom.py::test_the_readme_command_writes_the_row_the_readme_shows": "stapo data prepare",
    "tests/demo/test_demo.py::test_demo_analysis_runs_on_real_weights": "stapo demo --analyze: rollouts in-process",
    "tests/demo/test_demo.py::test_demo_rejects_bad_settings_before_loading_anything": "refused settings",
    "tests/demo/test_demo.py::test_plot_command_refuses_a_folder_without_metrics": "stapo plot",
    "tests/e2e/test_compose.py::test_cfg_job_prints_the_composed_config": "--cfg job",
    "tests/e2e/test_install.py::test_the_installed_recipe_composes_from_the_installed_configs": "--cfg job",
    "tests/eval/test_own_test_file.py::test_the_readme_command_runs_as_written": "stapo data prepare, stapo eval",
    "tests/launch/test_cluster.py::test_preflight_passes_on_the_two_node_cluster": "stapo doctor: preflight tasks",
    "tests/launch/test_cluster.py::test_preflight_names_what_is_wrong": "stapo doctor: preflight tasks",
    "tests/launch/test_doctor_checks.py::test_unreachable_address_fails_fast": "stapo doctor: no cluster answers",
    "tests/launch/test_smoke_cluster.py::test_smoke_names_the_first_error_of_a_failing_job":
        "a Ray job whose driver refuses its setting before verl",
    "tests/launch/test_smoke_preset.py::test_smoke_refuses_when_no_job_api_answers": "no cluster answers",
    "tests/launch/test_smoke_preset.py::test_smoke_run_on_a_gpu": "GPU only: skipped without CUDA",
    "tests/launch/test_static.py::test_submit_refuses_a_wrong_working_dir": "submit.sh refuses before Ray",
    "tests/reliability/test_check.py::test_demo_refuses_a_missing_model_before_writing_anything": "refused setting",
    "tests/reliability/test_check.py::test_recipe_process_refuses_in_one_line_with_exit_2": "refused settings",
    "tests/reliability/test_check.py::test_stapo_debug_adds_the_traceback": "refused setting",
    "tests/reliability/test_config_rejections.py::test_recipe_process_exits_before_ray": "refused settings",
    "tests/reliability/test_front_door.py::test_stapo_train_is_a_command_and_refuses_before_starting_anything":
        "--help, refused settings",
    "tests/reliability/test_front_door.py::test_version_prints_the_package_and_verl_versions": "--version, --help",
    "tests/reliability/test_secrets.py::test_recipe_process_refuses_a_token_in_the_runtime_env_before_ray":
        "refused setting",
    "tests/reliability/test_secrets.py::test_a_literal_token_on_the_command_line_is_written_and_echoed_nowhere":
        "refused settings",
    "tests/reward/test_custom_reward.py::checked": "stapo data prepare, stapo check",
    "tests/reward/test_reward_check.py::test_stapo_check_runs_it_after_the_data_checks": "stapo check",
    "tests/reward/test_reward_cli.py::test_a_given_response_on_every_row": "stapo reward test",
    "tests/reward/test_reward_cli.py::test_a_reward_that_fails_is_the_checks_one_line": "stapo reward test",
    "tests/reward/test_reward_cli.py::test_bad_arguments": "stapo reward test, refused arguments",
    "tests/reward/test_reward_cli.py::test_the_calls_before_a_failure_are_shown": "stapo reward test",
    "tests/reward/test_reward_cli.py::test_the_readmes_command_prints_each_call": "stapo reward test",
    "tests/unit/test_cluster_shape.py::test_stapo_train_refuses_a_gpu_preset_on_a_machine_without_a_gpu":
        "refused setting, stapo check",
}


@dataclass
class Function:
    node: ast.FunctionDef | ast.AsyncFunctionDef
    entry: bool  # pytest calls it: a test or a fixture
    calls: set[tuple[str, str]] = field(default_factory=set)  # (module, name) it calls, resolved
    direct: bool = False  # starts the trainer (or may) itself


def _module_name(path: Path, repo: Path) -> str:
    return ".".join(path.relative_to(repo).with_suffix("").parts)


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _is_fixture(node) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")) == "fixture":
            return True
    return False


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _launching_argv(call: ast.Call, cli: bool, function: ast.AST) -> bool:
    """Whether an entry function called with this argument list can start the trainer. An argument list written out
    (in the call, or assigned to the name the call passes) does, unless it asks for nothing to run (``NOTHING_RUNS``)
    or, for ``stapo.cli.main``, names a command other than those that run the recipe (``CLI_COMMANDS``); one not
    written out (a parameter, a comprehension) may."""
    argv = call.args[0] if call.args else None
    if isinstance(argv, ast.Name):
        values = [n.value for n in ast.walk(function) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == argv.id for t in n.targets)]
        return not values or any(_launching_list(value, cli) for value in values)
    return _launching_list(argv, cli)


def _launching_list(argv: ast.AST | None, cli: bool) -> bool:
    if not isinstance(argv, (ast.List, ast.Tuple)) or not argv.elts:
        return True
    written = {elt.value for elt in argv.elts if isinstance(elt, ast.Constant)}
    if written & NOTHING_RUNS:
        return False
    first = argv.elts[0]
    return not cli or not isinstance(first, ast.Constant) or first.value in CLI_COMMANDS


def _function(node, module: str, imported: dict, constants: dict) -> Function:
    """One top-level function: what it calls (resolved through the module's imports) and whether it starts, itself,
    something that can run the trainer."""
    local = {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} - {node.name}
    strings = _strings(node) + [s for n in ast.walk(node) if isinstance(n, ast.Name) for s in constants.get(n.id, [])]
    # a `stapo` process: one of the commands that run the recipe is named, or the command is passed in (a helper)
    cli_process = any("stapo.cli" in s for s in strings) and (
        bool(CLI_COMMANDS & set(strings)) or any(isinstance(n, ast.Starred) for n in ast.walk(node)))
    recipe_process = any(marker in s for s in strings for marker in COMMAND_MARKERS)
    function = Function(node, node.name.startswith("test") or _is_fixture(node))
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        name = _called_name(call)
        if name is None or name in local:
            continue
        target = None
        if isinstance(call.func, ast.Name):
            target = imported.get(name, (module, name))
        elif isinstance(call.func.value, ast.Name) and call.func.value.id in imported:  # a module imported by name
            target = (".".join(imported[call.func.value.id]), name)
        if target is not None:
            function.calls.add(target)
            if (target in ENTRY_FUNCTIONS or target == CLI) and _launching_argv(call, target == CLI, node):
                function.direct = True
        if name in PROCESS_CALLS and (recipe_process or cli_process):
            function.direct = True
    return function


def scan(repo: Path = REPO) -> dict[str, Function]:
    """Every function of the tests' modules (``path::name``), with what it calls and whether it starts a process
    that can run the trainer."""
    functions: dict[str, Function] = {}
    by_name: dict[tuple[str, str], str] = {}
    for path in sorted((repo / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module, rel = _module_name(path, repo), path.relative_to(repo).as_posix()
        imported: dict[str, tuple[str, str]] = {}
        constants: dict[str, list[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    imported[alias.asname or alias.name] = (node.module, alias.name)
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = _strings(node.value)
        defs = [("", n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        defs += [(f"{c.name}::", n) for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]  # a test class's methods
        for prefix, node in defs:
            key = f"{rel}::{prefix}{node.name}"
            functions[key] = _function(node, module, imported, constants)
            if not prefix:
                by_name[(module, node.name)] = key
    # a helper that reaches a start reaches it for whoever calls it (to a fixed point)
    reaches = {key for key, f in functions.items() if f.direct}
    changed = True
    while changed:
        changed = False
        for key, function in functions.items():
            if key not in reaches and any(by_name.get(target) in reaches for target in function.calls):
                reaches.add(key)
                changed = True
    for key in reaches:
        functions[key].direct = True
    return functions


def launch_sites(functions: dict[str, Function] | None = None) -> set[str]:
    """The pytest entry points (tests and fixtures) that start, or may start, the trainer."""
    functions = scan() if functions is None else functions
    return {key for key, function in functions.items() if function.entry and function.direct}


def documented_launches(text: str | None = None) -> dict[str, int]:
    """The table of docs/testing.md: entry point -> trainer launches it makes."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    match = TABLE.search(text)
    assert match, f"{DOC.relative_to(REPO)} has no table between <!-- trainer-launches --> markers"
    rows = {}
    for line in match.group(1).splitlines():
        if row := ROW.match(line):
            assert row["site"] not in rows, f"{row['site']} is listed twice"
            rows[row["site"]] = int(row["launches"])
    return rows


def test_every_trainer_launch_of_the_suite_is_a_row_of_the_table_in_docs_testing():
    sites, rows = launch_sites(), documented_launches()
    unlisted = sorted(sites - set(rows) - set(STARTS_NO_TRAINER))
    assert not unlisted, (
        "these tests or fixtures start the trainer (or a process that may) and are not in docs/testing.md's table of "
        "trainer launches: fold the check into a run that already starts (tests/e2e/shared_runs.py), or add a row "
        "with its launches and checks (or, if it stops before Ray, a line in STARTS_NO_TRAINER of "
        "tests/unit/test_trainer_launches.py):\n" + "\n".join(unlisted))
    stale = sorted((set(rows) | set(STARTS_NO_TRAINER)) - sites)
    assert not stale, "listed, but no such test or fixture starts a process of the trainer any more:\n" + "\n".join(
        stale)
    both = sorted(set(rows) & set(STARTS_NO_TRAINER))
    assert not both, f"in the table and in STARTS_NO_TRAINER: {both}"
    assert all(count > 0 for count in rows.values()), rows


def test_the_table_states_the_total_it_lists():
    """The sentence under the table gives the sum of its rows, so a new row changes a number a reviewer reads."""
    text = DOC.read_text(encoding="utf-8")
    total = sum(documented_launches(text).values())
    stated = re.search(r"<!-- /trainer-launches -->\s*\n\s*In all: (\d+) trainer launches", text)
    assert stated, "docs/testing.md: the line after the table must start 'In all: N trainer launches'"
    assert int(stated.group(1)) == total, f"the table's rows add up to {total}, the text says {stated.group(1)}"


SAMPLE = '''
import subprocess, sys
from tests.e2e.cpu_runs import run_recipe
from stapo.cli import main as stapo_main
from stapo.demo import cli as demo_cli
ENTRY = "from stapo.cli import main"

def helper(*args):
    return subprocess.run([sys.executable, "-m", "stapo.cli", *args])

def test_through_a_helper():
    helper("train")

def test_direct(tmp_path):
    run_recipe(["algo=grpo"], tmp_path)

def test_in_process():
    assert stapo_main(["train", "x=1"]) == 2

def test_a_module_imported_by_name():
    demo_cli.main(["--steps", "1"])

def test_entry_constant():
    subprocess.Popen([sys.executable, "-c", ENTRY, "sweep"])

def test_nothing():
    subprocess.run(["ls"])

def test_a_nested_name_is_not_the_helper():
    def run_recipe(x):
        return x
    run_recipe(1)

def test_a_refusal_in_process():
    assert stapo_main(["train", "--help"]) == 0 and stapo_main(["check", "x=1"]) == 2

class TestInAClass:
    def test_method(self):
        helper("demo", "--steps", "1")
'''


def test_the_scan_finds_launches_through_helpers_constants_and_in_process_entries(tmp_path):
    """The scan itself, on a module written here (a helper module imported by name is resolved as in tests/)."""
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "e2e" / "cpu_runs.py").write_text(
        "from stapo.runs.process import run_recipe_process\n\n"
        "def run_recipe(o, d):\n    return run_recipe_process(o)\n")
    (tmp_path / "tests" / "test_sample.py").write_text(SAMPLE)
    sites = launch_sites(scan(tmp_path))
    assert sites == {f"tests/test_sample.py::{name}" for name in
                     ("test_through_a_helper", "test_direct", "test_in_process", "test_entry_constant",
                      "TestInAClass::test_method", "test_a_module_imported_by_name")}


def test_the_table_is_read_row_by_row():
    text = ("x\n<!-- trainer-launches -->\n| Entry point | Launches |\n|---|---|\n"
            "| `tests/a.py::f` | 2 | grpo | checks |\n| `tests/b.py::g` | 1 | | |\n<!-- /trainer-launches -->\n")
    assert documented_launches(text) == {"tests/a.py::f": 2, "tests/b.py::g": 1}
