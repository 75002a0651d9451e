"""The trainer's check that verl divided by the count the folded mask left, at real sizes.

verl reports ``actor/stapo/loss_tokens`` per mini-batch (each the DP-global count of that mini-batch)
and its ``reduce_metrics`` averages them over the step's updates; the trainer multiplies back by the
mini-batches of one epoch. ``(S / k) * k`` is not exact in floating point for k = 7, 11, 13, ..., so
the check compares integers. Tested with verl's own reduction on counts in the tens of millions.
"""

from __future__ import annotations

import random

import pytest
from verl.utils.metric import reduce_metrics

from stapo.verl_plugin.trainer import check_token_count, step_token_count

KEY = "actor/stapo/loss_tokens"


def reported_mean(per_mini_batch: list[int], epochs: int) -> float:
    """What the trainer receives: verl's reduction of the per-update values (every epoch repeats them)."""
    return float(reduce_metrics({KEY: per_mini_batch * epochs})[KEY])


@pytest.mark.parametrize("mini_batches", [1, 2, 3, 4, 5, 7, 11, 13, 16, 64])
@pytest.mark.parametrize("epochs", [1, 2, 3])
def test_the_count_survives_verls_mean_for_any_number_of_mini_batches(mini_batches, epochs):
    rng = random.Random(mini_batches * 100 + epochs)
    for _ in range(300):
        per_mini_batch = [rng.randint(1_000_000, 40_000_000) for _ in range(mini_batches)]
        total = sum(per_mini_batch)
        count = step_token_count(reported_mean(per_mini_batch, epochs), mini_batches)
        assert count == total
        check_token_count(count, float(total), "stapo")  # never refuses a correct step


def test_the_float_product_alone_is_not_exact():
    """Why the count is rounded: the plain product misses the integer on a share of real steps."""
    rng = random.Random(0)
    misses = 0
    for _ in range(1000):
        per_mini_batch = [rng.randint(10_000_000, 40_000_000) for _ in range(7)]
        misses += reported_mean(per_mini_batch, 1) * 7 != sum(per_mini_batch)
    assert misses > 0


def test_a_count_that_differs_by_one_token_stops_the_run():
    with pytest.raises(RuntimeError, match=r"divided by 127214602 tokens but the folded stapo mask left 127214603"):
        check_token_count(127_214_602, 127_214_603.0, "stapo")
