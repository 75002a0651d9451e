"""The demo's reward: +1 boxed and right, +0.5 right as the last number, -1 otherwise; bounded time."""

from __future__ import annotations

import time

import pytest

from stapo.reward.arithmetic import compute_score, last_number

CASES = [
    # (reply, ground truth, score, acc, boxed_acc)
    ("Ana has 23 + 45 = 68 apples. \\boxed{68}", "68", 1.0, 1.0, 1.0),
    ("The total is \\boxed{1,234}.", "1234", 1.0, 1.0, 1.0),
    ("So she has 68 apples now.", "68", 0.5, 1.0, 0.0),
    ("23 plus 45 is 68.", "68", 0.5, 1.0, 0.0),
    ("The answer is 1,234", "1234", 0.5, 1.0, 0.0),
    ("68 apples, or maybe 69", "68", -1.0, 0.0, 0.0),  # the last number decides
    ("\\boxed{67} ... although 68", "68", -1.0, 0.0, 0.0),  # a box is the answer when there is one
    ("\\boxed{68} wait \\boxed{67}", "68", -1.0, 0.0, 0.0),  # the last box
    ("I do not know.", "68", -1.0, 0.0, 0.0),
    ("", "68", -1.0, 0.0, 0.0),
    ("-5 is the answer", "-5", 0.5, 1.0, 0.0),
    ("It is 12.0", "12", 0.5, 1.0, 0.0),
]


@pytest.mark.parametrize("reply, truth, score, acc, boxed_acc", CASES)
def test_table(reply, truth, score, acc, boxed_acc):
    result = compute_score("stapo/arithmetic", reply, truth)
    assert (result["score"], result["acc"], result["boxed_acc"]) == (score, acc, boxed_acc)
    assert result["has_box"] == float("\\boxed" in reply)


def test_last_number_strips_separators_and_a_final_period():
    assert last_number("is 1,234.") == "1234"
    assert last_number("3.5 and 7") == "7"
    assert last_number("none") is None


def test_megabytes_of_digits_and_braces_score_fast():
    for reply in ("9" * 4_000_000, "\\boxed{" * 200_000, "1, " * 1_000_000 + "68"):
        started = time.perf_counter()
        result = compute_score("stapo/arithmetic", reply, "68")
        assert time.perf_counter() - started < 5.0
        assert result["score"] in (-1.0, 0.5, 1.0)
