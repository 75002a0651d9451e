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

from stapo.verl_plugin.training.trainer import check_step_token_counts, check_token_count, step_token_count

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


FOLDED = "actor/stapo/loss_tokens_folded"


def test_a_step_of_a_folded_mask_that_reports_no_count_stops_the_run():
    """With ppo_epochs=0 (refused before start since) or a worker that does not fold, a step reports no token count
    at all: the check must fail that step, not skip it."""
    with pytest.raises(RuntimeError, match="reported no actor/stapo/loss_tokens: no update ran this step"):
        check_step_token_counts({}, 1, folded=True, mask_name="stapo")
    with pytest.raises(RuntimeError, match="reported no loss_tokens_folded"):
        check_step_token_counts({KEY: 10.0}, 1, folded=True, mask_name="stapo")
    # an algorithm without a folded mask reports verl's count only, made one step's
    metrics = {KEY: 12.5}
    check_step_token_counts(metrics, 2, folded=False, mask_name="none")
    assert metrics == {KEY: 25.0}
    check_step_token_counts({}, 1, folded=False, mask_name="none")  # and may report none
    # a folded mask's step: verl's count made one step's, then checked against the folded count
    metrics = {KEY: reported_mean([7, 9, 11], 2), FOLDED: 27.0}
    check_step_token_counts(metrics, 3, folded=True, mask_name="stapo")
    assert metrics[KEY] == 27.0
    with pytest.raises(RuntimeError, match="divided by 27 tokens but the folded stapo mask left 28"):
        check_step_token_counts({KEY: reported_mean([7, 9, 11], 1), FOLDED: 28.0}, 3, folded=True, mask_name="stapo")
