"""Data preparation on small files the tests ship or create: verl format, validation, no silent drops."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from stapo.data.cli import main as data_main
from stapo.data.prepare import SUFFIX, DataError, prepare
from stapo.reward import compute_score

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def test_benchmark_file_converts_and_counts_every_skip(tmp_path):
    summary = prepare("aime24", tmp_path, FIXTURES / "aime_like.jsonl")
    assert (summary["rows_in"], summary["rows_out"]) == (7, 4)
    assert summary["skipped"] == {"missing question": 1, "missing or ambiguous answer": 2}
    frame = pd.read_parquet(summary["output"])
    row = frame.iloc[0]
    assert row["data_source"] == "stapo/aime24" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith(SUFFIX)
    assert list(frame["reward_model"].map(lambda r: r["ground_truth"])) == ["2", "9", "\\frac{5}{6}", "5"]
    skipped = [json.loads(line) for line in (tmp_path / "aime24" / "test.skipped.jsonl").read_text().splitlines()]
    assert [(s["row"], s["reason"]) for s in skipped] == [
        (4, "missing question"), (5, "missing or ambiguous answer"), (6, "missing or ambiguous answer"),
    ]
    assert all(s["file"].endswith("aime_like.jsonl") for s in skipped)
    # the reward reads these rows as they are
    assert compute_score(row["data_source"], "so \\boxed{2}", row["reward_model"]["ground_truth"])["score"] == 1.0


def test_dapo_rows_are_reprompted_and_deduplicated(tmp_path):
    dapo_prompt = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    rows = [
        {"data_source": "math_dapo", "prompt": [{"role": "user", "content": dapo_prompt.format(q=q)}],
         "ability": "MATH", "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"},
         "extra_info": {"index": i}}
        for i, (q, a) in enumerate([("What is 1+1?", "2"), ("What is 2+2?", "4"), ("What is 1+1?", "2")])
    ]
    source = tmp_path / "dapo.parquet"
    pd.DataFrame(rows).to_parquet(source)
    summary = prepare("dapo_math_17k", tmp_path / "out", source, dedup=True)
    assert (summary["rows_out"], summary["skipped"]) == (2, {"duplicate question": 1})
    frame = pd.read_parquet(summary["output"])
    assert frame.iloc[0]["prompt"][0]["content"] == f"What is 1+1?\n\n{SUFFIX}"
    assert Path(summary["output"]).name == "train.parquet"


def test_clear_errors_name_the_file_and_row(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "ok", "answer": "1"}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl: row 2 is not valid JSON"):
        prepare("math500", tmp_path, bad)
    with pytest.raises(DataError, match="no such file"):
        prepare("math500", tmp_path, tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": "no fields we know"}\n')
    with pytest.raises(DataError, match="no usable row among 1"):
        prepare("math500", tmp_path, empty)
    with pytest.raises(DataError, match="unknown data set 'gsm9k'"):
        prepare("gsm9k", tmp_path, empty)


def test_field_overrides(tmp_path):
    source = tmp_path / "custom.jsonl"
    source.write_text('{"q": "What is 5*5?", "a": "25"}\n')
    summary = prepare("minerva", tmp_path / "out", source, question_field="q", answer_field="a")
    assert summary["rows_out"] == 1


def test_cli_prepare_and_strict(tmp_path, capsys):
    assert data_main(["list"]) == 0
    assert "olympiadbench" in capsys.readouterr().out
    assert data_main(["prepare", "amc23", "--input", str(FIXTURES / "aime_like.jsonl"), "--out", str(tmp_path)]) == 0
    assert data_main(["prepare", "amc23", "--input", str(FIXTURES / "aime_like.jsonl"), "--out", str(tmp_path),
                      "--strict", "--force"]) == 1
    out = capsys.readouterr()
    assert "skipped rows" in out.out and "--strict: rows were skipped (counted above), so the exit code is 1" in out.err


@pytest.mark.parametrize(
    "name, fixture, truths, skipped",
    [
        ("olympiadbench", "olympiad_like.jsonl", ["12", "55"],
         {"missing or ambiguous answer": 1, "not a JSON object": 1}),
        ("amc23", "amc_like.jsonl", ["25", "3.5"], {"missing or ambiguous answer": 1}),
        ("math500", "math500_like.jsonl", ["\\left( 3, \\frac{\\pi}{2} \\right)", "\\sqrt{53}"], {}),
        ("minerva", "minerva_like.jsonl", ["12", "1"],
         {"no answer field and no \\boxed{} answer in the solution": 1}),
        ("dapo_math_17k", "dapo_like.jsonl", ["169", "7", "169", "10", "7"], {"missing or ambiguous answer": 1}),
    ],
)
def test_each_benchmark_shape_converts(tmp_path, name, fixture, truths, skipped):
    summary = prepare(name, tmp_path, FIXTURES / fixture)
    frame = pd.read_parquet(summary["output"])
    assert list(frame["reward_model"].map(lambda r: r["ground_truth"])) == truths
    assert summary["skipped"] == skipped and summary["rows_in"] == len(truths) + sum(skipped.values())
    assert all(p[0]["content"].endswith(SUFFIX) and len(p) == 1 for p in frame["prompt"])
    assert list(frame["extra_info"].map(lambda e: e["index"])) == list(range(len(truths)))
    written = json.loads((Path(summary["output"]).parent / f"{Path(summary['output']).stem}.summary.json").read_text())
    assert written["skipped"] == skipped and written["rows_out"] == len(truths)
    # every prepared ground truth is accepted by the reward when boxed verbatim
    for truth in truths:
        assert compute_score(f"stapo/{name}", f"\\boxed{{{truth}}}", truth)["score"] == 1.0


def test_dapo_dedup_ignores_whitespace_and_keeps_the_first(tmp_path):
    summary = prepare("dapo_math_17k", tmp_path, FIXTURES / "dapo_like.jsonl", dedup=True)
    assert summary["rows_out"] == 3
    assert summary["skipped"] == {"duplicate question": 2, "missing or ambiguous answer": 1}
    frame = pd.read_parquet(summary["output"])
    assert [e["source_row"] for e in frame["extra_info"]] == [1, 2, 4]
    assert not any("Answer:" in p[0]["content"] for p in frame["prompt"])


def test_parquet_input_and_limit(tmp_path):
    source = tmp_path / "bench.parquet"
    pd.read_json(FIXTURES / "math500_like.jsonl", lines=True).to_parquet(source)
    summary = prepare("math500", tmp_path / "out", source, limit=1)
    assert (summary["rows_in"], summary["rows_out"]) == (1, 1)
    with pytest.raises(DataError, match="not a readable parquet file"):
        bad = tmp_path / "bad.parquet"
        bad.write_bytes(b"not parquet")
        prepare("math500", tmp_path / "out", bad)


def test_hub_path_asks_for_the_right_dataset_and_split(tmp_path, monkeypatch):
    """The `datasets.load_dataset` path, with a stand-in module (no download in tests)."""
    import sys
    import types

    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if name == "HuggingFaceH4/MATH-500":
            return [json.loads(line) for line in (FIXTURES / "math500_like.jsonl").read_text().splitlines()]
        raise ConnectionError("offline")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert prepare("math500", tmp_path)["rows_out"] == 2
    with pytest.raises(DataError, match=r"DAPO-Math-17k \(split train\): could not load.*--input"):
        prepare("dapo_math_17k", tmp_path)
    assert calls == [("HuggingFaceH4/MATH-500", None, "test"), ("BytedTsinghua-SIA/DAPO-Math-17k", None, "train")]


def test_cli_rejects_unknown_names_and_bad_limits(tmp_path, capsys):
    assert data_main(["prepare", "gsm9k", "--out", str(tmp_path)]) == 2
    assert data_main(["prepare", "aime24", "--limit", "0", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "unknown data set(s) ['gsm9k']" in captured.err and "--limit must be >= 1" in captured.err
    assert captured.out == ""  # errors go to stderr, the summary alone to stdout
