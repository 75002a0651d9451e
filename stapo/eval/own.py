"""`stapo eval MODEL --test-file FILE`: a user's own test file, scored by the user's reward as training scores it.

The file is in verl's row format, as ``stapo data prepare custom --split test`` writes it (``prompt``,
``data_source``, ``reward_model.ground_truth``, ``extra_info``). The reward is loaded by verl's own
``get_custom_reward_fn`` from ``--reward-file`` / ``--reward-name`` (verl's
``reward.custom_reward_function.path`` / ``.name``) and called with the keywords verl's reward manager passes
(``data_source``, ``solution_str``, ``ground_truth``, ``extra_info`` with ``num_turns`` and
``rollout_reward_scores`` added); without a reward file it is verl's ``default_compute_score``, chosen by each
row's ``data_source``, as a training run without one scores (recipe/stapo/examples/README.md, "The reward
function"). Generation, decoding settings and the sample-count check are the paper protocol's (core.py).

Per data source and decoding setting it reports the mean score over all samples, and, with a sample *solved*
when its ``acc`` is 1 (the reward dict's ``acc``, else the score itself, as verl's reward manager logs ``acc``):
avg@n (the mean over prompts of the solved fraction: the paper's metric, where its +1/-1 reward has acc 1
exactly for a right answer) and pass@n (the prompts with at least one solved sample), each with a 95%
percentile bootstrap interval over prompts. ``score > 0`` would count a reward's partial or format credit
(``my_reward.py``'s ``format_score``) as solved.

Every refusal (file, columns, rows, reward file, function, signature, a reward that raises on a row) is one
line, raised before the model loads: the reward is called on the first row of each data source first.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stapo.algorithm.validation import STAPOConfigError, did_you_mean
from stapo.eval.core import DECODING, Generate, Problem, generate_checked, problems_of

# the columns verl's loader and reward manager read (stapo.input_checks words them the same for stapo check)
COLUMNS = {"prompt": "data.prompt_key", "data_source": "data.reward_fn_key",
           "reward_model": "reward_model.ground_truth"}
DEFAULT_N = 4  # samples per prompt without --n: the paper's N for its larger benchmarks (core.PAPER_N)
DEFAULT_REWARD_NAME = "compute_score"  # verl's reward.custom_reward_function.name default
PREPARE = "`stapo data prepare custom --input FILE --question-field F --answer-field F --split test --out DIR`"
# what verl's single-turn agent loop records for a prompt and its one response (experimental/agent_loop)
NUM_TURNS = 2


@dataclass(frozen=True)
class Reward:
    """A reward as verl's reward manager holds it (``fn``), and what to call it in messages and run.json."""

    fn: Callable
    label: str  # "--reward-file=... --reward-name=..." or verl's default
    path: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Scored:
    score: float
    acc: float
    extra: dict


# ---------------------------------------------------------------- the test file


def load_test_file(path: str, limit: int | None = None) -> list[Problem]:
    """The rows of a prepared test file, each checked for what the reward and the chat template read."""
    from stapo.input_checks import check_data_file

    key = "--test-file"
    check_data_file(key, path, COLUMNS, set())  # exists, a format verl reads, the columns (parquet, first JSON row)
    file = Path(path).expanduser()
    try:
        rows = _read_rows(file, f"{key}={path}")
    except STAPOConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - unreadable in any way: one line
        raise STAPOConfigError(f"{key}={path}: not readable as {file.suffix} ({type(error).__name__}: "
                               f"{str(error)[:200]})") from None
    if not rows:
        raise STAPOConfigError(f"{key}={path}: has no rows")
    for number, row in enumerate(rows[:limit] if limit else rows, 1):
        _check_row(key, path, number, row)
    return problems_of(file.stem, rows, limit, as_text=False)


def _read_rows(file: Path, where: str) -> list[dict]:
    if file.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(file).to_dict("records")
    text = file.read_text(encoding="utf-8")
    if file.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise STAPOConfigError(f"{where}: line {number} is not JSON ({error.msg})") from None
        return rows
    data = json.loads(text)
    return data if isinstance(data, list) else [data]


def _check_row(key: str, path: str, number: int, row: Any) -> None:
    """``number``: the row's place in the file, from 1."""
    where = f"{key}={path}: row {number}"
    if not isinstance(row, dict):
        raise STAPOConfigError(f"{where} is a {type(row).__name__}, not an object; {PREPARE} writes verl's rows")
    missing = [f"{column} ({why})" for column, why in COLUMNS.items() if row.get(column) is None]
    if missing:
        raise STAPOConfigError(f"{where} lacks {missing} (has {sorted(row)}); {PREPARE} writes verl's rows")
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise STAPOConfigError(f"{where}: reward_model has no ground_truth (the reward reads it); {PREPARE}")
    prompt = row["prompt"]
    prompt = prompt.tolist() if hasattr(prompt, "tolist") else prompt
    if not (isinstance(prompt, list) and prompt
            and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in prompt)):
        raise STAPOConfigError(f"{where}: prompt is not a list of chat messages (role, content); {PREPARE}")
    if not isinstance(row["data_source"], str) or not row["data_source"]:
        raise STAPOConfigError(f"{where}: data_source must be a non-empty string, got {row['data_source']!r}")


# ---------------------------------------------------------------- the reward


def load_reward(reward_file: str | None, reward_name: str | None, reward_kwargs: dict | None = None) -> Reward:
    """The user's function through verl's own loader, or verl's default; refused in one line if it cannot be.
    ``reward_kwargs`` are verl's ``reward.custom_reward_function.reward_kwargs``: keywords added to every call."""
    from verl.trainer.ppo.reward import get_custom_reward_fn, get_default_compute_score

    if reward_file is None:
        if reward_name is not None:
            raise STAPOConfigError(f"--reward-name={reward_name}: needs --reward-file (the file that defines it)")
        if reward_kwargs:
            raise STAPOConfigError("--reward-kwargs: needs --reward-file (verl passes them to a custom reward only)")
        return Reward(get_default_compute_score(None), "verl's default_compute_score (by data_source)")
    name = reward_name or DEFAULT_REWARD_NAME
    path = reward_file
    if not reward_file.startswith("pkg://"):
        file = Path(reward_file.removeprefix("file://")).expanduser()
        if not file.is_file():
            what = "is a folder, not a file" if file.is_dir() else "no such file"
            raise STAPOConfigError(f"--reward-file={reward_file}: {what} (a .py file, or pkg://module.name)")
        if file.suffix != ".py":
            raise STAPOConfigError(f"--reward-file={reward_file}: must be a .py file (or pkg://module.name)")
        path = str(file.resolve())  # verl's reward workers need an absolute path; here it is the same file
    label = f"--reward-file={reward_file} --reward-name={name}"
    from omegaconf import OmegaConf

    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": path, "name": name,
                                                                     "reward_kwargs": dict(reward_kwargs or {})}}})
    try:
        fn = get_custom_reward_fn(config)
    except AttributeError:
        known = _functions_of(path)
        raise STAPOConfigError(
            f"--reward-name={name}: {reward_file} defines no {name!r} (it defines {known}){did_you_mean(name, known)}"
        ) from None
    except Exception as error:  # noqa: BLE001 - a syntax error, a failing import, a missing module: one line
        raise STAPOConfigError(f"--reward-file={reward_file}: cannot be imported: {_reason(error, path)}") from None
    raw = fn.args[0]  # verl's partial(_call_with_kwargs, raw_fn, reward_kwargs)
    if not callable(raw):
        raise STAPOConfigError(f"--reward-name={name}: {reward_file} defines {name} as a {type(raw).__name__}, "
                               "not a function")
    _check_signature(raw, label, dict(reward_kwargs or {}))
    return Reward(fn, label, path, name)


def _functions_of(path: str) -> list[str]:
    """The top-level functions of a reward file (read, not run again) or a module."""
    if path.startswith("pkg://"):
        import importlib

        module = importlib.import_module(path[len("pkg://"):].replace("/", "."))
        return sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def _reason(error: BaseException, path: str) -> str:
    """The root cause of an import failure, with the file and line where it happened."""
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, SyntaxError):
        return f"SyntaxError at {cause.filename}:{cause.lineno}: {cause.msg}"
    return f"{type(cause).__name__}{_where(cause, path)}: {' '.join(str(cause).split())[:300]}"


def _where(error: BaseException, path: str | None) -> str:
    """`` at FILE:LINE`` of the innermost frame in the reward's file (else the innermost of all)."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if path and Path(f.filename).resolve() == Path(path).resolve()]
    frame = (own or frames or [None])[-1]
    return f" at {frame.filename}:{frame.lineno}" if frame else ""


def _check_signature(raw: Callable, label: str, reward_kwargs: dict) -> None:
    """verl calls the function with four keywords and the reward kwargs; a function that cannot take them fails
    in every call."""
    try:
        signature = inspect.signature(raw)
    except (TypeError, ValueError):
        return  # a builtin without a signature: the call on the first rows decides
    try:
        signature.bind(data_source="", solution_str="", ground_truth="", extra_info={}, **reward_kwargs)
    except TypeError as error:
        raise STAPOConfigError(
            f"{label}: {getattr(raw, '__name__', raw)}{signature} cannot be called as verl calls it, with keywords "
            f"data_source, solution_str, ground_truth, extra_info{''.join(', ' + k for k in reward_kwargs)} ({error})"
        ) from None


def call_reward(reward: Reward, problem: Problem, text: str) -> Scored:
    """One response scored as verl's naive reward manager scores it (its ``run_single``): the same keywords, the
    row's ``extra_info`` with ``num_turns`` and ``rollout_reward_scores`` added, ``acc`` as it logs it."""
    extra_info = dict(problem.extra_info or {})
    extra_info.update(num_turns=NUM_TURNS, rollout_reward_scores={})
    result = reward.fn(data_source=problem.data_source, solution_str=text, ground_truth=problem.ground_truth,
                       extra_info=extra_info)
    if inspect.isawaitable(result):
        result = asyncio.run(result)
    if isinstance(result, dict):
        if "score" not in result:
            raise STAPOConfigError(f"{reward.label}: returned a dict without 'score' ({sorted(result)})")
        score = _number(result["score"], reward, "its 'score'")
        acc = _number(result["acc"], reward, "its 'acc'") if "acc" in result else score
        extra = {k: v for k, v in result.items() if k not in ("score", "acc") and _jsonable(v)}
        return Scored(score, acc, extra)
    score = _number(result, reward, "it")
    return Scored(score, score, {})


def _number(value: Any, reward: Reward, what: str) -> float:
    real = isinstance(value, bool | int | float | np.number | np.bool_)
    if real and not isinstance(value, complex | np.complexfloating):
        number = float(value)
        if math.isfinite(number):
            return number
    raise STAPOConfigError(f"{reward.label}: {what} returned {value!r}, not a finite number (a float, or a dict "
                           "whose 'score' is one)")


def _jsonable(value: Any) -> bool:
    return isinstance(value, bool | int | float | str) or value is None


def check_reward_on_rows(reward: Reward, problems: list[Problem], test_file: str) -> None:
    """Before the model loads: the reward on the first row of each data source, with the row's own answer and
    with an empty response; a failure here would otherwise come after all the generation."""
    first: dict[str, Problem] = {}
    for problem in problems:
        first.setdefault(problem.data_source, problem)
    for source, problem in first.items():
        for response in (str(problem.ground_truth), ""):
            try:
                call_reward(reward, problem, response)
            except STAPOConfigError:
                raise
            except NotImplementedError as error:
                if reward.path is None:  # verl's default knows a fixed set of data sources
                    raise STAPOConfigError(
                        f"--test-file={test_file}: data_source {source!r} (row {problem.prompt_id + 1}) has no reward "
                        "in verl's default_compute_score; give yours with --reward-file FILE --reward-name FN "
                        "(recipe/stapo/examples/my_reward.py), or --reward-file pkg://stapo.reward (the paper's)"
                    ) from None
                raise STAPOConfigError(_raised(reward, error, problem, test_file)) from None
            except Exception as error:  # noqa: BLE001 - the user's code: any error, one line
                raise STAPOConfigError(_raised(reward, error, problem, test_file)) from None


def _raised(reward: Reward, error: BaseException, problem: Problem, test_file: str) -> str:
    path = reward.path if reward.path and not reward.path.startswith("pkg://") else None
    message = " ".join(str(error).split())[:300]
    where = _where(error, path)
    return (f"{reward.label}: raised {type(error).__name__}{where}: {message} (row {problem.prompt_id + 1} of "
            f"{test_file}, data_source {problem.data_source!r})")


# ---------------------------------------------------------------- metrics


def prompt_bootstrap_ci(values: list[float], n_bootstrap: int = 1000, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of per-prompt values, prompts drawn with replacement."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("an interval over no prompt is undefined")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(n_bootstrap, data.size))].mean(axis=1)
    tail = (1.0 - level) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def summarize(per_prompt: dict[Any, list[Scored]], seed: int = 0) -> dict[str, Any]:
    """Mean score, avg@n and pass@n (percent, with 95% bootstrap intervals over prompts) of one group."""
    if not per_prompt:
        raise ValueError("no prompt to summarize")
    n = max(len(samples) for samples in per_prompt.values())
    solved = [[s.acc == 1.0 for s in samples] for samples in per_prompt.values()]
    fractions = [100.0 * sum(flags) / len(flags) for flags in solved]
    passed = [100.0 * any(flags) for flags in solved]
    scores = [s.score for samples in per_prompt.values() for s in samples]
    return {
        "prompts": len(per_prompt), "n": n, "samples": len(scores), "mean_score": sum(scores) / len(scores),
        f"avg@{n}": sum(fractions) / len(fractions), f"avg@{n}_ci95": prompt_bootstrap_ci(fractions, seed=seed),
        f"pass@{n}": sum(passed) / len(passed), f"pass@{n}_ci95": prompt_bootstrap_ci(passed, seed=seed),
    }


# ---------------------------------------------------------------- the run


def evaluate_file(
    generate: Generate,
    problems: list[Problem],
    reward: Reward,
    out_dir: Path,
    settings: tuple[str, ...] = tuple(DECODING),
    n: int = DEFAULT_N,
    max_tokens: int = 1024,
    seed: int = 0,
    run: dict | None = None,
) -> dict[str, dict[str, dict]]:
    """Every setting over the file: samples.jsonl (each response, its score and acc), results.json / .csv / .md
    (per data source and setting; an ``all`` row when there are several sources), run.json (what was run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    run_file = str((run or {}).get("test_file", "the test file"))
    sources = list(dict.fromkeys(p.data_source for p in problems))
    info = {**(run or {}), "reward": reward.label, "reward_path": reward.path, "reward_name": reward.name,
            "settings": {s: DECODING[s] for s in settings}, "n": n, "max_tokens": max_tokens, "seed": seed,
            "prompts": len(problems), "data_sources": sources, "solved": "acc == 1"}
    (out_dir / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    results: dict[str, dict[str, dict]] = {}
    with (out_dir / "samples.jsonl").open("w", encoding="utf-8") as samples_file:
        for setting in settings:
            texts = generate_checked(generate, problems, n, setting, max_tokens, seed, "--test-file")
            groups: dict[str, dict[int, list[Scored]]] = {}
            for problem, samples in zip(problems, texts):
                for index, text in enumerate(samples):
                    try:
                        scored = call_reward(reward, problem, text)
                    except STAPOConfigError:
                        raise
                    except Exception as error:  # noqa: BLE001 - the user's code on a generated response
                        raise STAPOConfigError(_raised(reward, error, problem, run_file)) from None
                    groups.setdefault(problem.data_source, {}).setdefault(problem.prompt_id, []).append(scored)
                    record = {"data_source": problem.data_source, "setting": setting, "prompt_id": problem.prompt_id,
                              "sample": index, "text": text, "ground_truth": _plain(problem.ground_truth),
                              "score": scored.score, "acc": scored.acc, **({"extra": scored.extra} if scored.extra
                                                                           else {})}
                    samples_file.write(json.dumps(record) + "\n")
            samples_file.flush()
            for source in sources:
                results.setdefault(source, {})[setting] = summarize(groups[source], seed)
            if len(sources) > 1:
                pooled = {(s, pid): v for s, by_prompt in groups.items() for pid, v in by_prompt.items()}
                results.setdefault("all", {})[setting] = summarize(pooled, seed)
            for source in results:
                row = results[source][setting]
                print(f"[eval] {source} {setting}: mean score {row['mean_score']:.4f}, avg@{n} {row[f'avg@{n}']:.2f}, "
                      f"pass@{n} {row[f'pass@{n}']:.2f} ({row['prompts']} prompts)", flush=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    write_file_tables(results, settings, n, out_dir)
    return results


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def write_file_tables(results: dict[str, dict[str, dict]], settings: tuple[str, ...], n: int, out_dir: Path) -> None:
    """results.md and results.csv: one row per data source and decoding setting."""
    import csv

    header = ["data_source", "setting", "prompts", "n", "mean_score", f"avg@{n}", "ci95_low", "ci95_high",
              f"pass@{n}", "ci95_low", "ci95_high"]
    rows = []
    for source, by_setting in results.items():
        for setting in settings:
            r = by_setting[setting]
            rows.append([source, setting, r["prompts"], n, r["mean_score"], r[f"avg@{n}"], *r[f"avg@{n}_ci95"],
                         r[f"pass@{n}"], *r[f"pass@{n}_ci95"]])
    with (out_dir / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows([[*row[:4], *(f"{v:.4f}" for v in row[4:])] for row in rows])
    lines = [f"| data_source | decoding | prompts | mean score | avg@{n} (95% CI) | pass@{n} (95% CI) |",
             "|---|---|---|---|---|---|"]
    for source, setting, prompts, _, mean, avg, a_lo, a_hi, pas, p_lo, p_hi in rows:
        decoding = f"{setting} (T={DECODING[setting]['temperature']}, top-p={DECODING[setting]['top_p']})"
        lines.append(f"| {source} | {decoding} | {prompts} | {mean:.4f} | {avg:.2f} ({a_lo:.2f}-{a_hi:.2f}) | "
                     f"{pas:.2f} ({p_lo:.2f}-{p_hi:.2f}) |")
    lines += ["", (f"solved: the reward's acc == 1 (its dict's 'acc', else its score); avg@{n}: mean solved fraction "
                   f"per prompt; pass@{n}: prompts with a solved sample; CI: bootstrap over prompts.")]
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")
