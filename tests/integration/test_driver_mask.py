"""The driver's round trip (``DriverMask.round_trip``) against a real TransferQueue on a local Ray.

The batch is stored as verl 0.9.1's v1 trainer leaves it (jagged response-only fields, reward info
in ``extra_fields``). The reference is computed independently, the way the trainer did it before the
round trip was factored out: every field padded to ``(rows, max_len)``, the mask built on the padded
tensors, folded by a product, the diagnostics read from the padded tensors. The folded masks read
back from TransferQueue, every metric and both run-dir files must match it. Starts Ray: run under
``flock /tmp/stapo-e2e.lock`` on the shared machine.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from benchmarks.tq_roundtrip import PARTITION, driver_mask, transfer_queue
from stapo.ablation import threshold_grid, token_sample
from stapo.masks import MaskInputs, build_token_mask, finalize_metrics
from stapo.verl_plugin.driver_mask import RoundTripResult, StepPlan, _Clock
from stapo.verl_plugin.run_log import SpuriousTokenLog

# float sums whose order of addition differs between the padded and the flat layout
FLOAT_SUMS = ("actor/stapo/grad_bound_spurious", "actor/stapo/grad_bound_positive")


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _batch(rows: int = 48, seed: int = 3) -> dict[str, list]:
    """Per-row tensors with spurious tokens, an empty row, a row of zero mask and zeros inside a row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 400, (rows,), generator=g).tolist()
    lengths[5] = 0  # an instant EOS
    batch = {name: [] for name in ("responses", "response_mask", "old_log_probs", "entropy", "advantages")}
    for row, n in enumerate(lengths):
        mask = torch.ones(n, dtype=torch.int64)
        if row == 7:
            mask[:] = 0  # a row with no response token
        if row == 9 and n > 20:
            mask[10:20] = 0  # tool output inside a response
        log_prob = -torch.empty(n).exponential_(3.0, generator=g)
        low = torch.rand(n, generator=g) < 0.05
        log_prob[low] = torch.empty(int(low.sum())).uniform_(math.log(1e-6), math.log(2e-3), generator=g)
        advantage = float(torch.randn((), generator=g)) if row % 4 else 0.0
        batch["responses"].append(torch.randint(1, 1000, (n,), generator=g))
        batch["response_mask"].append(mask)
        batch["old_log_probs"].append(log_prob * mask)
        batch["entropy"].append(torch.empty(n).exponential_(1.0, generator=g) * mask)
        batch["advantages"].append(torch.full((n,), advantage) * mask)
    return batch


def _padded(rows, value=0):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged).to_padded_tensor(padding=value)


def _reference(batch, settings, diagnostics, log: SpuriousTokenLog, tokenizer, spec):
    """The mask, folded masks, metrics and files from padded tensors (the trainer's former layout)."""
    mask = _padded(batch["response_mask"])
    log_prob, entropy = _padded(batch["old_log_probs"]), _padded(batch["entropy"])
    advantages = _padded(batch["advantages"])
    built = build_token_mask(MaskInputs(mask.bool(), advantages, log_prob, entropy), settings)
    folded = mask * (~built.drop_response).long()
    metrics = {"actor/stapo/" + k: v for k, v in finalize_metrics(spec, built.counts, built.stats).items()}
    grid = threshold_grid(log_prob, entropy, advantages, mask, diagnostics.tau_ps, diagnostics.qs)
    metrics.update({"actor/stapo/ablation/" + k: v for k, v in grid.items()})
    padded = {"old_log_probs": log_prob, "entropy": entropy, "response_mask": mask}
    log.write(1, _padded(batch["responses"], tokenizer.pad_token_id), built.drop_response, padded, tokenizer)
    sample = token_sample(log_prob, entropy, advantages, mask, built.drop_response, diagnostics.sample_size)
    return folded, metrics, sample


def _store(tq, batch, keys):
    rows = len(keys)
    fields = {name: _nested(values) for name, values in batch.items()}
    fields["loss_mask"] = _nested([m.clone() for m in batch["response_mask"]])
    fields["extra_fields"] = NonTensorStack(*({"reward_extra_info": {"acc": float(i % 3 == 0)}} for i in range(rows)))
    tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=TensorDict(fields, batch_size=rows))


def test_round_trip_equals_the_padded_reference(tmp_path, monkeypatch):
    batch = _batch()
    keys = [f"k{i}" for i in range(len(batch["responses"]))]
    mask = driver_mask(tmp_path / "flat")
    ref_mask = driver_mask(tmp_path / "padded")
    with transfer_queue() as tq:
        _store(tq, batch, keys)
        gets = []
        real_get = tq.kv_batch_get
        monkeypatch.setattr(tq, "kv_batch_get", lambda **kw: gets.append(kw) or real_get(**kw))
        result = mask.round_trip(1, keys, PARTITION)
        monkeypatch.setattr(tq, "kv_batch_get", real_get)
        back = tq.kv_batch_get(keys=keys, partition_id=PARTITION, select_fields=["response_mask", "loss_mask"])
    folded, expected, sample = _reference(
        batch, mask.settings, ref_mask.diagnostics, ref_mask.spurious_log, ref_mask.tokenizer, mask.spec
    )
    # one fetch of the whole batch (reward info included, token ids not), then the ids of the logged rows only
    assert len(gets) == 2, gets
    assert "extra_fields" in gets[0]["select_fields"] and "responses" not in gets[0]["select_fields"]
    assert gets[1]["select_fields"] == ["responses"] and 0 < len(gets[1]["keys"]) < len(keys)
    assert result.metrics["reward/acc/mean"] == pytest.approx(16 / 48)
    assert result.metrics["actor/stapo/num_spurious"] > 0
    assert result.metrics["actor/stapo/empty_responses"] == 2.0
    for name in ("response_mask", "loss_mask"):
        assert torch.equal(back[name].to_padded_tensor(padding=0), folded), name
        assert back[name].values().dtype == torch.int64
        assert torch.equal(back[name].offsets(), _nested(batch["response_mask"]).offsets())
    assert result.expected_loss_tokens == float(folded.sum())
    got = {k: v for k, v in result.metrics.items() if not k.startswith("reward/")}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if key in FLOAT_SUMS:
            assert got[key] == pytest.approx(value, rel=1e-6), key
        else:
            assert got[key] == value or (math.isnan(got[key]) and math.isnan(value)), (key, got[key], value)
    flat_log = (tmp_path / "flat" / "spurious_tokens.jsonl").read_text()
    assert flat_log and flat_log == (tmp_path / "padded" / "spurious_tokens.jsonl").read_text()
    samples = [json.loads(line) for line in (tmp_path / "flat" / "token_samples.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in s.items() if k != "step"} for s in samples] == sample


def test_a_field_laid_out_differently_is_refused(tmp_path):
    mask = driver_mask(tmp_path)
    rows = [torch.ones(3, dtype=torch.int64), torch.ones(5, dtype=torch.int64)]
    data = TensorDict(
        {
            "response_mask": _nested(rows),
            "loss_mask": _nested(rows),
            "advantages": _nested([torch.ones(4), torch.ones(4)]),  # same total, other row lengths
        },
        batch_size=2,
    )
    plan = StepPlan(True, False, False, False, ("response_mask", "loss_mask", "advantages"))
    with pytest.raises(RuntimeError, match="'advantages' laid out as response_mask"):
        mask.compute(1, plan, data, None, None)


def test_folded_masks_are_jagged_like_verls(tmp_path):
    """What goes to ``kv_batch_put`` pads as verl's ``as_nested_tensor`` masks do (row-length bounds cached)."""
    batch = _batch(rows=12, seed=5)
    mask, ref = driver_mask(tmp_path / "flat"), driver_mask(tmp_path / "padded")
    fields = {name: _nested(values) for name, values in batch.items() if name != "responses"}
    data = TensorDict({**fields, "loss_mask": _nested(batch["response_mask"])}, batch_size=12)
    result = RoundTripResult()
    folded = mask.compute(
        1, mask.plan(1), data, result, _Clock(result.timings), lambda rows: [batch["responses"][r] for r in rows]
    )
    expected, *_ = _reference(batch, mask.settings, ref.diagnostics, ref.spurious_log, ref.tokenizer, mask.spec)
    for name in ("response_mask", "loss_mask"):
        assert torch.equal(folded[name].to_padded_tensor(padding=0), expected), name
