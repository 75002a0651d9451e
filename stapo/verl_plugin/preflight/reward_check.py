"""The reward function checked on the driver before Ray: loaded by verl's own loader, called on real rows.

verl 0.9.1 imports ``reward.custom_reward_function.path`` inside its reward workers (``get_custom_reward_fn``,
``load_module``), a cluster start-up after launch: a syntax error, a missing name or a reward that raises on the
data appears as a Ray traceback in ``trainer.log`` minutes in, while the driver goes on. Here the same loader runs
in this process, the function's signature is bound to the keywords verl's reward managers pass
(stapo/reward/trial.py), and it is called on the first rows of the training file with the row's own answer and a
wrong one. Each failure is one :class:`STAPOConfigError` line with the file, the line and the reason; a reward that
scores the right answer no higher than a wrong one is a warning note (a reward may rightly need another format).
Without a custom reward, verl scores by ``data_source`` with ``default_compute_score``: the data's sources are
checked against the ones it knows. Each call is one short line as it returns, and the calls together have a budget,
``stapo.reward_check_budget_s`` (a reward that slow holds every training step; one over it is refused in one
line). ``--no-paths`` / ``STAPO_SKIP_PATH_CHECKS=1`` (files only the workers see) skip the loading and the calls.
``stapo reward test`` (stapo/reward/cli.py) makes the same calls by hand.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from stapo.algorithm.validation import STAPOConfigError, did_you_mean
from stapo.reward.trial import (
    REPLY_FORMATS,
    Reply,
    call_keywords,
    ground_truth,
    one_line,
    read_rows,
    reply_pairs,
    score_of,
)

KEY = "reward.custom_reward_function"
SKIP_ENV = "STAPO_SKIP_PATH_CHECKS"  # stapo.input_checks.SKIP_ENV
ROWS = 3
CALL_TIMEOUT_S = 60.0
# all the calls together (up to ROWS x 3 formats x 2): a reward needing more holds each step's thousands of calls
BUDGET_KEY, BUDGET_S = "stapo.reward_check_budget_s", 120.0
# verl's naive / dapo / gdpo / limited / remote managers (verl/experimental/reward_loop/reward_manager/) pass these
# by keyword; with a reward model's router also the two below
VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")
ROUTER_KEYWORDS = ("reward_router_address", "reward_model_tokenizer")
PKG, FILE = "pkg://", "file://"  # verl.utils.import_utils.PKG_PATH_PREFIX, FILE_PATH_PREFIX


@dataclass
class RewardFunction:
    """A loaded reward: the callable, how the config names it, its source file and the config's reward_kwargs."""

    fn: Callable[..., Any]
    path: str
    name: str
    source: str | None
    reward_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.path} ({self.name})"


@dataclass(frozen=True)
class Trial:
    """One call of the reward: the row (its number from 1), the reply, the score, the call's time and what the
    function returned."""

    row_number: int
    row: dict[str, Any]
    reply: Reply
    score: float
    seconds: float
    result: Any = None


def check_reward(config, paths: bool = True, show_calls: bool = True) -> list[str]:
    """The reward of a composed run config, checked as above; its notes. ``show_calls``: a line a call (a sweep
    checking each of its cells leaves them out; the budget bounds them all the same)."""
    path = OmegaConf.select(config, f"{KEY}.path", default=None)
    reward_model = bool(OmegaConf.select(config, "reward.reward_model.enable", default=False))
    skipped = _skipped(paths)
    if not path:
        if reward_model:
            return ["reward: a reward model, not checked here (its server scores on the cluster)"]
        return [f"reward: verl's default_compute_score; data_source values not checked ({skipped})"] if skipped \
            else check_default_sources(config)
    path = str(path)
    check_absolute(path)
    if skipped:
        return [f"reward: {path} not loaded ({skipped})"]
    reward = load_reward(path, OmegaConf.select(config, f"{KEY}.name", default=None),
                         _container(OmegaConf.select(config, f"{KEY}.reward_kwargs", default=None)))
    source = OmegaConf.select(config, "reward.reward_manager.source", default="register")
    if source != "register":
        return [f"reward: {reward.label} loaded; not called (reward.reward_manager.source={source}: your manager "
                "decides how it is called)"]
    check_signature(reward, ROUTER_KEYWORDS if reward_model else ())
    if reward_model:
        return [f"reward: {reward.label} loaded, its signature fits; not called (a reward model's server scores "
                "with it on the cluster)"]
    file, why = training_file(config)
    if file is None:
        return [f"reward: {reward.label} loaded, its signature fits; not tried on rows: {why}"]
    rows = read_rows(file, ROWS)
    if not rows:
        return [f"reward: {reward.label} loaded, its signature fits; not tried on rows: {file} has none"]
    trials = try_rows(reward, rows, str(file), on_trial=call_lines() if show_calls else None, budget_s=budget(config))
    return trial_notes(reward, trials, str(file))


def budget(config) -> float:
    """``stapo.reward_check_budget_s``: a number > 0, the seconds all the pre-flight's calls may take together."""
    value = OmegaConf.select(config, BUDGET_KEY, default=None)
    if value is None:
        return BUDGET_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise STAPOConfigError(f"{BUDGET_KEY} must be a number of seconds > 0, got {value!r}")
    return float(value)


def call_lines() -> Callable[[Trial], None]:
    """One short line a call, as it returns: its number, the row and reply, the score, the time."""
    calls = [0]

    def show(trial: Trial) -> None:
        calls[0] += 1
        reply = trial.reply
        which = "given" if reply.right is None else f"{'right' if reply.right else 'wrong'} answer, {reply.form}"
        print(f"[stapo] reward call {calls[0]}: row {trial.row_number}, {which} -> {trial.score:g} "
              f"({1000.0 * trial.seconds:.1f} ms)", flush=True)

    return show


def _skipped(paths: bool) -> str | None:
    if os.environ.get(SKIP_ENV) == "1":
        return f"{SKIP_ENV}=1"
    return None if paths else "--no-paths"


def _container(node) -> dict[str, Any]:
    if node is None:
        return {}
    return dict(OmegaConf.to_container(node, resolve=True)) if OmegaConf.is_config(node) else dict(node)


def check_absolute(path: str) -> None:
    """verl opens a file path from each reward worker's own directory (``os.path.exists`` in ``load_module``):
    another node's, or a sweep's run folder, not the directory of this command. A relative path (or ``~``, which
    verl does not expand) is refused with the absolute path it stands for here."""
    if path.startswith(PKG):
        return
    local = path[len(FILE):] if path.startswith(FILE) else path
    if os.path.isabs(local):
        return
    here = Path(local).expanduser().absolute()
    found = "" if here.exists() else " (no such file there either)"
    raise STAPOConfigError(
        f"{KEY}.path={path}: a relative path; verl opens it from each Ray worker's own directory (another node's, "
        f"a sweep's run folder), not this one: give the absolute path, here {here}{found}"
    )


# --------------------------------------------------------------------------- loading, as verl does


def load_reward(path: str, name: str | None, reward_kwargs: dict[str, Any] | None = None) -> RewardFunction:
    """The function ``name`` of ``path``, loaded by verl's ``load_module`` (what ``get_custom_reward_fn`` calls in
    the reward workers), each failure as one line."""
    from verl.utils.import_utils import load_module

    if not name:
        raise STAPOConfigError(f"{KEY}.name={name}: name the function verl calls (verl's default: compute_score)")
    if not path.startswith(PKG):
        local = Path(path[len(FILE):] if path.startswith(FILE) else path)
        if local.is_dir():
            raise STAPOConfigError(f"{KEY}.path={path}: is a folder; give the reward's .py file")
        if local.exists() and local.suffix != ".py":
            raise STAPOConfigError(f"{KEY}.path={path}: not a .py file (verl imports it as Python source)")
    try:
        module = load_module(path)
    except KeyboardInterrupt:  # the user stopping the check, not the file's fault
        raise
    except BaseException as error:  # verl: FileNotFoundError, RuntimeError from the import, pkg://'s; an exit too
        raise STAPOConfigError(load_error(path, error)) from None
    if not hasattr(module, name):  # verl's load_extern_object: getattr(module, name)
        functions = sorted(key for key, value in vars(module).items()
                           if inspect.isfunction(value) and not key.startswith("_"))
        raise STAPOConfigError(
            f"{KEY}.name={name}: {path} has no {name!r}; its functions: {functions}{did_you_mean(name, functions)}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise STAPOConfigError(f"{KEY}.name={name}: {path}'s {name!r} is a {type(fn).__name__}, not a function")
    return RewardFunction(fn, path, name, _source_file(fn, module), dict(reward_kwargs or {}))


def load_error(path: str, error: BaseException) -> str:
    """One line for an exception of verl's ``load_module``: the file, the line and the reason."""
    cause = error.__cause__ if isinstance(error, RuntimeError) and error.__cause__ is not None else error
    prefix = f"{KEY}.path={path}"
    if isinstance(error, FileNotFoundError) and not path.startswith(PKG):
        local = Path(path[len(FILE):] if path.startswith(FILE) else path)
        near = sorted(str(p) for p in local.parent.glob("*.py")) if local.parent.is_dir() else []
        return f"{prefix}: no such file{did_you_mean(str(local), near)}"
    if isinstance(cause, SyntaxError):
        return (f"{prefix}: {cause.filename}:{cause.lineno}: {type(cause).__name__}: {cause.msg} "
                f"({one_line((cause.text or '').strip(), 100)!r})")
    if path.startswith(PKG) and isinstance(cause, ModuleNotFoundError):
        module = path[len(PKG):].replace("/", ".")
        if cause.name and (module == cause.name or module.startswith(cause.name + ".")):
            return f"{prefix}: no module {module} is importable here (pkg:// names an installed module, " \
                   "e.g. pkg://stapo.reward)"
    where = _raise_site(cause, _path_file(path))
    if isinstance(cause, ModuleNotFoundError):
        return (f"{prefix}: importing it fails at {where}: no module named {cause.name!r} (install it here and on "
                "every node)")
    if isinstance(cause, SystemExit):
        return f"{prefix}: importing it calls sys.exit({cause.code!r}) at {where}: a reward must return, not exit"
    return f"{prefix}: importing it raises {type(cause).__name__}: {one_line(cause, 120)} at {where}"


def _path_file(path: str) -> str | None:
    if path.startswith(PKG):
        import importlib.util

        try:
            spec = importlib.util.find_spec(path[len(PKG):].replace("/", "."))
        except (ImportError, ValueError):
            return None
        return spec.origin if spec else None
    return str(Path(path[len(FILE):] if path.startswith(FILE) else path).resolve())


def _source_file(fn, module) -> str | None:
    try:
        return inspect.getsourcefile(fn) or getattr(module, "__file__", None)
    except TypeError:
        return getattr(module, "__file__", None)


def _raise_site(error: BaseException, file: str | None) -> str:
    """``file:line`` of the innermost frame in ``file`` (the user's code) that the exception went through, else
    the innermost frame of all."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith("<")]
    mine = [frame for frame in frames if file and os.path.realpath(frame.filename) == os.path.realpath(file)]
    frame = (mine or frames or [None])[-1]
    return f"{frame.filename}:{frame.lineno}" if frame else "(no Python frame)"


# --------------------------------------------------------------------------- signature


def check_signature(reward: RewardFunction, extra: tuple[str, ...] = ()) -> None:
    """The keywords verl passes (and the config's reward_kwargs) bind to the function's parameters."""
    try:
        signature = inspect.signature(reward.fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the calls below find out
    keywords = [*VERL_KEYWORDS, *extra, *reward.reward_kwargs]
    try:
        signature.bind(**{key: None for key in keywords})
    except TypeError as error:
        called = ", ".join(f"{key}=..." for key in keywords)
        raise STAPOConfigError(
            f"{KEY}.name={reward.name}: verl calls {reward.name}({called}) by keyword, which "
            f"{_definition(reward)}{signature} cannot take: {error}"
        ) from None


def _definition(reward: RewardFunction) -> str:
    try:
        line = inspect.getsourcelines(reward.fn)[1]
    except (OSError, TypeError):
        return reward.name
    return f"{reward.source}:{line} {reward.name}"


# --------------------------------------------------------------------------- calls on rows


def call_reward(reward: RewardFunction, keywords: dict[str, Any], timeout_s: float | None = None):
    """(the reward's return value, the call's seconds); an async reward is awaited, as verl does. The call runs in
    a thread (verl runs a sync reward in an executor): one that does not return within ``timeout_s`` raises
    ``TimeoutError`` and is left behind."""
    box: dict[str, Any] = {}

    def run() -> None:
        start = time.perf_counter()
        try:
            result = reward.fn(**keywords)
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
            box["result"] = result
        except BaseException as error:  # reported by the caller, with the row
            box["error"] = error
        box["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=run, name="stapo-reward-call", daemon=True)
    thread.start()
    timeout_s = CALL_TIMEOUT_S if timeout_s is None else timeout_s
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"did not return within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["result"], box["seconds"]


def score_reply(reward: RewardFunction, row: dict[str, Any], number: int, reply: Reply, data: str,
                timeout_s: float | None = None) -> Trial:
    """One call on a row, as verl makes it; an exception or a score verl cannot use is refused with the row."""
    keywords = call_keywords(row, reply.text, reward.reward_kwargs)
    seen = (f"row {number} of {data} (data_source={one_line(repr(row.get('data_source')), 40)}, ground_truth="
            f"{one_line(repr(ground_truth(row)), 40)}, reply {one_line(repr(reply.text), 50)})")
    try:
        result, seconds = call_reward(reward, keywords, timeout_s)
    except TimeoutError as error:
        raise STAPOConfigError(f"{KEY}: {reward.name} {error} on {seen}") from None
    except KeyboardInterrupt:  # the user stopping the check, not the reward's fault
        raise
    except BaseException as error:  # an exit too: verl's reward worker would die of it, and the check exit 0
        what = f"called sys.exit({error.code!r})" if isinstance(error, SystemExit) else \
            f"raised {type(error).__name__}: {one_line(error, 100)}"
        site = _raise_site(error, reward.source)
        raise STAPOConfigError(f"{KEY}: {reward.name} {what} at {site} on {seen}") from None
    try:
        score = score_of(result)
    except ValueError as error:
        raise STAPOConfigError(f"{KEY}: {reward.name} returned {error} on {seen}") from None
    return Trial(number, row, reply, score, seconds, result)


def try_rows(reward: RewardFunction, rows: list[dict[str, Any]], data: str, replies: list[str] | None = None,
             on_trial: Callable[[Trial], None] | None = None, budget_s: float | None = None) -> list[Trial]:
    """The reward on each row: the given ``replies``, or the row's own answer and a wrong one in each format of
    stapo/reward/trial.py until the right one scores higher. ``on_trial`` sees each call as it returns; with
    ``budget_s`` the calls together are refused past that many seconds."""
    trials: list[Trial] = []
    deadline = None if budget_s is None else time.monotonic() + budget_s

    def score(row: dict[str, Any], number: int, reply: Reply) -> Trial:
        left = None if deadline is None else deadline - time.monotonic()
        try:
            if left is not None and left <= 0:
                raise STAPOConfigError("no time left")
            trial = score_reply(reward, row, number, reply, data,
                                None if left is None or left >= CALL_TIMEOUT_S else left)
        except STAPOConfigError:
            if deadline is not None and time.monotonic() >= deadline:
                raise over_budget(reward, budget_s, len(trials), number, data) from None
            raise
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
        return trial

    for number, row in enumerate(rows, start=1):
        if replies is not None:
            for text in replies:
                score(row, number, Reply("given", text))
            continue
        for right, wrong in reply_pairs(ground_truth(row)):
            if score(row, number, right).score > score(row, number, wrong).score:
                break
    return trials


def over_budget(reward: RewardFunction, budget_s: float, done: int, number: int, data: str) -> STAPOConfigError:
    return STAPOConfigError(
        f"{KEY}: {reward.name}'s calls took more than {BUDGET_KEY}={budget_s:g} s ({done} call(s) returned, the next "
        f"on row {number} of {data}): every training step waits on thousands of such calls; make the reward faster "
        f"or raise {BUDGET_KEY}"
    )


def separating_pairs(trials: list[Trial]) -> list[tuple[Trial, Trial]]:
    """The (right, wrong) pairs of a row and format in which the row's own answer scored higher."""
    rights = {(t.row_number, t.reply.form): t for t in trials if t.reply.right}
    pairs = [(rights.get((t.row_number, t.reply.form)), t) for t in trials if t.reply.right is False]
    return [(right, wrong) for right, wrong in pairs if right is not None and right.score > wrong.score]


def trial_notes(reward: RewardFunction, trials: list[Trial], data: str) -> list[str]:
    """The check's note: the scores of the right and the wrong answers, the format that told them apart and the
    time a call takes; with a warning when no row's own answer scored above a wrong one."""
    rows = len({t.row_number for t in trials})
    mean_ms = 1000.0 * sum(t.seconds for t in trials) / len(trials)
    timing = f"{mean_ms:.2f} ms a call ({len(trials)} calls)"
    pairs = separating_pairs(trials)
    if all(t.reply.right is None for t in trials):  # replies given by hand: nothing to compare
        return [f"reward: {reward.label} tried on {rows} row(s) of {data}; {timing}"]
    if pairs:
        right = sorted({r.score for r, _ in pairs})
        wrong = sorted({w.score for _, w in pairs})
        forms = sorted({r.reply.form for r, _ in pairs}, key=[f for f, _ in REPLY_FORMATS].index)
        return [f"reward: {reward.label} tried on {rows} row(s) of {data}: the row's own answer scores {right}, a "
                f"wrong one {wrong} (written {' / '.join(forms)}); {timing}"]
    tried = ", ".join(f"{one_line(repr(t.reply.text), 30)}={t.score:g}" for t in trials[:6])
    return [f"reward: {reward.label} tried on {rows} row(s) of {data}; {timing}",
            (f"reward: warning: {reward.name} never scored a row's own answer above a wrong one ({tried}); check "
             f"that it reads the answer as your model writes it (`stapo reward test {reward.path} --data {data}` "
             "shows each call)")]


def training_file(config) -> tuple[Path | None, str]:
    """The first local training file to read rows from, or None and why not."""
    files = OmegaConf.select(config, "data.train_files", default=None)
    files = [files] if isinstance(files, str) else list(files or [])
    if not files:
        return None, "data.train_files is unset"
    first = str(files[0])
    if "://" in first:
        return None, f"{first} is remote"
    file = Path(first).expanduser()
    if not file.is_file():
        return None, f"{first} does not exist yet (the recipe writes it at launch)"
    if file.suffix not in (".parquet", ".jsonl", ".json"):
        return None, f"{first} is not a format read here"
    return file, ""


# --------------------------------------------------------------------------- verl's default_compute_score


def default_sources() -> tuple[set[str], tuple[str, ...]] | None:
    """The ``data_source`` values (and prefixes) verl's ``default_compute_score`` scores, read from its source
    (``data_source == "x"``, ``data_source in [...]``, ``data_source.startswith("x")``); None when unreadable."""
    from verl.utils.reward_score import default_compute_score

    try:
        tree = ast.parse(inspect.getsource(default_compute_score).lstrip())
    except (OSError, TypeError, SyntaxError):
        return None
    names: set[str] = set()
    prefixes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "data_source":
            for op, right in zip(node.ops, node.comparators):
                values = right.elts if isinstance(op, ast.In) and isinstance(right, (ast.List, ast.Tuple, ast.Set)) \
                    else [right] if isinstance(op, ast.Eq) else []
                names |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "data_source"):
            prefixes += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return (names, tuple(prefixes)) if names else None


def file_sources(file: Path) -> set[str]:
    """The ``data_source`` values of a data file (a parquet's whole column; a JSON file's first 10,000 rows)."""
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        if "data_source" not in pq.ParquetFile(file).schema_arrow.names:
            return set()
        return {str(v) for v in pq.read_table(file, columns=["data_source"]).column(0).unique().to_pylist()}
    return {str(row.get("data_source")) for row in read_rows(file, 10_000)}


def check_default_sources(config) -> list[str]:
    """Without a custom reward, every data file's ``data_source`` values are ones ``default_compute_score`` knows
    (it raises ``NotImplementedError`` in the reward worker on any other)."""
    known = default_sources()
    if known is None:
        return ["reward: verl's default_compute_score; could not read which data_source values it knows: not checked"]
    names, prefixes = known
    seen: set[str] = set()
    for key in ("data.train_files", "data.val_files"):
        files = OmegaConf.select(config, key, default=None)
        for path in [files] if isinstance(files, str) else list(files or []):
            file = Path(str(path)).expanduser()
            if "://" in str(path) or not file.is_file() or file.suffix not in (".parquet", ".jsonl", ".json"):
                continue
            sources = file_sources(file)
            unknown = sorted(s for s in sources if s not in names and not s.startswith(prefixes))
            if unknown:
                raise STAPOConfigError(
                    f"{key}={path}: data_source {unknown} is not one verl's default_compute_score scores ({KEY}.path "
                    f"is unset); give your reward with {KEY}.path=/abs/file.py, or one of {sorted(names)}"
                    f"{did_you_mean(unknown[0], names)}"
                )
            seen |= sources
    if not seen:
        return ["reward: verl's default_compute_score; no local data file to read data_source from"]
    return [f"reward: verl's default_compute_score, which scores the data's data_source {sorted(seen)}"]
