"""Which test modules ``make test-image-versions`` runs under the GPU image's transformers (issue 62).

Why: that step runs fast tests a second time with the image's transformers first on the path (Makefile,
requirements/image-versions.txt). A test that never reaches transformers at run time does the same work under
either version, so its second run checks nothing new; the step keeps the modules whose tests do reach it.

What: tests/image_modules.txt has one line for every module of the step's pool (every test module under
``tests/unit``, and each module outside it that the file names), ``run`` or ``skip``, with the reason after ``#``.
The Makefile runs the ``run`` lines (``IMAGE_FAST_TESTS``).

How it is measured: ``.venv/bin/python -m tests.image_modules [MODULE...]`` (no module: the whole pool) runs each
module's fast tests (the step's ``-m``) in a pytest process of its own, under the image's transformers
(``.venv-image``: ``make .venv-image/.installed``), with a trace function (``sys.settrace``, and
``threading.settrace`` for later threads) installed at start-up in that process and in every Python process it
starts (a ``sitecustomize`` first on ``PYTHONPATH``). A call counts when it enters a function of transformers'
package, or reads transformers' version through ``importlib.metadata`` (verl's version checks), at run time:
not inside a library's module body (a library's import runs the same for every module that imports it, and the
kept modules import verl and transformers too) and not in transformers' lazy-import machinery (a
``from transformers import X`` line). The first such call ends that module's run and makes its line ``run``;
a module whose fast tests all pass without one gets ``skip``, and one whose run fails under the tracer ``run``.
``PINNED`` modules run whatever the tracer sees. The script rewrites the lines of the modules it traced.

Why it cannot silently miss a module (tests/unit/test_image_modules.py checks both):
- every module of the pool has a line, so a new module fails the guard until it is traced (or added by hand);
- a ``skip`` line keeps the names the module reached statically when it was traced (``names=``): what it
  imports, at any depth of the file, from a package that can call transformers (anything but the standard
  library and ``QUIET``), or from a project module that imports one directly or through other project
  modules; the project modules it names as strings (a ``-m`` process, a plugin); the `stapo` command; the
  fixtures it names from such a module. A skipped module that comes to reach a name not on its line (a model
  built, a config composed, a verl path added, a pure helper that starts importing verl) fails the guard until
  it is traced again.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIST = REPO / "tests" / "image_modules.txt"
POOL_DIRS = ("tests/unit",)
PROJECT = ("stapo", "recipe", "tests", "benchmarks")
OVERLAY = REPO / ".venv-image"
MARKS = "not e2e and not slow"  # the step's fast tests (Makefile, test-image-versions)
TRACE_VAR = "STAPO_TRANSFORMERS_TRACE"
TRACED_VAR = "STAPO_TRACED_MODULE"
TRACE_TIMEOUT_S = 1800

# third-party packages that do not import transformers: names imported from them reach nothing. Any other
# package (transformers, verl, vLLM, datasets, one added later) counts as reaching transformers.
QUIET = frozenset({
    "torch", "numpy", "omegaconf", "hydra", "yaml", "pandas", "pyarrow", "packaging", "pytest", "xdist",
    "psutil", "setuptools", "tensordict", "matplotlib", "math_verify", "tokenizers", "huggingface_hub", "ray",
})
# modules the step runs whatever the tracer sees, and why
PINNED = {
    "tests/unit/test_image_versions.py": "checks that the overlay's transformers is the one imported (reads "
    "its version, calls nothing) and skips without the overlay",
    # the four the step named before it was traced
    "tests/integration/test_padding_free_parity.py": "named by the step before: verl's forward on both paths",
    "tests/integration/test_verl_loss_path.py": "named by the step before: the loss through verl's engine",
    "tests/integration/test_agg_modes.py": "named by the step before: the loss aggregation modes through verl",
    "tests/e2e/test_compose.py": "named by the step before: the recipe's composition",
}
# a ``from transformers import X``: the lazy module's attribute lookup imports X's module, runs nothing of X
LAZY_FILE = os.path.join("transformers", "utils", "import_utils.py")
LAZY_FUNCTIONS = frozenset({"__getattr__", "_get_module", "__dir__"})
METADATA_READS = frozenset({"version", "distribution", "metadata", "requires", "files", "from_name"})
NO_CALL = "its fast tests pass without a call into transformers"
TRANSFORMERS_CODE = re.compile(r"\b(?:import|from)\s+transformers\b")


# ---------------------------------------------------------------------------------------------- the list file

@dataclass(frozen=True)
class Line:
    action: str  # "run" or "skip"
    module: str  # a path from the repository root
    names: frozenset[str]  # skip: the names the module reached statically when it was traced
    why: str
    imports: frozenset[str] = frozenset()  # skip: the project modules whose import called transformers


HEADER = """\
# The test modules `make test-image-versions` runs under the GPU image's transformers (Makefile, IMAGE_FAST_TESTS):
# one line for every module of its pool (tests/unit, and the modules outside it named here), written by
# `.venv/bin/python -m tests.image_modules [MODULE...]` (tests/image_modules.py says how it traces and why).
#   run   MODULE  # the first call into transformers the tracer saw: test, function called, its caller
#   skip  MODULE  [names=A,B] [imports=C]  # no call; names= the names it reached statically when traced;
#         imports= the project modules whose import called transformers (each imported by a run module)
# A new module, or a skipped one that comes to reach a new name, fails tests/unit/test_image_modules.py until
# traced again.
"""


FIELDS = {"names", "imports"}


def parse_list(text: str) -> dict[str, Line]:
    lines: dict[str, Line] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        data, _, why = raw.partition("#")
        fields = data.split()
        if not fields:
            continue
        lists = dict(f.split("=", 1) for f in fields[2:] if "=" in f)
        if len(fields) < 2 or fields[0] not in ("run", "skip") or len(lists) != len(fields) - 2 or set(lists) - FIELDS:
            raise ValueError(f"{LIST.name}:{number}: not `run|skip MODULE [names=A,B] [imports=C]  # why`: {raw}")
        action, module = fields[:2]
        if module in lines:
            raise ValueError(f"{LIST.name}:{number}: a second line for {module}")
        names, imports = (frozenset(filter(None, lists.get(field, "").split(","))) for field in ("names", "imports"))
        lines[module] = Line(action, module, names, why.strip(), imports)
    return lines


def format_list(lines: dict[str, Line]) -> str:
    width = max(len(m) for m in lines)
    body = []
    for module in sorted(lines, key=pool_order):
        line = lines[module]
        lists = "".join(f"  {field}={','.join(sorted(values))}"
                        for field, values in (("names", line.names), ("imports", line.imports)) if values)
        body.append(f"{line.action:<4}  {module:<{width}}{lists}  # {line.why}")
    return HEADER + "\n".join(body) + "\n"


def pool_order(module: str) -> tuple[bool, str]:
    return (not module.startswith(POOL_DIRS), module)


def read_list() -> dict[str, Line]:
    return parse_list(LIST.read_text(encoding="utf-8"))


def pool(lines: dict[str, Line]) -> list[str]:
    """Every test module under POOL_DIRS, the modules the list names elsewhere, and PINNED."""
    found = {p.relative_to(REPO).as_posix() for d in POOL_DIRS for p in (REPO / d).rglob("test_*.py")}
    return sorted(found | set(lines) | set(PINNED), key=pool_order)


# ------------------------------------------------------------------------------------------- static reach

@dataclass
class Facts:
    """What one source file names: imports (dotted, at any depth), string constants, argument names, fixtures."""

    imports: set[str]
    strings: set[str]
    arguments: set[str]
    fixtures: set[str]
    dynamic: bool  # imports a module whose name it computes


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> dict[str, Path]:
    return {module_name(p): p for root in PROJECT for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts}


def facts_of(path: Path) -> Facts:
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    return facts_of_source(path.read_text(encoding="utf-8"), package)


def facts_of_source(source: str, package: str) -> Facts:
    """``package``: the package the source's relative imports start from."""
    tree = ast.parse(source)
    facts = Facts(set(), set(), set(), set(), False)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            facts.imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            source = ".".join(filter(None, [base, node.module]))
            facts.imports.update(f"{source}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            facts.strings.add(node.value)
            words = node.value.split()[:2]
            if len(words) == 2 and words[0] == "stapo" and words[1] in cli_commands():
                facts.imports.add("stapo.cli.main")  # a shell command line of `stapo`
        elif isinstance(node, ast.arg):
            facts.arguments.add(node.arg)
        elif isinstance(node, (ast.List, ast.Tuple)) and stapo_command(node):
            facts.imports.add("stapo.cli.main")  # the `stapo` console script (pyproject.toml) as a process
        elif isinstance(node, ast.Call):
            dynamic_import(node, facts)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(is_fixture, node.decorator_list)):
            facts.fixtures.add(node.name)
    return facts


def stapo_command(node: ast.List | ast.Tuple) -> bool:
    """``["stapo", "check", ...]``: an argument list of the `stapo` command (a first word and one of its commands)."""
    words = [e.value for e in node.elts[:2] if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return len(words) == 2 and words[0] == "stapo" and words[1] in cli_commands()


@functools.cache
def cli_commands() -> frozenset[str]:
    """The keys of ``stapo.cli.COMMANDS``, read from the source (importing stapo.cli here would import more)."""
    for node in ast.walk(ast.parse((REPO / "stapo" / "cli.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "COMMANDS":
            return frozenset(key.value for key in node.value.keys)
    raise AssertionError("stapo/cli.py has no COMMANDS")


def dynamic_import(node: ast.Call, facts: Facts) -> None:
    """``importlib.import_module(X)``, ``__import__(X)``, ``pytest.importorskip(X)``: X is an import."""
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    if name not in ("import_module", "__import__", "importorskip") or not node.args:
        return
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        facts.imports.add(first.value)
    else:
        facts.dynamic = True


def is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "fixture") or getattr(target, "id", "") == "fixture"


class Reach:
    """The static reach of the project's modules: which names can lead to transformers."""

    def __init__(self) -> None:
        self.files = project_files()
        self.facts = {name: facts_of(path) for name, path in self.files.items()}
        self.reaching = self._reaching_modules()

    def project_module(self, dotted: str) -> str | None:
        """The project module a dotted name lives in (its longest prefix that is a module), or None."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in self.files:
                return ".".join(parts[:end])
        return None

    def _edges(self, facts: Facts) -> tuple[bool, set[str]]:
        """(whether the file reaches transformers by itself, the project modules it leads to)."""
        direct = facts.dynamic or any(TRANSFORMERS_CODE.search(s) for s in facts.strings)
        edges = set()
        for dotted in facts.imports | {s for s in facts.strings if s in self.files}:
            root = dotted.split(".")[0]
            if root in PROJECT:
                edges.add(self.project_module(dotted))
            elif root not in QUIET and root not in sys.stdlib_module_names and root != "__future__":
                direct = True
        edges.discard(None)
        return direct, edges

    def _reaching_modules(self) -> set[str]:
        """The project modules that import a reaching package, directly or through other project modules."""
        self.edges: dict[str, set[str]] = {}
        reaching = set()
        for name, facts in self.facts.items():
            direct, self.edges[name] = self._edges(facts)
            if direct:
                reaching.add(name)
        changed = True
        while changed:
            grown = {name for name, targets in self.edges.items() if targets & reaching}
            changed = not grown <= reaching
            reaching |= grown
        return reaching

    def closure(self, module: str) -> set[str]:
        """The project modules ``module`` imports, directly or through others, itself included."""
        seen, todo = set(), [module]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.edges.get(name, ()))
        return seen

    def reaches(self, dotted: str) -> bool:
        root = dotted.split(".")[0]
        if root in PROJECT:
            return self.project_module(dotted) in self.reaching
        return root not in QUIET and root not in sys.stdlib_module_names and root != "__future__"

    def fixtures_for(self, module: str) -> set[str]:
        """The fixtures a test module can name without importing them: its conftests' and the plugins'."""
        parts = module.split(".")
        sources = {".".join(parts[:end] + ["conftest"]) for end in range(1, len(parts))}
        sources |= {s for s in self.facts.get("tests.conftest", Facts(set(), set(), set(), set(), False)).strings
                    if s in self.files}
        return {f for s in sources if s in self.reaching for f in self.facts[s].fixtures}

    def names(self, path: str) -> frozenset[str]:
        """The names a test module (a path from the repository root) reaches that can lead to transformers."""
        module = module_name(REPO / path)
        return self.names_of(self.facts[module] if module in self.facts else facts_of(REPO / path), module)

    def names_of(self, facts: Facts, module: str) -> frozenset[str]:
        names = {d for d in facts.imports if self.reaches(d)}
        names |= {s for s in facts.strings if s in self.files and s in self.reaching}
        names |= {f"fixture:{f}" for f in self.fixtures_for(module) & (facts.arguments | facts.strings)}
        if any(TRANSFORMERS_CODE.search(s) for s in facts.strings):
            names.add("code:transformers")
        if facts.dynamic:
            names.add("dynamic-import")
        return frozenset(names)


# --------------------------------------------------------------------------------- the trace, in each process

def install_hook() -> None:
    """Record in the file ``$STAPO_TRANSFORMERS_TRACE`` this process's first run-time call into transformers (then
    stop tracing), and each project module whose body calls transformers when imported (once a module).

    Called by the ``sitecustomize`` that ``trace_module`` puts first on ``PYTHONPATH``, in every traced process.
    """
    out = os.environ.get(TRACE_VAR)
    if not out:
        return
    import importlib.util
    import threading

    folders = [os.path.join(entry, "transformers") for entry in sys.path]
    package = tuple(folder + os.sep for folder in folders if os.path.isdir(folder))
    metadata = importlib.util.find_spec("importlib.metadata").origin
    watched = package + (metadata,)
    where_ = Where(package, metadata, tuple(str(REPO / root) + os.sep for root in PROJECT), os.environ.get(TRACED_VAR))
    done: list[dict] = []
    imported: set[str] = set()

    def trace(frame, event, arg):
        if done or not frame.f_code.co_filename.startswith(watched):
            return None
        hit = where_.classify(frame)
        if hit is None or done or hit.get("import") in imported:
            return None
        if "import" in hit:
            imported.add(hit["import"])
        else:
            done.append(hit)
            sys.settrace(None)
            threading.settrace(None)
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (json.dumps(hit) + "\n").encode())
        os.close(fd)
        return None

    sys.settrace(trace)
    threading.settrace(trace)


@dataclass(frozen=True)
class Where:
    """Where a call into transformers happens: the folders and files that decide it."""

    package: tuple[str, ...]  # transformers' package folders (the overlay's, .venv's)
    metadata: str  # importlib.metadata's file
    project: tuple[str, ...]  # the project's folders
    traced: str | None  # the traced test module's file: its own body runs its tests' code

    def classify(self, frame) -> dict | None:
        """A run-time call (``called``...), a project module's import (``import``), or None (see the docstring)."""
        outer = self.outermost(frame)
        if outer is None:
            return None
        body = self.innermost_body(outer.f_back)
        if body is not None and body.f_code.co_filename != self.traced:
            path = body.f_code.co_filename
            return {"import": where(body).rpartition(":")[0]} if path.startswith(self.project) else None
        origin = outer.f_back
        while origin is not None and not origin.f_code.co_filename.startswith(self.project):
            origin = origin.f_back
        test = os.environ.get("PYTEST_CURRENT_TEST", "collection").split("::", 1)[-1]
        return {"test": test, "called": where(outer), "caller": where(outer.f_back), "origin": where(origin),
                "pid": os.getpid()}

    def outermost(self, frame):
        """The outermost frame of transformers' in this chain of calls (a version read: the read), or None when
        the chain is transformers' own import or lazy lookup, or a read of another package's metadata."""
        code = frame.f_code
        if code.co_filename == self.metadata:
            read = code.co_name in METADATA_READS and "transformers" in strings_in(frame.f_locals)
            return frame if read else None
        outer = frame
        while outer.f_back is not None and outer.f_back.f_code.co_filename.startswith(self.package):
            outer = outer.f_back
        name = outer.f_code.co_name
        if name == "<module>" or (name in LAZY_FUNCTIONS and outer.f_code.co_filename.endswith(LAZY_FILE)):
            return None
        return outer

    @staticmethod
    def innermost_body(frame):
        """The innermost module body on the stack, ``__main__``'s aside (pytest's, ``python -c``'s), or None."""
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
                return frame
            frame = frame.f_back
        return None


def strings_in(values: dict) -> set[str]:
    return {v for v in values.values() if isinstance(v, str)}


def where(frame) -> str:
    """``path:qualname``, the path from the repository, a site-packages or the standard library."""
    if frame is None:
        return "-"
    path = frame.f_code.co_filename
    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    for marker in (str(REPO) + os.sep, "site-packages" + os.sep, OVERLAY.name + os.sep, stdlib):
        path = path.rpartition(marker)[2] if marker in path else path
    return f"{path}:{frame.f_code.co_qualname}"


# ------------------------------------------------------------------------------------------- the trace runs

SITECUSTOMIZE = """\
import importlib.util
import sys
spec = importlib.util.spec_from_file_location("_stapo_image_trace", {path!r})
module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.install_hook()
"""


def write_hook(folder: Path) -> None:
    """A ``sitecustomize`` in ``folder`` that installs ``install_hook`` in every process with it on PYTHONPATH."""
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(path=str(Path(__file__).resolve())))


def trace_module(module: str, hook_dir: str, work: Path) -> tuple[list[dict], int, str]:
    """(what the tracer recorded, pytest's exit code, its output's tail)."""
    out = work / (module.replace("/", "_") + ".jsonl")
    log = work / (module.replace("/", "_") + ".log")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([hook_dir, str(OVERLAY)]), STAPO_IMAGE_VERSIONS=str(OVERLAY),
               **{TRACE_VAR: str(out), TRACED_VAR: str(REPO / module)})
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", MARKS, module]
    with log.open("w") as sink:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        code = wait_for_call(proc, out)
    return records(out), code, log.read_text()[-3000:]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def wait_for_call(proc: subprocess.Popen, out: Path) -> int:
    """Waits for pytest; on the first run-time call, interrupts its process group (pytest tears down on SIGINT)."""
    deadline = time.monotonic() + TRACE_TIMEOUT_S
    while proc.poll() is None:
        if any("called" in r for r in records(out)) or time.monotonic() > deadline:
            stop_group(proc)
            break
        time.sleep(0.5)
    return proc.wait()


def stop_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGINT, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def line_for(module: str, found: list[dict], code: int, reach: Reach) -> Line:
    calls = [r for r in found if "called" in r]
    imports = frozenset(r["import"] for r in found if "import" in r)
    if calls:
        hit = calls[0]
        why = f"{hit['test']}: {hit['called']}, called from {hit['caller']}"
        if hit["origin"] not in (hit["caller"], "-"):
            why += f" (reached from {hit['origin']})"
        return Line("run", module, frozenset(), why)
    if module in PINNED:
        return Line("run", module, frozenset(), f"kept by hand: {PINNED[module]}; the tracer saw no call")
    if code not in (0, 5):
        return Line("run", module, frozenset(), f"the traced run failed (pytest exit {code}): kept")
    why = f"no fast test (-m '{MARKS}' selects none)" if code == 5 else NO_CALL
    if imports:
        why += "; the modules on imports= call it when imported, and run modules import them too"
    return Line("skip", module, reach.names(module), why, imports)


def uncovered(lines: dict[str, Line], reach: Reach) -> dict[str, set[str]]:
    """For each skipped module, the modules on its ``imports=`` that no ``run`` module imports (statically,
    through the project's modules): their import would no longer run under the image's transformers."""
    covered = set().union(*(reach.closure(module_name(REPO / m)) for m, line in lines.items() if line.action == "run"))
    gaps = {m: {i for i in line.imports if module_name(REPO / i) not in covered} for m, line in lines.items()
            if line.action == "skip"}
    return {m: gap for m, gap in gaps.items() if gap}


def main(argv: list[str]) -> int:
    if not (OVERLAY / "transformers").is_dir():
        print(f"{OVERLAY} has no transformers: run `make {OVERLAY.name}/.installed` first", file=sys.stderr)
        return 2
    lines = read_list() if LIST.exists() else {}
    reach = Reach()
    with tempfile.TemporaryDirectory(prefix="image-modules-") as tmp:
        write_hook(Path(tmp))
        with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as workers:
            for module, found, code, tail in workers.map(lambda m: (m, *trace_module(m, tmp, Path(tmp))),
                                                         argv or pool(lines)):
                lines[module] = line_for(module, found, code, reach)
                print(f"{lines[module].action:<4}  {module}  # {lines[module].why}", flush=True)
                if not any("called" in r for r in found) and code not in (0, 5):
                    print(tail, file=sys.stderr)
    for module, gap in uncovered(lines, reach).items():
        lines[module] = Line("run", module, frozenset(), f"its import of {', '.join(sorted(gap))} calls "
                             "transformers and no run module imports it")
    LIST.write_text(format_list(lines), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
