"""Every command in the docs' code blocks names only what exists: commands, flags, presets, keys, targets, paths.

The docs (``DOCS``) are read as a user copies from them: each fenced block tagged ``bash``, ``sh``, ``shell``,
``console`` (the ``$ `` lines) or untagged is split into simple commands (backslash continuations joined,
comments dropped, ``&&``, ``||``, ``;``, ``|`` and ``&`` split, redirections dropped, leading ``VAR=value``
assignments set aside, ``$(...)`` kept as one opaque word), and each command is checked by its shape, with the
project's own tools and no mock:

- ``make T``: ``make -n T`` knows the target;
- ``stapo SUB ...`` (and any CLI below): ``SUB --help`` runs (sub-commands followed down, e.g. ``stapo data
  prepare``), every ``--flag`` is in that help, a value of a flag with choices is one of them; the data sets
  of ``stapo data prepare`` are in its help; ``stapo --version`` prints the package's version; the overrides of
  ``stapo check`` and ``stapo train`` (the recipe with its progress line) are composed and checked as below,
  those of ``stapo doctor`` through the doctor's own argument parser, smoke preset and config check,
  and ``stapo sweep``'s through its own parser, plan and check of every cell (``check_cells``, as before its
  first run; on the first seed's runs);
- ``python -m M ...``: ``M`` is importable and its flags are in ``M --help`` (``--hydra-help`` for a Hydra
  app, whose own parser then separates the flags from the overrides); ``python FILE``: the file exists and
  ``FILE --help`` lists the flags; ``pip install .[X]``: ``X`` is an extra of pyproject.toml;
- ``bash S``, ``sbatch ... S``: ``S`` exists and passes ``bash -n``; each ``VAR=value`` given is read by it (or
  by what it sources), as is each ``export NAME=...`` by a script its block runs; the overrides given to a
  script that runs the recipe (``exec python -m recipe.stapo.main_stapo ... "$@"`` with ``${VAR:-default}``
  expanded, or a script whose header says its arguments are the recipe's overrides) are composed and checked;
- ``docker ...``: an image tag ``stapo:...`` is the one docker/README.md builds from the Dockerfile's pins;
  ``docker run IMAGE MODE ...`` and ``docker exec C stapo-entrypoint MODE ...`` name a case of
  docker/entrypoint.sh (the Dockerfile's ENTRYPOINT), and what that case execs is checked as the command it is,
  with the container's ``-e`` variables (``doctor`` as ``stapo doctor``, ``submit`` as ``bash
  launch/ray/submit.sh``, anything else as itself);
- ``ray SUB ...``: ``ray SUB --help`` runs and lists the flags;
- ``sky launch|exec|logs|down ...``: the task file exists, each ``--env``/``--secret`` is one it declares, the
  overrides in ``STAPO_ARGS`` are composed and checked, ``logs``/``exec``/``down`` name a cluster the same doc
  launches;
- a block line made only of overrides (recipe/stapo/README.md, "Using STAPO from verl's own entry point") lists
  overrides of verl's own
  ``python -m verl.trainer.main_ppo``: composed with verl's ``ppo_trainer`` config;
- every argument under a source folder (``SOURCE_DIRS``) exists; every ``_target_`` imports.

Overrides are composed by the recipe's own composition (``stapo.check.compose_run``: what ``stapo check``, the
recipe, the sweep and the doctor run) and checked by ``check_run`` (the settings; the model and data paths too
when the command runs here and the model is a ``stapo://`` one: on a cluster they are the nodes'). A
placeholder value (``N``, ``<head>``, ``...``, ``$VAR``) only has its key checked. They run in this process,
once per distinct set: a ``stapo check`` process costs about 12 s on 2 cores (importing verl), a composition
here about 0.5 s once verl is imported. ``--help`` outputs are cached too.

Not checked: nothing that needs a GPU, a cluster, Docker, a cloud or the internet runs (only its names are
checked); the flags of docker, sbatch, sky and kubectl (their CLIs are not part of the set-up); ``ray``
sub-commands against this venv's Ray, not the image's; shell utilities (``cd``, ``mkdir``, ...) beyond their
paths; output paths (``checkpoints/``, ``runs/``, ...); inline code in the prose; blocks tagged otherwise
(``text``, ``yaml``).
A command none of the shapes above covers fails, unless its line, or a comment line of its block, says
``GPU-only: checked by <what>``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import io
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.launch.test_static import _dockerfile_args

REPO = Path(__file__).resolve().parents[2]
# the docs whose shell blocks hold commands (docs/findings.md, testing.md, benchmarks-history.md hold none)
DOCS = ("README.md", "recipe/stapo/README.md", "recipe/stapo/examples/README.md", "launch/README.md",
        "docker/README.md", "docs/reliability.md", "docs/cpu-backends.md")
BIN = Path(sys.executable).parent
RECIPE = "recipe.stapo.main_stapo"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
# arguments under these folders are repository files and must exist (runs/, checkpoints/, ... are outputs)
SOURCE_DIRS = ("benchmarks", "conf", "docker", "docs", "launch", "recipe", "requirements", "stapo", "tests")
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "zsh"}
# shell utilities: nothing of the project's in them but the paths they are given
SHELL_UTILITIES = {"cd", "echo", "export", "ls", "mkdir", "cat"}
GPU_ONLY = re.compile(r"GPU-only: checked by \S")
FENCE = re.compile(r"^\s*```\s*([\w+-]*)\s*$")
ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.@/-]*=")
PLACEHOLDER = re.compile(r"^(\.\.\.|[A-Z][A-Z0-9_]*|.*[<$].*)$")
COMMAND_SUBSTITUTION = re.compile(r"\$\([^()]*\)")
OPERATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>>", "&>"}
DOCKER_BOOLEAN_FLAGS = {"-d", "--detach", "--rm", "-i", "-t", "-it", "-ti", "--init", "--interactive", "--tty",
                        "--privileged", "--read-only", "-P"}
SKY_COMMANDS = {"launch", "exec", "logs", "down", "status", "stop", "start", "queue", "cancel"}


@dataclass(frozen=True)
class Command:
    """One simple command of a doc: where it is, its words and the assignments before them."""

    doc: str
    line: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    gpu_only: bool = False
    block: int = 0  # the fenced block's number in its doc

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join([*(f'{k}={v}' for k, v in self.env), *self.argv])}"


@dataclass
class Context:
    """What a check may need beyond the command: its assignments and the other commands of its doc."""

    env: dict[str, str] = field(default_factory=dict)
    doc: tuple[Command, ...] = ()
    block: int = 0


# ---------------------------------------------------------------- reading the docs


def split_comment(line: str) -> tuple[str, str]:
    """Code and comment of a shell line: a ``#`` starting a word, outside quotes, starts the comment."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:]
    return line, ""


def shell_blocks(text: str) -> list[tuple[str, list[tuple[int, str]]]]:
    """The fenced blocks a shell reads (tag and numbered lines); ``text``, ``yaml``, ... are left out."""
    blocks, lines, tag = [], None, ""
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence and lines is None:
            tag, lines = fence.group(1).lower(), []
        elif fence and not fence.group(1):
            if tag in SHELL_LANGS:
                blocks.append((tag, lines))
            lines = None
        elif lines is not None:
            lines.append((number, line))
    return blocks


def statements(tag: str, lines: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(first line, code, comments) of each logical line: continuations joined, console output left out."""
    found, start, code, comments = [], None, [], []
    for number, raw in lines:
        if tag == "console" and start is None:
            if not raw.startswith("$ "):
                continue
            raw = raw[2:]
        body, comment = split_comment(raw)
        start = number if start is None else start
        comments.append(comment)
        if raw.rstrip().endswith("\\"):
            code.append(body.rstrip()[:-1])
            continue
        found.append((start, " ".join(code + [body]).strip(), " ".join(comments)))
        start, code, comments = None, [], []
    if start is not None:
        found.append((start, " ".join(code).strip(), " ".join(comments)))
    return found


def simple_commands(code: str) -> list[list[str]]:
    """The words of each simple command of a line: split at the operators, redirections dropped."""
    words = shlex.split(COMMAND_SUBSTITUTION.sub("$CMD", code))
    commands, current, skip = [], [], False
    for word in words:
        if skip:
            skip = False
        elif word in OPERATORS:
            commands.append(current)
            current = []
        elif word in REDIRECTS:
            skip = True
        elif not (re.match(r"^\d?>", word) or (word.startswith("<") and ">" not in word)):
            current.append(word)  # <head> is a placeholder, <file and >file redirections
    return [command for command in [*commands, current] if command]


def commands_of(doc: str, text: str) -> list[Command]:
    """Every command of the doc's shell blocks, with its line and whether it is marked GPU-only."""
    found = []
    for block, (tag, lines) in enumerate(shell_blocks(text)):
        parsed = statements(tag, lines)
        marked_block = any(not code and GPU_ONLY.search(comment) for _, code, comment in parsed)
        for line, code, comment in parsed:
            try:
                commands = simple_commands(code) if code else []
            except ValueError as error:  # unbalanced quotes: the collection fails naming the line
                raise ValueError(f"{doc}:{line}: {error}: {code}") from None
            for words in commands:
                split = next((i for i, w in enumerate(words) if not ASSIGNMENT.match(w)), len(words))
                if split == len(words):
                    continue  # assignments only: nothing runs
                env = tuple(tuple(w.split("=", 1)) for w in words[:split])
                gpu_only = marked_block or bool(GPU_ONLY.search(comment))
                found.append(Command(doc, line, tuple(words[split:]), env, gpu_only, block))
    return found


# ---------------------------------------------------------------- running the project's tools (cached)


@functools.lru_cache(maxsize=None)
def run(argv: tuple[str, ...]) -> tuple[int, str]:
    """Exit code and output of a command of the project (a --help, make -n, bash -n), once per session."""
    try:
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=180)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not installed"
    return done.returncode, done.stdout + done.stderr


def program(name: str) -> str:
    """The program a doc names: ``.venv/bin/X``, ``python``, ``python3`` and ``stapo`` are this venv's."""
    name = name.removeprefix(".venv/bin/")
    if name in ("python", "python3"):
        return sys.executable
    return str(BIN / name) if (BIN / name).exists() else (shutil.which(name) or name)


def help_of(base: tuple[str, ...], flag: str = "--help") -> tuple[str, list[str]]:
    """The help text of ``base`` and, when it does not run, the problem."""
    code, out = run((program(base[0]), *base[1:], flag))
    if code != 0:
        return out, [f"`{' '.join(base)} {flag}` exits {code}: {out.strip()[-300:]}"]
    return out, []


def subcommands(help_text: str) -> set[str]:
    """The sub-commands a help lists: argparse's ``{a,b} ...``, or the lines of a ``Commands:`` section."""
    choices = re.search(r"\{([\w,-]+)\} \.\.\.", help_text)
    if choices:
        return set(choices.group(1).split(","))
    section = re.split(r"^commands:\s*$", help_text, maxsplit=1, flags=re.M | re.I)
    return set(re.findall(r"^  ([a-z][\w-]*)(?:\s{2,}|$)", section[1], flags=re.M)) if len(section) > 1 else set()


def in_help(help_text: str, flag: str) -> bool:
    """The flag (or name) as a word of the help, ``--seed`` not matching ``--seeds``."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def takes_value(help_text: str, flag: str) -> bool:
    """Whether the help shows a metavar after the flag (``--out OUT``, ``--algo {a,b}``, ``-e <path>``)."""
    metavar = r"(?:[A-Z][A-Z0-9_]*|\{[^}]*\}|<[^>]+>)(?![\w-])"
    return re.search(rf"(?<![\w-]){re.escape(flag)}[ =]{metavar}", help_text) is not None


def cli_problems(base: tuple[str, ...], args: list[str], help_flag: str = "--help") -> tuple[str, list[str], list[str]]:
    """Follows the sub-commands at the head of ``args`` down to the last one's help, then checks every flag
    against it (and a value against the flag's choices). Returns that help, the positional arguments and the
    problems."""
    help_text, problems = help_of(base, help_flag)
    while args and not problems and (names := subcommands(help_text)) and not args[0].startswith("-"):
        if args[0] not in names:
            return help_text, [], [f"`{' '.join(base)}` has no sub-command {args[0]!r} (it has {sorted(names)})"]
        base, args = (*base, args[0]), args[1:]
        help_text, problems = help_of(base, help_flag)
    positionals, rest = [], list(args)
    while rest:
        word = rest.pop(0)
        if word == "--":
            positionals += rest
            break
        if not word.startswith("-") or word == "-":
            positionals.append(word)
            continue
        flag, given, value = word.partition("=")
        if not in_help(help_text, flag):
            problems.append(f"`{' '.join(base)}` has no option {flag}")
            continue
        if not given and takes_value(help_text, flag) and rest:
            value = rest.pop(0)
        choices = re.search(rf"(?<![\w-]){re.escape(flag)}[ =]\{{([^}}]*)\}}", help_text)
        if choices and value not in choices.group(1).split(","):
            problems.append(f"`{' '.join(base)} {flag}` takes one of {{{choices.group(1)}}}, not {value!r}")
    return help_text, positionals, problems


# ---------------------------------------------------------------- overrides


def is_placeholder(override: str) -> bool:
    return PLACEHOLDER.match(override.partition("=")[2]) is not None


def target_problems(overrides: list[str]) -> list[str]:
    """Every ``..._target_=module.Class`` names a class that imports."""
    problems = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.endswith("_target_"):
            module, _, name = value.rpartition(".")
            try:
                getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError) as error:
                problems.append(f"{override}: {error}")
    return problems


@functools.lru_cache(maxsize=None)
def recipe_refusal(overrides: tuple[str, ...], local: bool, validate: bool = True) -> str | None:
    """The recipe's refusal of these overrides (as ``stapo check`` gives it), None when accepted. A placeholder
    only needs its key; the paths are checked for a ``stapo://`` model on this machine (``local``)."""
    from omegaconf import OmegaConf

    from stapo.algorithm.validation import STAPOConfigError
    from stapo.check import check_run, compose_run, quiet_optional_engines

    quiet_optional_engines()
    given = [o for o in overrides if o != "..."]
    try:
        config = compose_run([o for o in given if not is_placeholder(o)])
        unset = object()
        for key in (o.partition("=")[0] for o in given if is_placeholder(o) and not o.startswith("+")):
            if OmegaConf.select(config, key.lstrip("~"), default=unset) is unset:
                return f"{key}: no such key of the recipe's config"
        if validate:
            model = str(OmegaConf.select(config, "actor_rollout_ref.model.path", default=""))
            check_run(config, paths=local and model.startswith("stapo://"))
    except STAPOConfigError as error:
        return str(error)
    return "; ".join(target_problems(given)) or None


def override_problems(overrides: list[str], local: bool, validate: bool = True) -> list[str]:
    refusal = recipe_refusal(tuple(overrides), local, validate)
    return [f"the recipe refuses {' '.join(overrides)}: {refusal}"] if refusal else []


@functools.lru_cache(maxsize=None)
def verl_refusal(overrides: tuple[str, ...]) -> str | None:
    """verl's own ``main_ppo`` composition (its ``ppo_trainer`` config) of these overrides, None when it composes."""
    from hydra import compose, initialize_config_module

    try:
        with initialize_config_module("verl.trainer.config", version_base=None):
            compose("ppo_trainer", overrides=list(overrides))
    except Exception as error:  # Hydra's composition and grammar errors
        return str(error).strip().splitlines()[0]
    return "; ".join(target_problems(list(overrides))) or None


# ---------------------------------------------------------------- the checks by command


def check_make(argv: list[str], ctx: Context) -> list[str]:
    """``make -n TARGET`` (prints the recipe, runs nothing) for each target; ``VAR=value`` are make's settings."""
    problems = []
    for target in (word for word in argv[1:] if not word.startswith("-") and "=" not in word):
        code, out = run(("make", "-n", target))
        if "No rule to make target" in out:
            problems.append(f"the Makefile has no target {target!r}")
        elif code:
            problems.append(f"`make -n {target}` exits {code}: {out.strip()[-300:]}")
    return problems


def version_problems() -> list[str]:
    """``stapo --version``: exits 0 and prints the version pyproject.toml gives the package."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    code, out = run((program("stapo"), "--version"))
    if code != 0 or not in_help(out, version):
        return [f"`stapo --version` exits {code} printing {out.strip()[-200:]!r}, not the version {version}"]
    return []


def check_stapo(argv: list[str], ctx: Context) -> list[str]:
    """The CLI's sub-command and flags; then what each sub-command does with its positional arguments."""
    if argv[1:] == ["--version"]:
        return version_problems()
    help_text, positionals, problems = cli_problems(("stapo",), argv[1:])
    sub = argv[1] if len(argv) > 1 else ""
    if problems:
        return problems
    if sub in ("check", "train"):
        return override_problems(positionals, local=True)
    if sub == "doctor":
        return doctor_problems(argv[2:])
    if sub == "sweep":
        return sweep_problems(argv[2:])
    if argv[1:3] == ["data", "prepare"]:
        return [f"`stapo data prepare` knows no data set {name!r}" for name in positionals
                if not in_help(help_text, name)]
    return []


def doctor_problems(args: list[str]) -> list[str]:
    """``stapo doctor``'s own argument parser, then the config check it makes (the smoke preset's with
    --smoke); with only ``trainer.*`` overrides the doctor checks none, so only their keys are."""
    from stapo.doctor.cli import config_refusal, parse_args
    from stapo.doctor.smoke import smoke_overrides

    if {"-h", "--help"} & set(args):
        return []  # the help ran already
    concrete = [a for a in args if not (OVERRIDE.match(a) and is_placeholder(a)) and a != "..."]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parsed, plan = parse_args(concrete)
    except SystemExit:
        return [f"`stapo doctor` refuses its arguments: {stderr.getvalue().strip()[-300:]}"]
    overrides = [a for a in args if OVERRIDE.match(a)]
    if parsed.smoke:
        refusal = config_refusal(smoke_overrides([o for o in overrides if not is_placeholder(o)]))
        return ([refusal] if refusal else []) + override_problems(overrides, local=False, validate=False)
    return override_problems(overrides, local=False, validate=bool(plan["ignored"]))


def sweep_problems(args: list[str]) -> list[str]:
    """``stapo sweep``'s own parser and plan, then its check of every cell before a run starts
    (``check_cells``, the recipe's checks) on the first seed's runs: the seeds change only the seed keys."""
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.sweep.cli import build_parser, check_cells
    from stapo.sweep.grid import parse_axis, parse_seeds, plan

    if {"-h", "--help"} & set(args):
        return []  # the help ran already
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(io.StringIO()):
            parsed = build_parser().parse_args(args)
        runs = plan([parse_axis(text) for text in parsed.grid], parse_seeds(parsed.seeds or "1")[:1], parsed.out)
        check_cells(runs, list(parsed.overrides), paths=parsed.launcher == "local")
    except SystemExit:
        return [f"`stapo sweep` refuses its arguments: {out.getvalue().strip()[-300:]}"]
    except STAPOConfigError as error:
        return [f"`stapo sweep` refuses: {error}"]
    return []


def check_python(argv: list[str], ctx: Context) -> list[str]:
    """``python -m MODULE``: importable, flags in its help; the recipe's overrides composed and checked."""
    if argv[1:2] != ["-m"]:
        script = argv[1] if len(argv) > 1 else ""
        if not (REPO / script).is_file():
            return [f"no file {script}"]
        return cli_problems((argv[0], script), argv[2:])[2]
    module = argv[2] if len(argv) > 2 else ""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None:
        return [f"no module {module!r}"]
    if not spec.origin.endswith(".py") or "hydra.main(" not in Path(spec.origin).read_text(encoding="utf-8"):
        return cli_problems((argv[0], "-m", module), argv[3:])[2]
    return hydra_problems(argv[0], module, argv[3:])


def hydra_problems(python: str, module: str, args: list[str]) -> list[str]:
    """A Hydra app: flags in ``--hydra-help``, split from the overrides by Hydra's own parser."""
    from hydra._internal.utils import get_args_parser

    help_text, problems = help_of((python, "-m", module), "--hydra-help")
    problems += [f"`{module}` has no option {w.split('=')[0]}" for w in args
                 if w.startswith("-") and not in_help(help_text, w.split("=")[0])]
    parsed, unknown = get_args_parser().parse_known_args([a for a in args if a != "..."])
    problems += [f"`{module}` does not take {word!r}" for word in unknown]
    if module == RECIPE and not problems:
        problems += override_problems(parsed.overrides, local=True)
    return problems


def script_texts(script: Path) -> str:
    """The script and the files it sources from its own folder (``source "$(dirname ...)/common.sh"``)."""
    text = script.read_text(encoding="utf-8")
    sourced = re.findall(r'^\s*(?:source|\.)\s+.*?([\w.-]+\.sh)"?\s*$', text, flags=re.M)
    return text + "".join((script.parent / name).read_text(encoding="utf-8") for name in sourced
                          if (script.parent / name).is_file())


def recipe_line(text: str, env: dict[str, str]) -> list[str] | None:
    """The overrides a script passes before ``"$@"`` to ``exec python -m recipe.stapo.main_stapo``, its
    ``${VAR:-default}`` taken from ``env``; None when it runs no such line."""
    line = re.search(rf'^exec python3? -m {re.escape(RECIPE)}(.*)"\$@"\s*$', text, flags=re.M)
    if not line:
        return None
    expanded = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), line.group(1))
    return shlex.split(expanded)


def check_script(path: str, args: list[str], ctx: Context) -> list[str]:
    """A script the doc runs: exists, ``bash -n``, reads each assignment given, its recipe overrides compose."""
    script = REPO / path
    if not script.is_file():
        return [f"no script {path}"]
    code, out = run(("bash", "-n", str(script)))
    problems = [f"`bash -n {path}`: {out.strip()}"] if code else []
    text = script_texts(script)
    problems += [f"{path} does not read {name}" for name in ctx.env if not re.search(rf"\b{name}\b", text)]
    overrides = [a for a in args if OVERRIDE.match(a) or a == "..."]
    fixed = recipe_line(text, ctx.env)
    if fixed is not None:
        problems += override_problems([*fixed, *overrides], local=True)
    elif "Arguments are Hydra overrides of recipe.stapo.main_stapo" in text:
        problems += override_problems(overrides, local=False)
    return problems


def check_bash(argv: list[str], ctx: Context) -> list[str]:
    if len(argv) < 2 or argv[1].startswith("-"):
        return []  # an interactive shell
    return check_script(argv[1], argv[2:], ctx)


def script_index(argv: list[str] | tuple[str, ...]) -> int | None:
    """Where the script is in ``bash S ...`` or ``sbatch [--opt=value ...] S ...``: its first non-option word."""
    return next((i for i, word in enumerate(argv[1:], 1) if not word.startswith("-")), None)


def check_sbatch(argv: list[str], ctx: Context) -> list[str]:
    """sbatch itself is not installed here: the script is checked."""
    index = script_index(argv)
    return check_script(argv[index], argv[index + 1:], ctx) if index else ["sbatch without a script"]


def check_ray(argv: list[str], ctx: Context) -> list[str]:
    """From ``ray SUB --help`` on (it fails for an unknown SUB): ``ray --help`` alone costs seconds."""
    return cli_problems(tuple(argv[:2]), argv[2:])[2]


def expected_image_tag() -> str:
    """The tag docker/README.md builds (and launch/skypilot/stapo.yaml runs), from the Dockerfile's pins."""
    args = _dockerfile_args()
    vllm_line = re.search(r":(vllm\d+)", args["BASE_IMAGE"]).group(1)
    return f"{args['STAPO_VERSION']}-verl{args['VERL_VERSION']}-{vllm_line}"


def tag_problems(argv: tuple[str, ...]) -> list[str]:
    tags = [m.group(1) for w in argv if (m := re.search(r"(?:^|[/:])stapo:(\w[\w.-]*)$", w))]
    return [f"image tag stapo:{tag} is not the Dockerfile's stapo:{expected_image_tag()}" for tag in tags
            if tag != expected_image_tag()]


@functools.lru_cache(maxsize=None)
def entrypoint_modes() -> dict[str, tuple[str, ...] | None]:
    """mode -> the command its case of docker/entrypoint.sh execs (before ``"$@"``; ``("$mode",)`` for the
    catch-all), None for a mode that execs nothing (help)."""
    text = ENTRYPOINT.read_text(encoding="utf-8")
    # LAUNCH="$STAPO_HOME/launch/ray": STAPO_HOME is the repository's copy in the image
    launch = re.search(r'^LAUNCH="\$STAPO_HOME/([^"]+)"$', text, flags=re.M).group(1)
    body = text.split('case "$mode" in', 1)[1].split("\nesac", 1)[0]
    modes = {}
    for label, case in re.findall(r"^\s*([^\n()]+)\)\n(.*?);;", body, flags=re.M | re.S):
        command = re.search(r"^\s*exec (.*?)\s*\"\$@\"\s*$", case, flags=re.M)
        argv = tuple(shlex.split(command.group(1).replace("$LAUNCH", launch))) if command else None
        for name in label.split("|"):
            modes[name.strip()] = argv
    return modes


def entrypoint_name() -> str:
    """The command the image's ENTRYPOINT names (docker/entrypoint.sh copied there by the Dockerfile)."""
    dockerfile = (REPO / "docker" / "Dockerfile").read_text(encoding="utf-8")
    return Path(re.search(r'^ENTRYPOINT \["([^"]+)"', dockerfile, flags=re.M).group(1)).name


def entrypoint_problems(mode_and_args: list[str], ctx: Context) -> list[str]:
    """What the entrypoint runs for ``MODE ARGS``, checked as that command."""
    if not mode_and_args:
        return []
    mode, args = mode_and_args[0], mode_and_args[1:]
    modes = entrypoint_modes()
    argv = modes.get(mode, modes["*"])
    if argv is None:
        return []
    argv = tuple(mode if w == "$mode" else w for w in argv)
    return dispatch([*argv, *args], ctx)


def docker_options(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """The ``-e NAME=value`` of ``docker run|exec`` and the words after its options (an option takes a value
    unless it is boolean)."""
    env, rest = {}, list(args)
    while rest and rest[0].startswith("-"):
        word = rest.pop(0)
        if "=" not in word and word not in DOCKER_BOOLEAN_FLAGS and rest:
            value = rest.pop(0)
            if word in ("-e", "--env"):
                name, _, given = value.partition("=")
                env[name] = given
    return env, rest


def check_docker(argv: list[str], ctx: Context) -> list[str]:
    """The image's entrypoint mode and what it runs, given the container's ``-e`` variables; tags and paths
    are checked for every command."""
    sub = argv[1] if len(argv) > 1 else ""
    env, rest = docker_options(argv[2:])
    inner = Context(env, ctx.doc, ctx.block)
    if sub == "run" and rest:
        return entrypoint_problems(rest[1:], inner)
    if sub == "exec" and len(rest) > 1:
        if rest[1] == entrypoint_name():
            return entrypoint_problems(rest[2:], inner)
        return dispatch(rest[1:], inner)
    return []


def sky_task(argv: list[str]) -> dict:
    task = next((w for w in argv if w.endswith((".yaml", ".yml"))), None)
    return yaml.safe_load((REPO / task).read_text()) if task and (REPO / task).is_file() else {}


def check_sky(argv: list[str], ctx: Context) -> list[str]:
    """SkyPilot (not installed here): the task's variables, the run's overrides, the cluster names."""
    sub = argv[1] if len(argv) > 1 else ""
    if sub not in SKY_COMMANDS:
        return [f"`sky {sub}` is no SkyPilot command this test knows"]
    problems, task = [], sky_task(argv)
    declared = {*task.get("envs", {}), *(task.get("secrets") or {})}
    for flag, value in zip(argv, argv[1:]):
        name, _, given = value.partition("=")
        if flag in ("--env", "--secret") and task and name not in declared:
            problems.append(f"{flag} {name}: the task declares no such variable ({sorted(declared)})")
        if flag == "--env" and name == "STAPO_ARGS" and given != "...":
            problems += override_problems(given.split(), local=False)
    if sub in ("logs", "exec", "down") and len(argv) > 2 and argv[2] not in launched_clusters(ctx.doc):
        problems.append(f"no `sky launch -c {argv[2]}` in this doc")
    return problems


def launched_clusters(doc: tuple[Command, ...]) -> set[str]:
    return {c.argv[i + 1] for c in doc if c.argv[:2] == ("sky", "launch")
            for i, w in enumerate(c.argv[:-1]) if w == "-c"}


def check_verl_overrides(argv: list[str], ctx: Context) -> list[str]:
    """A line of bare overrides: with the other such lines of its block, overrides of verl's own entry point."""
    block = [c for c in ctx.doc if c.block == ctx.block and is_bare_override(c.argv[0])] or [Command("", 0, argv)]
    overrides = tuple(word for command in block for word in command.argv)
    refusal = verl_refusal(overrides)
    return [f"verl's main_ppo refuses {' '.join(overrides)}: {refusal}"] if refusal else []


def check_nothing(argv: list[str], ctx: Context) -> list[str]:
    return []


def check_export(argv: list[str], ctx: Context) -> list[str]:
    """``export NAME=value``: a script its block runs reads NAME (when the block runs one)."""
    scripts = [c.argv[index] for c in ctx.doc if c.block == ctx.block and c.argv[0] in ("bash", "sh", "sbatch")
               and (index := script_index(c.argv))]
    texts = "".join(script_texts(REPO / path) for path in scripts if (REPO / path).is_file())
    names = [word.partition("=")[0] for word in argv[1:] if not word.startswith("-")]
    return [f"no script this block runs reads {name}" for name in names
            if texts and not re.search(rf"\b{name}\b", texts)]


CHECKS = {
    "make": check_make, "stapo": check_stapo, "python": check_python, "python3": check_python,
    "bash": check_bash, "sh": check_bash, "sbatch": check_sbatch, "ray": check_ray, "docker": check_docker,
    "sky": check_sky, "export": check_export, "kubectl": check_nothing,
    **{name: check_nothing for name in SHELL_UTILITIES - {"export"}},
}
UNKNOWN = "is no command this test checks"


def is_bare_override(word: str) -> bool:
    """``a.b=c`` or ``+a=b``: a Hydra override, not a shell assignment (``A=b``)."""
    return OVERRIDE.match(word) is not None and ASSIGNMENT.match(word) is None


def dispatch(argv: list[str] | tuple[str, ...], ctx: Context) -> list[str]:
    """The check of one command by its program; an unknown program is a problem ending with ``UNKNOWN``."""
    name = argv[0].removeprefix(".venv/bin/")
    if is_bare_override(name):
        return check_verl_overrides(list(argv), ctx)
    check = CHECKS.get(name)
    if check is None:
        return [f"`{argv[0]}` {UNKNOWN}"]
    return check([name, *argv[1:]], ctx)


def path_problems(argv: tuple[str, ...]) -> list[str]:
    """Arguments under a source folder (also after ``=`` or ``:``) name files or folders that exist."""
    problems = []
    for word in argv:
        for candidate in re.split(r"[=:]", word):
            candidate = candidate.removeprefix("./")
            if candidate.split("/")[0] in SOURCE_DIRS and "/" in candidate:
                if not any(REPO.glob(candidate)) and not (REPO / candidate).exists():
                    problems.append(f"no such path {candidate}")
    return problems


def extras_problems(argv: tuple[str, ...]) -> list[str]:
    """``pip install .[X]``: X is an extra of pyproject.toml."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    named = [name for w in argv if (m := re.match(r"^\.\[([\w,-]+)\]$", w)) for name in m.group(1).split(",")]
    return [f"pyproject.toml has no extra {name!r}" for name in named if name not in extras]


def problems_of(command: Command, doc: tuple[Command, ...] = ()) -> list[str]:
    """Everything wrong with one command of a doc (empty: it names only what exists). A command no check
    knows passes only when marked GPU-only."""
    ctx = Context(dict(command.env), doc, command.block)
    found = path_problems(command.argv) + tag_problems(command.argv) + extras_problems(command.argv)
    for problem in dispatch(command.argv, ctx):
        if not problem.endswith(UNKNOWN):
            found.append(problem)
        elif not command.gpu_only:
            found.append(f"{problem} (mark it `# GPU-only: checked by <what>` if nothing on a CPU can check it)")
    return found


def check_text(doc: str, text: str) -> list[tuple[Command, list[str]]]:
    commands = tuple(commands_of(doc, text))
    return [(command, problems_of(command, commands)) for command in commands]


# ---------------------------------------------------------------- the tests

DOC_COMMANDS = {doc: tuple(commands_of(doc, (REPO / doc).read_text(encoding="utf-8"))) for doc in DOCS}
ALL = [command for commands in DOC_COMMANDS.values() for command in commands]


@pytest.mark.parametrize("command", ALL, ids=[f"{c.doc}:{c.line}:{' '.join(c.argv[:3])}" for c in ALL])
def test_doc_command_names_only_what_exists(command):
    problems = problems_of(command, DOC_COMMANDS[command.doc])
    assert not problems, f"{command}\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("doc", DOCS)
def test_every_doc_has_commands_to_check(doc):
    """A parser that finds nothing would pass every doc: each of these has command blocks."""
    assert DOC_COMMANDS[doc], doc


# ---------------------------------------------------------------- README.md's troubleshooting: the refusals as printed


def troubleshooting_pairs() -> list[tuple[int, str, str]]:
    """(line, command, what it prints) of each ``$ stapo check ...`` line of the ```text block under README.md's
    "Troubleshooting" and the line under it (a text block: the shell checks above would report these refusals)."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## Troubleshooting")
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    assert lines[fence] == "```text", lines[fence]
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    block = lines[fence + 1:end]
    assert len(block) % 2 == 0, "each $ line is followed by the one line it prints"
    return [(fence + 2 + i, block[i], block[i + 1]) for i in range(0, len(block), 2)]


TROUBLESHOOTING = troubleshooting_pairs()


def refusal_with_paths(overrides: list[str]) -> str | None:
    """What ``stapo check OVERRIDES`` refuses, the model and data paths checked as on this machine (None: OK)."""
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.check import check_run, compose_run, quiet_optional_engines

    quiet_optional_engines()
    try:
        check_run(compose_run(overrides), paths=True)
    except STAPOConfigError as error:
        return str(error)
    return None


def test_readme_shows_five_refusals():
    assert len(TROUBLESHOOTING) == 5 and all(command.startswith("$ stapo check ") for _, command, _ in TROUBLESHOOTING)


@pytest.mark.parametrize("line, command, printed", TROUBLESHOOTING, ids=[f"README.md:{t[0]}" for t in TROUBLESHOOTING])
def test_a_refusal_readme_quotes_is_the_one_the_check_prints(line, command, printed, monkeypatch):
    """The command as a user types it in the repository: the hub id of a GPU preset is taken as one (no cache
    needed), relative paths from the repository root."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("STAPO_SKIP_PATH_CHECKS", raising=False)
    refusal = refusal_with_paths(shlex.split(command)[3:])
    assert refusal is not None, f"README.md:{line}: `{command[2:]}` is accepted"
    assert printed == f"stapo: {refusal}", f"README.md:{line}: the check prints\n  stapo: {refusal}"


def test_the_cli_prints_a_refusal_in_one_line_on_stderr_with_exit_code_2():
    """As README.md says of every refusal, for the first it quotes (one process: about 12 s)."""
    _, command, printed = TROUBLESHOOTING[0]
    done = subprocess.run([program("stapo"), *shlex.split(command)[2:]], cwd=REPO, capture_output=True, text=True,
                          timeout=180, check=False)
    lines = [line for line in done.stderr.splitlines() if line.startswith("stapo:")]
    assert done.returncode == 2 and lines == [printed], done.stderr[-1000:]


FAKE_DOC = """\
Some prose.

```bash
make no-such-target
stapo check model_preset=no_such_model algo=stapo
stapo check --no-such-flag model_preset=tiny
bash launch/ray/no_such_script.sh
STAPO_NO_SUCH_VAR=1 bash recipe/stapo/run_tiny_cpu.sh
stapo eval merged/x --backend no_such_backend
python -m recipe.stapo.main_stapo model_preset=tiny actor_rollout_ref.actor.policy_loss.tau_pp=0.1
docker run --rm stapo:0.0.0-verl0.0-vllm000 no_such_mode
frobnicate --now
frobnicate --later       # GPU-only: checked by nothing on a CPU, on purpose
make test && stapo check --print model_preset=tiny
stapo train model_preset=tiny actor_rollout_ref.actor.policy_loss.tau_p=2
stapo --version
```

```text
make not-checked-in-a-text-block
```

```sh
# GPU-only: checked by the whole block's marker
frobnicate --everywhere
```
"""


def test_the_checker_reports_what_does_not_exist():
    """Each kind of wrong name in a doc is reported, on its line; a marked command and good commands pass."""
    report: dict[int, str] = {}
    for command, problems in check_text("fake.md", FAKE_DOC):
        report[command.line] = report.get(command.line, "") + " | ".join(problems)
    assert "no target 'no-such-target'" in report[4]
    assert "model_preset=no_such_model: no such preset" in report[5]
    assert "has no option --no-such-flag" in report[6]
    assert "no script launch/ray/no_such_script.sh" in report[7] and "no such path" in report[7]
    assert "does not read STAPO_NO_SUCH_VAR" in report[8]
    assert "takes one of {auto,hf,vllm}, not 'no_such_backend'" in report[9]
    assert "did you mean 'actor_rollout_ref.actor.policy_loss.tau_p'" in report[10]
    assert "is not the Dockerfile's" in report[11] and "`no_such_mode` is no command" in report[11]
    assert f"`frobnicate` {UNKNOWN} (mark it" in report[12]
    assert report[13] == "" and report[14] == "" and report[16] == "" and report[25] == ""
    assert "tau_p must be a probability in (0, 1)" in report[15]
    assert sorted(report) == [*range(4, 17), 25]  # the text block (line 20) is not read
