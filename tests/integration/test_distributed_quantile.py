"""The DP-global thresholds over real gloo process groups equal the single-process ones.

Each rank holds a different random shard (one rank with no candidate at all); for every entry of
the token-mask registry, the mask every rank builds with its group (1, 2 or 3 ranks) must equal, shard for
shard, the mask of the concatenated batch built in one process (and the loop reference); every
statistic (tau_h, the 20-Entropy threshold, the quadrant split, the entropy percentiles) must equal
the loop reference's over all ranks' tokens, on every rank.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from stapo.algorithm.masks import TOKEN_MASK_REGISTRY, MaskInputs, MaskSettings, build_token_mask, high_entropy_keep
from stapo.algorithm.quantile import global_quantile, group_masked_quantiles
from stapo.algorithm.s2t import detect_spurious
from tests.integration.gloo_ranks import run_cases
from tests.reference import REFERENCES
from tests.unit.test_s2t import random_batch

GLOBAL_COUNTS = ("num_candidates",)
QS = (0.0, 0.1, 0.5, 0.9, 1.0)
SMALL_LIMIT = 37  # group_masked_quantiles' sample limit, far below the shards' positions


def _shard(rank: int):
    log_prob, entropy, advantages, response_mask = random_batch(100 + rank, rows=6 + rank, cols=30)
    if rank == 1:  # a rank without candidates while the others have some
        advantages = -advantages.abs()
    return log_prob, entropy, advantages, response_mask


def _on_rank(rank: int, world: int, group) -> dict:
    """Everything the test compares, on one rank of ``group`` (runs in a gloo rank)."""
    log_prob, entropy, advantages, response_mask = _shard(rank)
    detection = detect_spurious(log_prob, entropy, advantages, response_mask, group=group)
    keep, _ = high_entropy_keep(entropy, response_mask, 0.2, group=group)
    values = torch.randn(rank * 50, generator=torch.Generator().manual_seed(rank))  # rank 0: empty
    masks = {}
    for name in sorted(TOKEN_MASK_REGISTRY):
        inputs = MaskInputs(response_mask, advantages, log_prob, entropy, group)
        built = build_token_mask(inputs, MaskSettings(token_mask=name))
        masks[name] = (built.drop_response.tolist(), built.drop_count.tolist(), built.counts, built.stats)
    return {
        "spurious": detection.spurious.tolist(),
        "tau_h": detection.tau_h,
        "num_candidates": detection.num_candidates,
        "keep": keep.tolist(),
        "q": global_quantile(values, 0.3, group),
        "sampled": group_masked_quantiles(entropy, response_mask, QS, group, max_exact=SMALL_LIMIT),
        "masks": masks,
    }


WORLDS = (1, 2, 3)


@pytest.fixture(scope="module")
def on_ranks() -> dict:
    """Each group size's ranks, from one start of 3 gloo ranks (tests/integration/gloo_ranks.py)."""
    return run_cases(_on_rank, {world: (world, ()) for world in WORLDS})


def _pad_cat(tensors):
    cols = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, cols - t.shape[1])) for t in tensors])


@pytest.mark.slow  # starts processes: out of make test-fast
@pytest.mark.parametrize("world", WORLDS)
def test_global_threshold_equals_single_process(on_ranks, world):
    results = on_ranks[world]
    shards = [_shard(rank) for rank in range(world)]
    log_prob, entropy, advantages, response_mask = (_pad_cat([s[k] for s in shards]) for k in range(4))
    single = detect_spurious(log_prob, entropy, advantages, response_mask)
    single_keep, _ = high_entropy_keep(entropy, response_mask, 0.2)
    union = {"response_mask": response_mask, "advantages": advantages, "log_prob": log_prob, "entropy": entropy}
    union = {key: value.tolist() for key, value in union.items()}
    single_masks = {
        name: REFERENCES[name](union, dataclasses.asdict(MaskSettings(token_mask=name))) for name in TOKEN_MASK_REGISTRY
    }
    all_values = torch.cat([torch.randn(r * 50, generator=torch.Generator().manual_seed(r)) for r in range(world)])

    offset = 0
    for rank in range(world):
        rows = shards[rank][0].shape[0]
        got = results[rank]
        assert got["tau_h"] == single.tau_h
        assert got["num_candidates"] == single.num_candidates
        assert got["spurious"] == single.spurious[offset : offset + rows].tolist()
        assert got["keep"] == single_keep[offset : offset + rows].tolist()
        # above the limit every rank strides its own positions at the whole batch's stride
        stride = -(-sum(s[1].numel() for s in shards) // SMALL_LIMIT)
        picked = torch.cat([s[1].reshape(-1)[::stride][s[3].reshape(-1)[::stride].bool()] for s in shards])
        assert got["sampled"] == [float(np.quantile(picked.double().numpy(), q)) for q in QS]
        expected_q = float(np.quantile(all_values.double().numpy(), 0.3)) if all_values.numel() else math.nan
        assert got["q"] == expected_q or (math.isnan(got["q"]) and math.isnan(expected_q))
        for name, (drop_response, drop_count, counts, stats) in got["masks"].items():
            want = single_masks[name]
            assert drop_response == want["drop_response"][offset : offset + rows], name
            assert drop_count == want["drop_count"][offset : offset + rows], name
            assert stats.keys() == want["stats"].keys(), name
            for key, value in want["stats"].items():
                if key == "min_weight":  # a weight computed in float32 here, in float64 by the reference
                    assert stats[key] == pytest.approx(value, rel=1e-6), (name, rank, key)
                    continue
                assert stats[key] == value or (math.isnan(stats[key]) and math.isnan(value)), (name, rank, key)
            for key in GLOBAL_COUNTS:
                if key in counts:
                    assert counts[key] == want["counts"][key], (name, key)
        offset += rows
    # additive counts: the ranks' sum is the union's (what the trainer's all-reduce relies on)
    for name in TOKEN_MASK_REGISTRY:
        for key, value in single_masks[name]["counts"].items():
            if key in GLOBAL_COUNTS:
                continue
            total = sum(results[rank]["masks"][name][2][key] for rank in range(world))
            # the bound and the weights are summed in the batch's dtype (float32 here), the reference in float64
            float_sum = key.startswith(("grad_bound", "weight_sum"))
            assert total == pytest.approx(value, rel=1e-5 if float_sum else 0.0), (name, key)
    assert single.spurious.any() and any(any(row) for row in single_masks["entropy20"]["drop_response"])
