"""The driver's tail metrics (docs/algorithm.md section 5): the rollout's per-token statistics laid out over the
batch's response tokens, and what a tail-driven event shows as, against loops over the tokens."""

from __future__ import annotations

import math

import pytest
import torch

from stapo.algorithm.gradnorm import exact_norm_shares
from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask
from stapo.rundir import TAIL_PREFIX
from stapo.verl_plugin.training.driver_diagnostics import flat_token_stats, tail_metrics


def _rows(lengths, seed, unused=True):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        row = {"collision": torch.rand(n, generator=g).tolist()}
        if unused:
            row["unused_mass"] = (torch.rand(n, generator=g) * 1e-2).tolist()
            row["unused_sampled"] = int(torch.randint(0, 3, (), generator=g))
        rows.append(row)
    return rows


def test_flat_token_stats_follow_the_rows_or_are_absent():
    lengths = [3, 0, 5, 2]
    offsets = torch.tensor([0, 3, 3, 8, 10])
    rows = _rows(lengths, 0)
    flat = flat_token_stats(rows, offsets)
    assert flat["collision"].tolist() == [v for row in rows for v in row["collision"]]
    assert flat["unused_mass"].tolist() == [v for row in rows for v in row["unused_mass"]]
    assert float(flat["unused_sampled"]) == sum(row["unused_sampled"] for row in rows)
    assert "unused_mass" not in flat_token_stats(_rows(lengths, 0, unused=False), offsets)
    assert flat_token_stats(rows[:2] + [None] + rows[3:], offsets) is None  # a row without: vLLM's rollout
    assert flat_token_stats(_rows([3, 0, 4, 2], 0), offsets) is None  # lengths that are not the responses'
    assert flat_token_stats(None, offsets) is None


@pytest.mark.parametrize("seed", [0, 1])
def test_tail_metrics_against_loops(seed):
    g = torch.Generator().manual_seed(seed)
    n = 400
    mask = torch.rand(n, generator=g) < 0.9
    low = torch.rand(n, generator=g) < 0.2
    log_prob = torch.where(low, torch.empty(n).uniform_(-14, -6.3, generator=g), -torch.rand(n, generator=g))
    entropy = torch.rand(n, generator=g) * 3
    advantages = torch.randn(n, generator=g)
    stats = {"collision": torch.rand(n, generator=g, dtype=torch.float64) * 0.9 + 0.05,
             "unused_mass": torch.rand(n, generator=g, dtype=torch.float64) * 1e-3, "unused_sampled": torch.tensor(7.0)}
    settings = MaskSettings(token_mask="none", tau_p=2e-3, entropy_quantile=0.75)
    got = tail_metrics(stats, mask, advantages, log_prob, entropy, settings)
    kept = [k for k in range(n) if mask[k]]
    assert got[TAIL_PREFIX + "unused_mass_mean"] == pytest.approx(sum(float(stats["unused_mass"][k]) for k in kept)
                                                                  / len(kept), rel=1e-12)
    assert got[TAIL_PREFIX + "unused_mass_max"] == max(float(stats["unused_mass"][k]) for k in kept)
    assert got[TAIL_PREFIX + "unused_sampled_frac"] == 7.0 / len(kept)
    # another algorithm's run: the tokens S2T would silence at the run's tau_p and q
    would_be = build_token_mask(MaskInputs(mask, advantages, log_prob, entropy),
                                MaskSettings(token_mask="stapo", tau_p=2e-3, entropy_quantile=0.75)).drop_response
    assert bool(would_be.any())
    numerator = denominator = 0.0
    for k in kept:
        if advantages[k] > 0:
            p = math.exp(float(log_prob[k]))
            norm = abs(float(advantages[k])) * math.sqrt(max(0.0, 1 - 2 * p + float(stats["collision"][k])))
            denominator += norm
            numerator += norm if would_be[k] else 0.0
    assert got["actor/stapo/grad_norm_share_spurious"] == pytest.approx(numerator / denominator, rel=1e-9)
    # a STAPO run: the folded mask is passed as it is
    folded = torch.zeros(n, dtype=torch.bool)
    folded[:50] = True
    own = tail_metrics(stats, mask, advantages, log_prob, entropy, settings, folded)
    want = exact_norm_shares(log_prob.double().exp(), stats["collision"], advantages, folded, mask)
    assert own["actor/stapo/grad_norm_share_spurious"] == want["grad_norm_share_spurious"]
