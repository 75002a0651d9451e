"""The ablation grid against the S2T mask and the loop reference, non-finite inputs included.

The grid re-derives the candidates from the same tensors with its own code path (a sort per tau_p and
a binary search per q); its cell of the configured (tau_p, q) must count exactly what the mask
silences, and every cell what the loop reference would silence with those settings.
"""

from __future__ import annotations

import math

import pytest

from stapo.algorithm.ablation import cell_name, threshold_grid
from stapo.algorithm.s2t import detect_spurious
from tests.reference import reference_spurious
from tests.unit.test_s2t import random_batch

TAU_PS, QS = (1e-3, 2e-3, 1e-2), (0.5, 0.75, 1.0)


@pytest.mark.parametrize("seed", range(3))
def test_every_cell_is_the_reference_mask_with_its_settings(seed):
    log_prob, entropy, advantages, response_mask = random_batch(seed, rows=16, cols=50)
    response_mask[:, :4] = True
    log_prob[3:5, :4] = -math.inf  # p = 0 but never a candidate (row 3 negative, row 4 positive advantage)
    log_prob[5, 0] = math.nan
    entropy[6, 1] = math.nan
    entropy[3:5, :4] = 0.0
    grid = threshold_grid(log_prob, entropy, advantages, response_mask, TAU_PS, QS)
    lists = [t.tolist() for t in (log_prob, entropy, advantages, response_mask)]
    negative = (-advantages).tolist()
    for tau_p in TAU_PS:
        for q in QS:
            spurious, tau_h = reference_spurious(*lists[:2], lists[2], lists[3], tau_p, q)
            name = cell_name("pos", tau_p, q)
            assert grid[f"{name}/num_silenced"] == sum(map(sum, spurious)), name
            assert grid[f"{name}/tau_h"] == tau_h or (math.isnan(tau_h) and math.isnan(grid[f"{name}/tau_h"]))
            neg, _ = reference_spurious(lists[0], lists[1], negative, lists[3], tau_p, q)
            assert grid[f"{cell_name('neg', tau_p, q)}/num_silenced"] == sum(map(sum, neg))
    detection = detect_spurious(log_prob, entropy, advantages, response_mask, tau_p=2e-3, entropy_quantile=0.75)
    assert grid[f"{cell_name('pos', 2e-3, 0.75)}/num_silenced"] == int(detection.spurious.sum()) > 0
    assert grid[f"{cell_name('pos', 2e-3, 0.75)}/num_candidates"] == detection.num_candidates
    assert not detection.spurious[3:5, :4].any()
