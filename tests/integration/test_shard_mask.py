"""The mask folded inside the actor workers (``shard_mask.fold_shard``) against the whole batch in one process.

Each rank of a real gloo group holds a contiguous shard of one batch, laid out as verl 0.9.1's v1
trainer hands it to ``update_actor`` (jagged response-only fields, as fetched from TransferQueue).
The reference is computed independently: the whole batch padded to ``(rows, max_len)``, the mask
built in one process, folded by a product, the metrics from the padded tensors. Every rank's folded
``response_mask``/``loss_mask`` must equal its rows of the reference bit for bit, and every rank must
report the reference's metrics (the same on every rank), for 1, 2 and 3 ranks, for each folded mask.
Edge cases: an instant EOS, a row without response token, a hole in a row, one rank without any
candidate, a batch without any candidate (tau_h undefined).
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask, finalize_metrics, get_token_mask
from stapo.verl_plugin.training.jagged import TOKEN_WEIGHT
from stapo.verl_plugin.training.shard_mask import FOLDED_LOSS_TOKENS, fold_shard
from tests.integration.gloo_ranks import run_cases
from tests.integration.jagged_rows import response_rows

# float sums (and their ratio) whose order of addition differs between the padded and the sharded layout
FLOAT_SUMS = ("grad_bound_spurious", "grad_bound_positive", "grad_bound_share_spurious", "weight_sum",
              "weight_sum_positive", "mean_weight", "mean_weight_positive", "min_weight")
SETTINGS = {
    "stapo": MaskSettings(token_mask="stapo", tau_p=2e-3, entropy_quantile=0.8),
    "entropy20-all": MaskSettings(token_mask="entropy20"),
    "entropy20-kept": MaskSettings(token_mask="entropy20", entropy_denominator="kept"),
    # a weighted entry: its weights stored as a field, its minimum over every rank
    "taco": MaskSettings(token_mask="taco", taco_alpha=0.05),
}


def _batch(rows: int, seed: int, candidates: bool = True) -> dict[str, list[torch.Tensor]]:
    """Per-row tensors with low-probability tokens, an empty row, a row of zero mask and a hole in a row."""
    batch = response_rows(rows, seed, max_len=120, specials=(1, 2, 3), low_share=0.08, candidates=candidates)
    del batch["responses"]  # the update's shard has them, the mask does not read them
    return batch


def _whole_batch(no_candidates_in) -> dict[str, list[torch.Tensor]]:
    """Three parts of 9, 11 and 13 rows; part ``no_candidates_in`` (or every part: "all") has no candidate.
    With 2 or 3 ranks each part falls mostly in one rank's shard."""
    parts = [
        _batch(9 + 2 * part, seed=40 + part, candidates=no_candidates_in not in (part, "all")) for part in range(3)
    ]
    return {name: [row for part in parts for row in part[name]] for name in parts[0]}


def _bounds(rows: int, world: int) -> list[tuple[int, int]]:
    """verl's dispatch: contiguous, nearly equal chunks in rank order."""
    cuts = [round(rows * r / world) for r in range(world + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _shard(batch, start: int, end: int) -> TensorDict:
    fields = {name: _nested(values[start:end]) for name, values in batch.items()}
    fields["loss_mask"] = _nested([m.clone() for m in batch["response_mask"][start:end]])
    return TensorDict(fields, batch_size=end - start)


def _padded(rows):
    return _nested(rows).to_padded_tensor(padding=0)


def _reference(batch, settings: MaskSettings):
    """Folded masks (padded) and metrics of the whole batch in one process, from padded tensors."""
    mask = _padded(batch["response_mask"])
    inputs = MaskInputs(
        mask.bool(), _padded(batch["advantages"]), _padded(batch["old_log_probs"]), _padded(batch["entropy"])
    )
    built = build_token_mask(inputs, settings)
    folded_response = mask * (~built.drop_response).long()
    folded_loss = mask * (~built.drop_count).long()
    counts = {**built.counts, FOLDED_LOSS_TOKENS: float(folded_loss.sum())}
    metrics = finalize_metrics(get_token_mask(settings.token_mask), counts, built.stats)
    return folded_response, folded_loss, metrics, built.weight


def _fold(rank: int, world: int, group, no_candidates_in) -> dict:
    """One rank's shard folded for every setting (runs in a gloo rank)."""
    batch = _whole_batch(no_candidates_in)
    start, end = _bounds(len(batch["response_mask"]), world)[rank]
    out = {}
    for name, settings in SETTINGS.items():
        data = _shard(batch, start, end)
        metrics = fold_shard(data, settings, group)
        out[name] = {
            "response_mask": [t.tolist() for t in data["response_mask"].unbind()],
            "loss_mask": [t.tolist() for t in data["loss_mask"].unbind()],
            "dtype": str(data["loss_mask"].values().dtype),
            "metrics": metrics,
            "weight": [t.tolist() for t in data[TOKEN_WEIGHT].unbind()] if TOKEN_WEIGHT in data.keys() else None,
        }
    return out


# (ranks, the part of the batch without candidates): one rank, a rank without candidates, none anywhere
CASES = [(1, None), (2, 2), (3, 0), (2, "all")]


@pytest.fixture(scope="module")
def folded() -> dict:
    """Every case's ranks, from one start of 3 gloo ranks (tests/integration/gloo_ranks.py)."""
    return run_cases(_fold, {case: (case[0], (case[1],)) for case in CASES})


def _same(got: float, want: float, key: str) -> bool:
    if key in FLOAT_SUMS:
        return got == pytest.approx(want, rel=1e-6)
    return got == want or (math.isnan(got) and math.isnan(want))


@pytest.mark.slow  # starts processes: out of make test-fast
@pytest.mark.parametrize(("world", "no_candidates_in"), CASES)
def test_every_rank_folds_its_rows_of_the_whole_batch_mask(folded, world, no_candidates_in):
    results = folded[(world, no_candidates_in)]
    batch = _whole_batch(no_candidates_in)
    rows = len(batch["response_mask"])
    for name, settings in SETTINGS.items():
        folded_response, folded_loss, expected, weight = _reference(batch, settings)
        for rank, (start, end) in enumerate(_bounds(rows, world)):
            got = results[rank][name]
            for field, reference in (("response_mask", folded_response), ("loss_mask", folded_loss)):
                lengths = [len(m) for m in batch["response_mask"][start:end]]
                want = [reference[r, :n].tolist() for r, n in zip(range(start, end), lengths)]
                assert got[field] == want, (name, rank, field)
            assert got["dtype"] == "torch.int64"
            if weight is None:
                assert got["weight"] is None, name
            else:  # elementwise float32 maths on another layout: equal to rounding
                want = [weight[r, :n].tolist() for r, n in zip(range(start, end), lengths)]
                assert [w for row in got["weight"] for w in row] == pytest.approx([w for row in want for w in row])
            assert got["metrics"].keys() == expected.keys(), name
            for key, value in expected.items():
                assert _same(got["metrics"][key], value, key), (name, rank, key, got["metrics"][key], value)
        if name == "stapo":
            has_candidates = no_candidates_in != "all"
            assert (expected["num_spurious"] > 0) == has_candidates
            assert math.isnan(expected["tau_h"]) != has_candidates
        assert expected["empty_responses"] == 6.0  # rows 1 and 2 of each of the three parts


def test_a_field_laid_out_differently_is_refused():
    rows = [torch.ones(3, dtype=torch.int64), torch.ones(5, dtype=torch.int64)]
    data = TensorDict(
        {
            "response_mask": _nested(rows),
            "loss_mask": _nested(rows),
            "advantages": _nested([torch.ones(4), torch.ones(4)]),  # same total, other row lengths
            "old_log_probs": _nested([torch.zeros(3), torch.zeros(5)]),
            "entropy": _nested([torch.zeros(3), torch.zeros(5)]),
        },
        batch_size=2,
    )
    with pytest.raises(RuntimeError, match="'advantages' laid out as response_mask"):
        fold_shard(data, SETTINGS["stapo"])


def test_a_missing_old_pass_field_is_named():
    rows = [torch.ones(3, dtype=torch.int64)]
    data = TensorDict(
        {"response_mask": _nested(rows), "loss_mask": _nested(rows), "advantages": _nested([torch.ones(3)])},
        batch_size=1,
    )
    with pytest.raises(RuntimeError, match=r"reads \['old_log_probs', 'entropy'\].*calculate_entropy=true"):
        fold_shard(data, SETTINGS["stapo"])


def test_folded_masks_are_jagged_like_verls():
    """The folded masks pad as verl's ``as_nested_tensor`` masks do (row-length bounds cached)."""
    batch = _batch(rows=12, seed=5)
    data = _shard(batch, 0, 12)
    fold_shard(data, SETTINGS["stapo"])
    reference, *_ = _reference(batch, SETTINGS["stapo"])
    for name in ("response_mask", "loss_mask"):
        assert torch.equal(data[name].to_padded_tensor(padding=0), reference), name
        assert torch.equal(data[name].offsets(), _nested(batch["response_mask"]).offsets())
