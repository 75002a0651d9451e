"""`stapo eval MODEL --test-file FILE --reward-file R --reward-name FN`: a user's own test set and reward.

The example task (recipe/stapo/examples/my_task.jsonl) is prepared into verl's rows by `stapo data prepare
custom`, as a user would; the example reward (my_reward.py) is loaded for the check by importlib here, not by
verl's loader that the command uses. The checks:

- the tiny local model (stapo://tiny, built on this machine, no download) generates; every sample's score is the
  reward called directly on its text, and the table is recomputed from those direct calls (mean score, avg@n
  with solved = acc == 1, pass@n), also with a reward whose scores vary on the model's text;
- hand-written responses give hand-computed tables (format credit is not solved; a float reward's acc is its
  score; an async reward; verl's default_compute_score by data_source; several data sources and an `all` row);
- the bootstrap interval against the normal approximation and on constant data;
- each refusal is one line on stderr with exit code 2 before the model loads;
- the README's command runs as written (with the tiny model for the checkpoint).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import random
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from stapo.cli import main as stapo_main
from stapo.eval import cli as eval_cli
from stapo.eval.own import (
    Scored,
    call_reward,
    evaluate_file,
    load_reward,
    load_test_file,
    prompt_bootstrap_ci,
    summarize,
)
from stapo.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "recipe" / "stapo" / "examples"
MY_REWARD = EXAMPLES / "my_reward.py"
ANSWERS = [json.loads(line)["answer"] for line in (EXAMPLES / "my_task.jsonl").read_text().splitlines()]


def prepare(out: Path, *extra: str) -> Path:
    """my_task.jsonl as a test split, through the command a user runs."""
    argv = ["data", "prepare", "custom", "--input", str(EXAMPLES / "my_task.jsonl"), "--question-field", "question",
            "--answer-field", "answer", "--template", "Solve: {question} Put the final answer in \\boxed{}.",
            "--split", "test", "--data-source", "my_task", "--out", str(out), *extra]
    assert stapo_main(argv) == 0
    return out / "test.parquet"


@pytest.fixture(scope="module")
def test_file(tmp_path_factory) -> Path:
    return prepare(tmp_path_factory.mktemp("data"))


def direct_reward(path: Path = MY_REWARD, name: str = "compute_score"):
    spec = importlib.util.spec_from_file_location(f"direct_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def table_from(samples: list[dict], n: int) -> dict[tuple[str, str], dict]:
    """mean score, avg@n, pass@n per (data_source, setting), recomputed from the samples' direct scores."""
    groups: dict[tuple[str, str], dict[int, list[tuple[float, float]]]] = {}
    for s in samples:
        groups.setdefault((s["data_source"], s["setting"]), {}).setdefault(s["prompt_id"], []).append(
            (s["direct_score"], s["direct_acc"]))
    out = {}
    for key, prompts in groups.items():
        assert all(len(v) == n for v in prompts.values())
        out[key] = {
            "prompts": len(prompts),
            "mean_score": sum(sc for v in prompts.values() for sc, _ in v) / (n * len(prompts)),
            f"avg@{n}": 100 * sum(sum(acc == 1 for _, acc in v) / n for v in prompts.values()) / len(prompts),
            f"pass@{n}": 100 * sum(any(acc == 1 for _, acc in v) for v in prompts.values()) / len(prompts),
        }
    return out


def rescore(samples: list[dict], rows: pd.DataFrame, reward) -> None:
    """Each sample's score and acc from the reward called directly, with the row's own fields."""
    for s in samples:
        row = rows.iloc[s["prompt_id"]]
        extra = {**row["extra_info"], "num_turns": 2, "rollout_reward_scores": {}}
        result = reward(data_source=row["data_source"], solution_str=s["text"],
                        ground_truth=row["reward_model"]["ground_truth"], extra_info=extra)
        s["direct_score"] = float(result["score"] if isinstance(result, dict) else result)
        s["direct_acc"] = float(result.get("acc", s["direct_score"]) if isinstance(result, dict) else result)


def assert_results_are(results_csv: Path, expected: dict[tuple[str, str], dict], n: int) -> None:
    rows = list(csv.DictReader(results_csv.open()))
    assert {(r["data_source"], r["setting"]) for r in rows} == set(expected)
    for r in rows:
        want = expected[(r["data_source"], r["setting"])]
        assert int(r["prompts"]) == want["prompts"] and int(r["n"]) == n
        for column in ("mean_score", f"avg@{n}", f"pass@{n}"):
            assert float(r[column]) == pytest.approx(want[column], abs=1e-4), column


# ---------------------------------------------------------------- the real (tiny) model


def test_cli_on_the_tiny_model_scores_each_sample_as_the_reward_does(test_file, tmp_path, capsys):
    out = tmp_path / "out"
    threads = torch.get_num_threads()  # --threads 1 sets it process-wide
    code = stapo_main(["eval", build_tiny_model(), "--test-file", str(test_file), "--reward-file", str(MY_REWARD),
                       "--reward-name", "compute_score", "--limit", "3", "--n", "2", "--max-tokens", "8",
                       "--decoding", "T1.0,T0.7", "--backend", "hf", "--threads", "1", "--out", str(out)])
    torch.set_num_threads(threads)
    assert code == 0, capsys.readouterr()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {(s["setting"], s["prompt_id"], s["sample"]) for s in samples} == {
        (setting, p, k) for setting in ("T1.0", "T0.7") for p in range(3) for k in range(2)}
    assert sum(len(s["text"]) > 0 for s in samples) >= 6  # the model does write text
    rows = pd.read_parquet(test_file)
    rescore(samples, rows, direct_reward())
    for s in samples:
        assert (s["score"], s["acc"]) == (s["direct_score"], s["direct_acc"])
        assert s["ground_truth"] == ANSWERS[s["prompt_id"]]
    assert_results_are(out / "results.csv", table_from(samples, 2), 2)
    run = json.loads((out / "run.json").read_text())
    assert run["reward_path"] == str(MY_REWARD) and run["reward_name"] == "compute_score" and run["n"] == 2
    assert "| my_task | T1.0" in capsys.readouterr().out


def test_a_reward_that_varies_on_the_models_text_is_recomputed_exactly(test_file, tmp_path):
    """my_reward scores the untrained model's text 0 throughout; this reward gives -1 / 0 / 0.5 / 1 by the text."""
    reward_file = tmp_path / "by_length.py"
    reward_file.write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    assert extra_info['split'] == 'test' and extra_info['num_turns'] == 2\n"
        "    return [-1.0, 0.0, 0.5, 1.0][len(solution_str) % 4]\n")
    from stapo.eval.backends import HFGenerator

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generate = HFGenerator(build_tiny_model(), batch_size=8)
        problems = load_test_file(str(test_file), limit=4)
        evaluate_file(generate, problems, load_reward(str(reward_file), "score"), tmp_path / "out", ("T1.0",),
                      n=4, max_tokens=12, seed=3, run={"test_file": str(test_file)})
    finally:
        torch.set_num_threads(threads)
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    rescore(samples, pd.read_parquet(test_file), direct_reward(reward_file, "score"))
    assert len({s["direct_score"] for s in samples}) >= 2  # not all alike: the comparison could fail
    assert [s["score"] for s in samples] == [s["direct_score"] for s in samples]
    assert_results_are(tmp_path / "out" / "results.csv", table_from(samples, 4), 4)


# ---------------------------------------------------------------- hand-written responses


def scripted(texts_of):
    """A back-end answering prompt i's k-th sample with texts_of(i, k, temperature)."""
    def generate(prompts, n, temperature, top_p, max_tokens, seed):
        return [[texts_of(i, k, temperature) for k in range(n)] for i in range(len(prompts))]
    return generate


def test_hand_computed_table_with_format_credit_that_is_not_solved(test_file, tmp_path):
    # my_reward's shape with format credit 0.1 (a float reward: verl's acc is the score itself, 0.1 is not solved)
    reward_file = tmp_path / "credit.py"
    reward_file.write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom my_reward import compute_score as strict\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return strict(data_source, solution_str, ground_truth, extra_info, format_score=0.1)['score']\n"
        % str(EXAMPLES))
    # prompt i: at T=1.0 sample k right when k < i % 4, else a wrong boxed answer; T=0.7 never boxed
    texts = scripted(lambda i, k, t: "no box" if t < 1 else
                     (f"so \\boxed{{{ANSWERS[i]}}}" if k < i % 4 else "\\boxed{-1}"))
    problems = load_test_file(str(test_file))
    results = evaluate_file(texts, problems, load_reward(str(reward_file), None), tmp_path / "out", n=3)
    assert list(results) == ["my_task"]
    hot, cold = results["my_task"]["T1.0"], results["my_task"]["T0.7"]
    right = [min(i % 4, 3) for i in range(8)]  # of 3 samples: 0, 1, 2, 3, 0, 1, 2, 3
    assert hot["prompts"] == 8 and hot["samples"] == 24 and hot["n"] == 3
    assert hot["avg@3"] == pytest.approx(100 * sum(r / 3 for r in right) / 8)
    assert hot["pass@3"] == pytest.approx(100 * sum(r > 0 for r in right) / 8)
    assert hot["mean_score"] == pytest.approx(sum(r * 1.0 + (3 - r) * 0.1 for r in right) / 24)
    assert cold == {**cold, "mean_score": 0.0, "avg@3": 0.0, "pass@3": 0.0}
    low, high = hot["avg@3_ci95"]
    assert low < hot["avg@3"] < high and cold["avg@3_ci95"] == (0.0, 0.0)
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "| my_task | T1.0 (T=1.0, top-p=1.0) | 8 |" in markdown and "acc == 1" in markdown


def test_reward_kwargs_reach_the_reward_as_verls_reward_kwargs_do(test_file, tmp_path):
    """my_reward.py's format_score through --reward-kwargs: a wrong boxed answer scores 0.1 and its acc stays 0."""
    texts = scripted(lambda i, k, t: f"\\boxed{{{ANSWERS[i]}}}" if k == 0 else "\\boxed{-1}")
    problems = load_test_file(str(test_file), limit=5)
    reward = load_reward(str(MY_REWARD), "compute_score", {"format_score": 0.1})
    got = evaluate_file(texts, problems, reward, tmp_path / "out", ("T1.0",), n=4)["my_task"]["T1.0"]
    assert got["mean_score"] == pytest.approx((1.0 + 3 * 0.1) / 4)
    assert got["avg@4"] == pytest.approx(25.0) and got["pass@4"] == pytest.approx(100.0)
    direct = direct_reward()
    assert direct("my_task", "\\boxed{-1}", "42", format_score=0.1) == {"score": 0.1, "acc": 0.0}


def test_two_data_sources_an_async_reward_and_the_pooled_row(test_file, tmp_path):
    rows = pd.read_parquet(test_file)
    rows["data_source"] = ["alpha" if i % 2 else "beta" for i in range(len(rows))]
    two = tmp_path / "two.jsonl"
    two.write_text("".join(json.dumps(row) + "\n" for row in json.loads(rows.to_json(orient="records"))))
    reward_file = tmp_path / "async_reward.py"
    reward_file.write_text(
        "async def judge(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    ok = solution_str == ground_truth\n"
        "    return {'score': 2.0 if ok else -1.0, 'acc': float(ok), 'source': data_source}\n")
    texts = scripted(lambda i, k, t: ANSWERS[i] if i < 4 and k == 0 else "nope")  # prompts 0-3: 1 of 2 right
    problems = load_test_file(str(two))
    results = evaluate_file(texts, problems, load_reward(str(reward_file), "judge"), tmp_path / "out",
                            ("T0.7",), n=2)
    assert set(results) == {"alpha", "beta", "all"}
    for source, ids in (("alpha", [1, 3, 5, 7]), ("beta", [0, 2, 4, 6]), ("all", range(8))):
        solved = [1 if i < 4 else 0 for i in ids]
        got = results[source]["T0.7"]
        assert got["avg@2"] == pytest.approx(100 * sum(s / 2 for s in solved) / len(solved))
        assert got["pass@2"] == pytest.approx(100 * sum(solved) / len(solved))
        assert got["mean_score"] == pytest.approx(sum(2.0 - 1.0 if s else -2.0 for s in solved) / (2 * len(solved)))
    sample = json.loads((tmp_path / "out" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["extra"] == {"source": "beta"}


def test_without_a_reward_file_verls_default_compute_score_by_data_source(tmp_path):
    from verl.utils.reward_score import default_compute_score

    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"q{i}"}],
             "reward_model": {"ground_truth": str(i)}, "extra_info": {"index": i}} for i in range(3)]
    file = tmp_path / "gsm.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    replies = ["#### 0", "#### 5", "The answer is 2"]
    texts = scripted(lambda i, k, t: replies[i])
    reward = load_reward(None, None)
    results = evaluate_file(texts, load_test_file(str(file)), reward, tmp_path / "out", ("T1.0",), n=1)
    direct = [default_compute_score("openai/gsm8k", replies[i], str(i)) for i in range(3)]
    assert direct == [1.0, 0.0, 0.0]
    assert results["openai/gsm8k"]["T1.0"]["mean_score"] == pytest.approx(sum(direct) / 3)
    assert results["openai/gsm8k"]["T1.0"]["avg@1"] == pytest.approx(100 / 3)


def test_the_reward_gets_the_keywords_verls_reward_manager_passes(test_file):
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return 1

    from stapo.eval.own import Reward

    problem = load_test_file(str(test_file), limit=1)[0]
    assert call_reward(Reward(spy, "spy"), problem, "text") == Scored(1.0, 1.0, {})
    row = pd.read_parquet(test_file).iloc[0]
    assert row["extra_info"]["split"] == "test"
    assert seen == {"data_source": "my_task", "solution_str": "text", "ground_truth": "42",
                    "extra_info": {**row["extra_info"], "num_turns": 2, "rollout_reward_scores": {}}}
    assert problem.extra_info == row["extra_info"]  # the row's own is not changed by the call


def test_the_papers_reward_by_module_path(test_file):
    """--reward-file pkg://stapo.reward: the paper's +1 / -1 reward, loaded by module as the presets name it."""
    from stapo.reward import compute_score

    reward = load_reward("pkg://stapo.reward", None)
    problem = load_test_file(str(test_file), limit=1)[0]
    for text in ("so \\boxed{42}", "\\boxed{41}", "42"):
        expected, got = compute_score("my_task", text, "42"), call_reward(reward, problem, text)
        assert (got.score, got.acc) == (expected["score"], expected["acc"])
    assert call_reward(reward, problem, "\\boxed{42}").score == 1.0
    with pytest.raises(Exception, match="cannot be imported: ModuleNotFoundError"):
        load_reward("pkg://stapo.no_such_reward", None)


# ---------------------------------------------------------------- metrics


@pytest.mark.parametrize("seed", range(3))
def test_bootstrap_interval_is_the_normal_one_on_many_prompts(seed):
    rng = random.Random(seed)
    values = [100.0 * (rng.random() < 0.3) for _ in range(400)]
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    low, high = prompt_bootstrap_ci(values, n_bootstrap=4000, seed=seed)
    half = 1.959964 * sd / math.sqrt(len(values))
    assert low == pytest.approx(mean - half, abs=0.2 * half) and high == pytest.approx(mean + half, abs=0.2 * half)
    assert prompt_bootstrap_ci([50.0] * 7) == (50.0, 50.0)
    assert prompt_bootstrap_ci(values, seed=seed) == prompt_bootstrap_ci(values, seed=seed)
    with pytest.raises(ValueError):
        prompt_bootstrap_ci([])


def test_summarize_by_hand_with_random_scores():
    rng = np.random.default_rng(0)
    per_prompt = {p: [Scored(float(s), float(a), {}) for s, a in zip(rng.normal(size=5), rng.random(5) < 0.4)]
                  for p in range(6)}
    got = summarize(per_prompt)
    flags = [[s.acc == 1 for s in v] for v in per_prompt.values()]
    assert got["avg@5"] == pytest.approx(100 * np.mean([np.mean(f) for f in flags]))
    assert got["pass@5"] == pytest.approx(100 * np.mean([any(f) for f in flags]))
    assert got["mean_score"] == pytest.approx(np.mean([s.score for v in per_prompt.values() for s in v]))


# ---------------------------------------------------------------- refusals


def refusal(capsys, argv: list[str]) -> str:
    assert stapo_main(["eval", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("stapo: ") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err and not captured.out.strip(), captured
    return captured.err


def test_refusals_are_one_line_before_the_model_loads(test_file, tmp_path, capsys, monkeypatch):
    def no_model(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(eval_cli, "_generator", no_model)
    model = build_tiny_model()
    bad = {
        "syntax.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return (\n",
        "signature.py": "def compute_score(response, answer):\n    return 0.0\n",
        "raises.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                     "    return 1 / 0\n",
        "text.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 'yes'\n",
        "imports.py": "import no_such_module_here\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "empty.jsonl").write_text("")
    good = json.loads(pd.read_parquet(test_file).head(1).to_json(orient="records"))[0]
    (tmp_path / "bad_line.jsonl").write_text(json.dumps(good) + "\n\n{not json\n")
    first_row_ok = pd.read_parquet(test_file).head(2)
    first_row_ok.at[1, "reward_model"] = {"style": "rule"}
    broken_row = tmp_path / "broken.jsonl"
    broken_row.write_text("".join(json.dumps(r) + "\n" for r in json.loads(first_row_ok.to_json(orient="records"))))
    base = [model, "--test-file", str(test_file)]
    with_reward = [*base, "--reward-file", str(MY_REWARD)]
    cases = [
        ([model, "--test-file", str(tmp_path / "nope.parquet")], "no such file", "stapo data prepare custom"),
        ([model, "--test-file", str(EXAMPLES / "my_task.jsonl")], "lacks column(s)", "stapo data prepare custom"),
        ([model, "--test-file", str(tmp_path / "empty.jsonl")], "has no rows", ""),
        ([model, "--test-file", str(broken_row), "--reward-file", str(MY_REWARD)],
         "row 2: reward_model has no ground_truth", "stapo data prepare custom"),
        ([*base, "--reward-file", str(tmp_path / "missing.py")], "missing.py: no such file", ""),
        ([*base, "--reward-file", str(tmp_path)], "is a folder", ""),
        ([*base, "--reward-file", str(tmp_path / "syntax.py")], "SyntaxError at ", "syntax.py:2"),
        ([*base, "--reward-file", str(tmp_path / "imports.py")], "ModuleNotFoundError at ", "imports.py:1"),
        ([*with_reward, "--reward-name", "compute_scor"], "defines no 'compute_scor' (it defines ['compute_score'])",
         "did you mean"),
        ([*base, "--reward-file", str(tmp_path / "signature.py")], "cannot be called as verl calls it", "response"),
        ([*base, "--reward-file", str(tmp_path / "raises.py")], "raised ZeroDivisionError at ",
         "raises.py:2: division by zero (row 1 of"),
        ([model, "--test-file", str(tmp_path / "bad_line.jsonl")], "bad_line.jsonl: line 3 is not JSON", ""),
        ([*base, "--reward-file", str(tmp_path / "text.py")], "returned 'yes', not a finite number", ""),
        (base, "data_source 'my_task' (row 1) has no reward in verl's default_compute_score", "--reward-file"),
        ([*base, "--reward-name", "compute_score"], "--reward-name=compute_score: needs --reward-file", ""),
        ([model, "--reward-file", str(MY_REWARD)], "--reward-file=", "scores --test-file"),
        ([*with_reward, "--benchmarks", "aime24"], "--benchmarks=aime24:", "not with --test-file"),
        ([*with_reward, "--math-verify"], "--math-verify: the paper's benchmarks only", ""),
        ([*with_reward, "--n", "0"], "--n=0: must be >= 1", ""),
        ([*with_reward, "--reward-kwargs", "format_score=0.1"], "--reward-kwargs=format_score=0.1: not JSON", ""),
        ([*with_reward, "--reward-kwargs", "[1]"], "must be a JSON object of keywords, got a list", ""),
        ([*base, "--reward-kwargs", '{"a": 1}'], "--reward-kwargs: needs --reward-file", ""),
        ([*base, "--reward-file", str(tmp_path / "raises.py"), "--reward-kwargs", '{"scale": 2}'],
         "cannot be called as verl calls it", "extra_info, scale"),
    ]
    for argv, first, second in cases:
        err = refusal(capsys, argv)
        assert first in err and second in err, (argv, err)


def test_the_default_path_is_unchanged_without_a_test_file(tmp_path, capsys):
    """No --test-file: the paper's six benchmarks under ~/data/stapo (--data-root), as before."""
    args = eval_cli.build_parser().parse_args(["m"])
    assert (args.test_file, args.reward_file, args.reward_name, args.benchmarks, args.data_root) == (None,) * 5
    assert stapo_main(["eval", build_tiny_model(), "--data-root", str(tmp_path)]) == 2
    assert "stapo data prepare aime24" in capsys.readouterr().out  # the first of the six, in the paper's order


# ---------------------------------------------------------------- the README's command


def readme_commands(text: str) -> list[list[str]]:
    """The shell commands of the README's block that evaluates a test file, continuations joined."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    block = next((b for b in blocks if "--test-file" in b), None)
    assert block is not None, "README.md shows no `stapo eval ... --test-file` command"
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def test_the_readme_command_runs_as_written(tmp_path, monkeypatch, capsys):
    """With HOME in a temporary folder, the tiny model for the checkpoint and a few short samples appended."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(REPO)
    commands = [c for c in readme_commands((REPO / "README.md").read_text()) if c]
    assert [c[:2] for c in commands] == [["stapo", "data"], ["stapo", "eval"]]
    home = lambda word: str(tmp_path / word[2:]) if word.startswith("~/") else word  # noqa: E731
    assert stapo_main([home(w) for w in commands[0][1:]]) == 0
    out = tmp_path / "results"
    evaluate = [home(w) for w in commands[1][1:]]
    evaluate[1] = build_tiny_model()
    threads = torch.get_num_threads()
    code = stapo_main([*evaluate, "--limit", "2", "--n", "2", "--max-tokens", "6", "--decoding", "T1.0",
                       "--backend", "hf", "--threads", "1", "--out", str(out)])
    torch.set_num_threads(threads)
    assert code == 0, capsys.readouterr()
    assert json.loads((out / "run.json").read_text())["reward_path"] == str(MY_REWARD)
    assert (out / "results.md").read_text().startswith("| data_source |")
