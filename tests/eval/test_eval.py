"""The evaluation pipeline end to end on CPU (real tiny model, fixture benchmark) and avg@N by hand."""

from __future__ import annotations

import csv
import json

import pytest

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
        return [[answers[i] if (temperature < 1.0 or k < i) else "\\boxed{0}" for k in range(n)] for i in range(len(prompts))]

    results = evaluate(scripted, {"math500": tmp_path / "data" / "math500" / "test.parquet"}, tmp_path / "out", n_override=4)
    assert results["math500"]["T1.0"] == pytest.approx(100 * (0 + 1 + 2 + 3) / 16)
    assert results["math500"]["T0.7"] == 100.0
    table = list(csv.reader((tmp_path / "out" / "results.csv").open()))
    assert table[0] == ["benchmark", "T1.0", "T0.7"] and table[-1][0] == "Average"
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 * 4 and {s["checker"] for s in samples} == {"strict"}
    assert "| Average |" in (tmp_path / "out" / "results.md").read_text()


def test_cli_end_to_end_on_cpu_with_a_real_model(tmp_path):
    from stapo.models.tiny import build_tiny_model

    prepare("aime24", tmp_path / "data", FIXTURES / "aime_like.jsonl")
    code = eval_main([build_tiny_model(), "--data-root", str(tmp_path / "data"), "--benchmarks", "aime24",
                      "--n", "2", "--max-tokens", "8", "--backend", "hf", "--out", str(tmp_path / "out")])
    assert code == 0
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 2 * 2  # prompts x samples x settings
    assert all(s["score"] in (-1.0, 1.0) for s in samples)


def test_cli_reports_missing_data(tmp_path, capsys):
    assert eval_main(["x", "--data-root", str(tmp_path), "--benchmarks", "aime24"]) == 2
    assert "stapo data prepare aime24" in capsys.readouterr().out
