"""The paper's evaluation protocol: avg@N per benchmark, two decoding settings.

avg@N = mean over prompts of the fraction of its N samples the reward accepts, in percent.
Generation is a pluggable back-end (vLLM on GPUs, HF ``generate`` on CPU); scoring is the same
``stapo.reward.compute_score`` the training uses, so every number can be audited per sample.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stapo.reward import checker_name, compute_score, last_boxed

PAPER_N = {"aime24": 32, "aime25": 32, "amc23": 32, "math500": 4, "minerva": 4, "olympiadbench": 4}
DECODING = {"T1.0": {"temperature": 1.0, "top_p": 1.0}, "T0.7": {"temperature": 0.7, "top_p": 0.9}}
MAX_TOKENS = 20_480

# generate(prompts as chat messages, n, temperature, top_p, max_tokens, seed) -> n texts per prompt
Generate = Callable[[list[list[dict]], int, float, float, int, int], list[list[str]]]


@dataclass(frozen=True)
class Problem:
    benchmark: str
    prompt_id: int
    messages: list[dict]
    ground_truth: Any  # a string for the paper's benchmarks; a user's file may hold a list or a number
    data_source: str
    extra_info: dict | None = None  # the row's extra_info, passed to a user's reward as verl passes it


def avg_at_n(scores: dict[int, list[float]]) -> float:
    """Mean over prompts of each prompt's mean score (1 = correct, 0 = not), in percent."""
    if not scores:
        raise ValueError("avg@N of no prompt is undefined")
    return 100.0 * sum(sum(s) / len(s) for s in scores.values()) / len(scores)


def load_benchmark(name: str, path: Path, limit: int | None = None) -> list[Problem]:
    import pandas as pd

    return problems_of(name, pd.read_parquet(path).to_dict("records"), limit)


def problems_of(name: str, rows: list[dict], limit: int | None = None, as_text: bool = True) -> list[Problem]:
    """Rows in verl's row format (prompt, reward_model.ground_truth, data_source, extra_info) as problems;
    ``as_text=False`` keeps the ground truth as the row holds it (verl passes it to a reward unconverted)."""
    problems = []
    for index, row in enumerate(rows):
        if limit is not None and index >= limit:
            break
        prompt = row["prompt"]
        messages = [dict(m) for m in (prompt.tolist() if hasattr(prompt, "tolist") else prompt)]
        extra = row.get("extra_info")
        extra = dict(extra) if isinstance(extra, dict) else None
        truth = row["reward_model"]["ground_truth"]
        problems.append(Problem(name, index, messages, str(truth) if as_text else truth, row["data_source"], extra))
    return problems


def generate_checked(generate: Generate, problems: list[Problem], n: int, setting: str, max_tokens: int,
                     seed: int, label: str) -> list[list[str]]:
    """``n`` texts per problem at a decoding setting; a back-end that returns another count is an error,
    as every avg@n and pass@n computed from it would be wrong."""
    params = DECODING[setting]
    texts = generate([p.messages for p in problems], n, params["temperature"], params["top_p"], max_tokens, seed)
    counts = [len(samples) for samples in texts]
    if len(texts) != len(problems) or any(c != n for c in counts):
        raise RuntimeError(
            f"{label} {setting}: the back-end returned {counts[:8]}... samples for {len(problems)} prompts, "
            f"expected {n} each; avg@{n} would be wrong"
        )
    return texts


def evaluate(
    generate: Generate,
    benchmarks: dict[str, Path],
    out_dir: Path,
    settings: tuple[str, ...] = tuple(DECODING),
    n_override: int | None = None,
    max_tokens: int = MAX_TOKENS,
    limit: int | None = None,
    seed: int = 0,
    math_verify: bool = False,
) -> dict[str, dict[str, float]]:
    """Run every benchmark under every setting; write samples.jsonl, results.md and results.csv."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    n_used: dict[str, int] = {}
    run = {
        "benchmarks": {name: str(path) for name, path in benchmarks.items()},
        "settings": {s: DECODING[s] for s in settings}, "n": {b: n_override or PAPER_N.get(b, 4) for b in benchmarks},
        "max_tokens": max_tokens, "limit": limit, "seed": seed, "math_verify": math_verify,
    }
    (out_dir / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    with (out_dir / "samples.jsonl").open("w", encoding="utf-8") as samples_file:
        for name, path in benchmarks.items():
            problems = load_benchmark(name, path, limit)
            n = n_override or PAPER_N.get(name, 4)
            for setting in settings:
                texts = generate_checked(generate, problems, n, setting, max_tokens, seed, name)
                scores: dict[int, list[float]] = {}
                for problem, samples in zip(problems, texts):
                    for sample_index, text in enumerate(samples):
                        scored = compute_score(problem.data_source, text, problem.ground_truth, math_verify=math_verify)
                        scores.setdefault(problem.prompt_id, []).append(scored["acc"])
                        checker = checker_name(scored)
                        record = {
                            "benchmark": name, "setting": setting, "prompt_id": problem.prompt_id,
                            "sample": sample_index, "text": text, "extracted": last_boxed(text),
                            "ground_truth": problem.ground_truth, "score": scored["score"], "checker": checker,
                        }
                        samples_file.write(json.dumps(record) + "\n")  # ASCII: no raw U+2028 to split lines
                samples_file.flush()
                results.setdefault(name, {})[setting] = avg_at_n(scores)
                n_used[name] = n
                print(f"[eval] {name} {setting} avg@{n}: {results[name][setting]:.2f}", flush=True)
    write_tables(results, settings, out_dir, n_used)
    return results


def write_tables(
    results: dict[str, dict[str, float]], settings: tuple[str, ...], out_dir: Path, n_used: dict[str, int] | None = None
) -> None:
    """The paper's layout: one row per benchmark plus the (unweighted) average of the benchmarks,
    one column per decoding setting; the N of avg@N in its own column."""
    n_used = n_used or {}
    average = {s: sum(r[s] for r in results.values()) / len(results) for s in settings}
    rows = [(name, str(n_used.get(name, "")), [results[name][s] for s in settings]) for name in results]
    rows.append(("Average", "", [average[s] for s in settings]))
    headers = [f"{s} (T={DECODING[s]['temperature']}, top-p={DECODING[s]['top_p']})" for s in settings]
    lines = ["| benchmark | avg@N | " + " | ".join(headers) + " |", "|---" * (len(settings) + 2) + "|"]
    lines += [f"| {name} | {n} | " + " | ".join(f"{v:.2f}" for v in values) + " |" for name, n, values in rows]
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")
    with (out_dir / "results.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["benchmark", "n", *settings])
        writer.writerows([[name, n, *[f"{v:.4f}" for v in values]] for name, n, values in rows])
