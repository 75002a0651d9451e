"""The demo's arithmetic word problems: deterministic, correct answers, a held-out split that never leaks."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from stapo.data.arithmetic import (
    DATA_SOURCE,
    HELD_OUT_PERCENT,
    INSTRUCTION,
    LEVELS,
    make_rows,
    problem_space,
    split_of,
    write_parquet,
)


def _operands(question: str) -> tuple[int, int]:
    numbers = [int(n) for n in re.findall(r"\d+", question)]
    assert len(numbers) == 2, question
    return numbers[0], numbers[1]


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_rows_are_deterministic_distinct_and_answered_correctly(split, level):
    count = 40
    rows = make_rows(count, split, seed=3, level=level)
    assert rows == make_rows(count, split, seed=3, level=level)
    assert rows != make_rows(count, split, seed=4, level=level)
    assert len({(row["extra_info"]["op"], *sorted(_operands(row["extra_info"]["question"]))) for row in rows}) == count
    addends, multiplicands, multipliers = LEVELS[level]
    for row in rows:
        question = row["extra_info"]["question"]
        a, b = _operands(question)
        # the template may name the operands in either order; the answer is symmetric in both
        expected = a + b if row["extra_info"]["op"] == "+" else a * b
        assert row["reward_model"]["ground_truth"] == str(expected)
        assert row["prompt"][0]["content"] == f"{question} {INSTRUCTION}"
        assert row["data_source"] == DATA_SOURCE and row["extra_info"]["split"] == split
        if row["extra_info"]["op"] == "+":
            assert addends[0] <= min(a, b) and max(a, b) <= addends[1]
        else:  # word problems may name the multiplier first
            low, high = min(multiplicands[0], multipliers[0]), max(multiplicands[1], multipliers[1])
            assert low <= min(a, b) and max(a, b) <= high


def test_problem_space_is_counted_exactly_and_overasking_fails_fast():
    space = problem_space("easy", "heldout")
    assert space + problem_space("easy", "train") == 30 * 31 // 2 + 11 * 12 // 2  # unordered pairs
    assert len(make_rows(space, "heldout", level="easy")) == space  # every held-out problem, each once
    with pytest.raises(ValueError, match="has only"):
        make_rows(space + 1, "heldout", level="easy")


def test_held_out_problems_never_appear_in_training():
    def key(row):
        return row["extra_info"]["op"], frozenset(_operands(row["extra_info"]["question"]))

    train = {key(row) for row in make_rows(2000, "train", level="medium")}
    heldout = {key(row) for row in make_rows(500, "heldout", level="medium")}
    easy_train = {key(row) for row in make_rows(problem_space("easy", "train"), "train", level="easy")}
    easy_heldout = {key(row) for row in make_rows(problem_space("easy", "heldout"), "heldout", level="easy")}
    assert not easy_train & easy_heldout
    # operand order can differ between templates: compare unordered pairs, and check split_of agrees
    assert not train & heldout
    shares = [split_of("+", a, 50) == "heldout" for a in range(10, 1000)]
    assert abs(100 * sum(shares) / len(shares) - HELD_OUT_PERCENT) < 5


def test_write_parquet_round_trips_in_verls_format(tmp_path):
    train, heldout = write_parquet(tmp_path, train=20, heldout=8, seed=1)
    frame = pd.read_parquet(train)
    assert len(frame) == 20 and len(pd.read_parquet(heldout)) == 8
    assert set(frame.columns) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert frame.iloc[0]["prompt"][0]["role"] == "user"
    assert not list(tmp_path.glob("*.tmp"))


def test_unknown_split_or_level_is_refused():
    with pytest.raises(ValueError, match="split must be"):
        make_rows(1, "test")
    with pytest.raises(ValueError, match="level must be one of easy, medium, hard"):
        make_rows(1, "train", level="expert")
