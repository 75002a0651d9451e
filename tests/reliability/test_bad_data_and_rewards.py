"""Bad data and hostile model outputs, tried on purpose: malformed parquet rows, missing ground
truth, megabytes of text, deeply nested LaTeX, thousands of unclosed ``\\boxed{``. Every case must
finish in bounded time with a clear score, and be counted (skipped-row reasons, reward extra info).
Time bounds are generous for a loaded 2-core CI machine; the measured cost is milliseconds.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stapo.data.cli import main as data_cli
from stapo.data.prepare import DataError, prepare
from stapo.reward import compute_score
from stapo.reward.arithmetic import compute_score as arithmetic_score
from stapo.reward.boxed import normalize_answer

MB4 = 4 * 1024 * 1024

HOSTILE = {
    # name: (reply, ground truth, expected strict score)
    "unclosed_boxed_x600k": ("\\boxed{" * (MB4 // 7), "7", -1.0),
    "unclosed_boxed_then_a_real_one": ("\\boxed{" * (MB4 // 7) + " so \\boxed{7}", "7", 1.0),
    "nested_braces_2M_deep": ("\\boxed{" + "{" * (MB4 // 2) + "7" + "}" * (MB4 // 2) + "}", "7", -1.0),
    "nested_frac_latex": ("\\boxed{" + "\\frac{1}{" * 200_000 + "2" + "}" * 200_000 + "}", "7", -1.0),
    "unclosed_think": ("<think>" + "a" * MB4 + "\\boxed{7}", "7", -1.0),
    "closed_think_then_answer": ("<think>" + "x " * (MB4 // 2) + "</think>\\boxed{7}", "7", 1.0),
    "answer_at_the_end_of_4MB": ("y" * MB4 + "\\boxed{7}", "7", 1.0),
    "4MB_of_digits": ("9" * MB4, "7", -1.0),
    "boxed_lookalikes": ("\\boxedx{7}" * (MB4 // 10), "7", -1.0),
    "dollars_and_spaces": ("$ " * (MB4 // 2) + "\\boxed 7", "7", 1.0),
    "giant_ground_truth": ("\\boxed{7}", "\\boxed{" * 100_000, -1.0),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_reply_scores_in_bounded_time(name):
    reply, truth, expected = HOSTILE[name]
    start = time.perf_counter()
    result = compute_score("math", reply, truth)
    arithmetic = arithmetic_score("arith", reply, truth)
    seconds = time.perf_counter() - start
    assert seconds < 5.0, f"{name}: {seconds:.2f} s"
    assert result["score"] == expected and result["acc"] == float(expected > 0)
    assert arithmetic["score"] in (-1.0, 0.5, 1.0)


# a 1,000-character answer (the cap) built to make a backtracking regex blow up
HOSTILE_ANSWERS = [
    "5" + " m" * 499 + " x",
    "5" + " square units" * 76 + "!",
    "5\\text{" + " cm" * 300 + "x",
    "1" + ",000" * 249 + ",00",
    "\\frac" * 200,
    "\\sqrt" * 200,
    "{" * 1000,
    "x = " * 250,
    "\\text{\\textbf{" * 70 + "5",
    "-" * 999 + "1",
    "(" + "A" * 998 + ")",
]


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS, ids=[a[:16] for a in HOSTILE_ANSWERS])
def test_normalisation_of_a_hostile_answer_is_fast(answer):
    start = time.perf_counter()
    for _ in range(20):
        normalize_answer(answer)
        compute_score("math", f"\\boxed{{{answer}}}", answer)
    assert time.perf_counter() - start < 2.0  # 40 calls; each takes well under a millisecond


@pytest.mark.parametrize(
    "truth",
    [None, float("nan"), float("inf"), "", "   ", {"answer": "7"}, [], [None, ""], np.array([]), True],
    ids=["none", "nan", "inf", "empty", "blank", "dict", "empty_list", "list_of_nothing", "empty_array", "bool"],
)
def test_missing_ground_truth_scores_minus_one_and_is_counted(truth):
    # "\boxed{nan}" would have matched str(float("nan")) == "nan": a missing answer is never right
    for reply in ("\\boxed{nan}", "\\boxed{None}", "\\boxed{}", "\\boxed{7}", "\\boxed{inf}", "\\boxed{True}"):
        result = compute_score("math", reply, truth)
        assert result["score"] == -1.0 and result["has_ground_truth"] == 0.0, (reply, result)
        assert arithmetic_score("arith", reply, truth)["score"] == -1.0


@pytest.mark.parametrize(
    "reply, truth, expected",
    [
        (None, "7", -1.0),
        (b"so \\boxed{7}", "7", 1.0),
        (7, "7", -1.0),
        ("\\boxed{7}", 7, 1.0),
        ("\\boxed{3}", 3.0, 1.0),
        ("\\boxed{five}", ["5", "five"], 1.0),  # several accepted answers: any one is right
        ("\\boxed{5}", np.array(["5"]), 1.0),
        ("\\boxed{\ud800}", "7", -1.0),  # a lone surrogate from a broken detokenisation
    ],
)
def test_reward_never_raises_on_odd_types(reply, truth, expected):
    result = compute_score("math", reply, truth)
    assert result["score"] == expected
    assert set(result) == set(compute_score("math", "\\boxed{1}", "1"))  # verl needs the same keys every time
    assert all(isinstance(v, float) and math.isfinite(v) for v in result.values())


# --- data preparation: a parquet file with every kind of broken row ---------------------------


def _write_parquet(path, rows):
    schema = pa.schema([("problem", pa.string()), ("answer", pa.string()), ("solution", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


BROKEN_ROWS = [
    ({"problem": "What is 1+1?", "answer": "2", "solution": None}, ""),
    ({"problem": None, "answer": "3", "solution": None}, "missing question"),
    ({"problem": "   ", "answer": "3", "solution": None}, "missing question"),
    ({"problem": "Q no answer", "answer": None, "solution": None}, "missing or ambiguous answer"),
    ({"problem": "Q empty answer", "answer": "", "solution": None}, "missing or ambiguous answer"),
    ({"problem": "Q from solution", "answer": None, "solution": "so \\boxed{12}"}, ""),
    ({"problem": "Q bad solution", "answer": None, "solution": "\\boxed{" * 50_000},
     "no answer field and no \\boxed{} answer in the solution"),
    ({"problem": "x" * (MB4 // 4), "answer": "1", "solution": None}, "question longer than 20000 characters"),
    ({"problem": "Q giant answer", "answer": "9" * 5_000, "solution": None}, "answer longer than 1000 characters"),
    ({"problem": "What is 1+1?", "answer": "2", "solution": None}, "duplicate question"),
    ({"problem": "Q dollars", "answer": "$$", "solution": None}, "missing or ambiguous answer"),
]


def test_malformed_parquet_rows_are_skipped_counted_and_listed(tmp_path):
    source = tmp_path / "broken.parquet"
    _write_parquet(source, [row for row, _ in BROKEN_ROWS])
    start = time.perf_counter()
    summary = prepare("math500", tmp_path / "out", source, dedup=True)
    assert time.perf_counter() - start < 10.0
    expected_skips = [(number, reason) for number, (_, reason) in enumerate(BROKEN_ROWS, start=1) if reason]
    assert summary["rows_in"] == len(BROKEN_ROWS) and summary["rows_out"] == len(BROKEN_ROWS) - len(expected_skips)
    counts = {}
    for _, reason in expected_skips:
        counts[reason] = counts.get(reason, 0) + 1
    assert summary["skipped"] == counts
    listing = (tmp_path / "out" / "math500" / "test.skipped.jsonl").read_text()
    listed = [json.loads(line) for line in listing.splitlines()]
    assert [(s["row"], s["reason"]) for s in listed] == expected_skips
    frame = pd.read_parquet(summary["output"])
    assert list(frame["reward_model"].map(lambda r: r["ground_truth"])) == ["2", "12"]
    on_disk = json.loads((tmp_path / "out" / "math500" / "test.summary.json").read_text())
    assert on_disk["skipped"] == counts


def test_verl_rows_with_null_ground_truth_or_no_user_turn(tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "Q1"}], "reward_model": {"ground_truth": "4", "style": "rule"}},
        {"prompt": [{"role": "user", "content": "Q2"}], "reward_model": {"ground_truth": None, "style": "rule"}},
        {"prompt": [{"role": "system", "content": "only a system turn"}],
         "reward_model": {"ground_truth": "1", "style": "rule"}},
        {"prompt": [], "reward_model": {"ground_truth": "1", "style": "rule"}},
    ]
    source = tmp_path / "verl.parquet"
    pd.DataFrame(rows).to_parquet(source)
    summary = prepare("dapo_math_17k", tmp_path / "out", source)
    assert summary["rows_out"] == 1
    assert summary["skipped"] == {"missing or ambiguous answer": 1, "missing question": 2}


def test_damaged_parquet_file_is_a_clear_error_and_cli_exit_code(tmp_path, capsys):
    bad = tmp_path / "damaged.parquet"
    good = tmp_path / "good.parquet"
    _write_parquet(good, [BROKEN_ROWS[0][0]] * 3)
    bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])  # truncated mid-file
    with pytest.raises(DataError, match="damaged.parquet: not a readable parquet file"):
        prepare("aime24", tmp_path / "out", bad)
    assert data_cli(["prepare", "aime24", "--input", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "not a readable parquet file" in capsys.readouterr().err
    partly = tmp_path / "partly.parquet"
    _write_parquet(partly, [row for row, _ in BROKEN_ROWS[:3]])
    assert data_cli(["prepare", "aime24", "--input", str(partly), "--out", str(tmp_path / "o2"), "--strict"]) == 1
    assert "missing question" in capsys.readouterr().out
