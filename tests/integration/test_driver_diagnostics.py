"""The driver's round trip (``DriverDiagnostics.round_trip``) against a real TransferQueue on a local Ray.

The batch is stored as verl 0.9.1's v1 trainer leaves it (jagged response-only fields, reward info
in ``extra_fields``). The reference is computed independently: every field padded to
``(rows, max_len)``, the mask built on the padded tensors, the diagnostics read from the padded
tensors. Every metric and both run-dir files must match it; the masks in TransferQueue stay as they
were (the actor workers fold the mask, tests/integration/test_shard_mask.py); a step without
diagnostics fetches the reward's extras only. Starts Ray: run under ``flock /tmp/stapo-e2e.lock``
on the shared machine.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from benchmarks.tq_roundtrip import PARTITION, driver_diagnostics, quiet, transfer_queue
from stapo.algorithm.ablation import threshold_grid
from stapo.algorithm.masks import MaskInputs, build_token_mask
from stapo.algorithm.token_sample import token_sample
from stapo.rundir import ENTROPY_TOKEN_MEAN
from stapo.verl_plugin.training.diagnostic_outputs import SpuriousTokenLog
from stapo.verl_plugin.training.driver_diagnostics import ENTROPY_MAX
from tests.integration.jagged_rows import response_rows
from tests.spurious_log_reference import write_padded_log


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _batch(rows: int = 48, seed: int = 3) -> dict[str, list]:
    """Per-row tensors with spurious tokens, an empty row, a row of zero mask and zeros inside a row."""
    return response_rows(rows, seed, max_len=400, specials=(5, 7, 9))


def _padded(rows, value=0):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged).to_padded_tensor(padding=value)


def _reference(batch, settings, diagnostics, log: SpuriousTokenLog, tokenizer):
    """The grid metrics and both files from padded tensors."""
    mask = _padded(batch["response_mask"])
    log_prob, entropy = _padded(batch["old_log_probs"]), _padded(batch["entropy"])
    advantages = _padded(batch["advantages"])
    built = build_token_mask(MaskInputs(mask.bool(), advantages, log_prob, entropy), settings)
    grid = threshold_grid(log_prob, entropy, advantages, mask, diagnostics.tau_ps, diagnostics.qs)
    metrics = {"actor/stapo/ablation/" + k: v for k, v in grid.items()}
    # the mean entropy of a response token, summed token by token in float64 over the unpadded rows
    total, count, largest = 0.0, 0, -math.inf
    for row_entropy, row_mask in zip(batch["entropy"], batch["response_mask"], strict=True):
        for value, kept in zip(row_entropy.tolist(), row_mask.tolist(), strict=True):
            total, count = (total + value, count + 1) if kept else (total, count)
            largest = max(largest, value) if kept else largest
    metrics[ENTROPY_TOKEN_MEAN] = total / count
    metrics[ENTROPY_MAX] = largest  # the tail metrics' largest position (no token stats here: no others)
    padded = {"old_log_probs": log_prob, "entropy": entropy, "response_mask": mask}
    write_padded_log(log, 1, _padded(batch["responses"], tokenizer.pad_token_id), built.drop_response, padded,
                     tokenizer)
    sample = token_sample(log_prob, entropy, advantages, mask, built.drop_response, diagnostics.sample_size)
    return metrics, sample


def _store(tq, batch, keys):
    rows = len(keys)
    fields = {name: _nested(values) for name, values in batch.items()}
    fields["loss_mask"] = _nested([m.clone() for m in batch["response_mask"]])
    fields["extra_fields"] = NonTensorStack(*({"reward_extra_info": {"acc": float(i % 3 == 0)}} for i in range(rows)))
    tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=TensorDict(fields, batch_size=rows))


def _spy(tq, monkeypatch) -> list[dict]:
    gets, real_get = [], tq.kv_batch_get
    monkeypatch.setattr(tq, "kv_batch_get", lambda **kw: gets.append(kw) or real_get(**kw))
    return gets


@pytest.fixture(scope="module")
def tq():
    """One local Ray and TransferQueue for the module's tests (a start-up each costs seconds); each test its keys."""
    with transfer_queue() as started:
        yield started


@pytest.mark.slow  # starts processes: out of make test-fast
def test_round_trip_equals_the_padded_reference(tq, tmp_path, monkeypatch):
    batch = _batch()
    keys = [f"k{i}" for i in range(len(batch["responses"]))]
    driver = driver_diagnostics(tmp_path / "flat")
    ref = driver_diagnostics(tmp_path / "padded")
    _store(tq, batch, keys)
    with monkeypatch.context() as patch:
        gets, puts = _spy(tq, patch), []
        patch.setattr(tq, "kv_batch_put", lambda **kw: puts.append(kw))
        result = driver.round_trip(1, keys, PARTITION)
    back = tq.kv_batch_get(keys=keys, partition_id=PARTITION, select_fields=["response_mask", "loss_mask"])
    expected, sample = _reference(batch, driver.settings, ref.diagnostics, ref.spurious_log, ref.tokenizer)
    # one fetch of the whole batch (reward info included, token ids not), then the ids of the logged rows only
    assert len(gets) == 2, gets
    assert "extra_fields" in gets[0]["select_fields"] and "responses" not in gets[0]["select_fields"]
    assert gets[1]["select_fields"] == ["responses"] and 0 < len(gets[1]["keys"]) < len(keys)
    assert puts == []  # the workers fold the mask: the stored masks stay as the rollout left them
    for name in ("response_mask", "loss_mask"):
        assert torch.equal(back[name].to_padded_tensor(padding=0), _padded(batch["response_mask"])), name
    assert result.metrics["reward/acc/mean"] == pytest.approx(16 / 48)
    got = {k: v for k, v in result.metrics.items() if not k.startswith("reward/")}
    assert got.keys() == expected.keys()
    assert got.pop(ENTROPY_TOKEN_MEAN) == pytest.approx(expected.pop(ENTROPY_TOKEN_MEAN), rel=1e-12, abs=0)
    for key, value in expected.items():
        assert got[key] == value or (math.isnan(got[key]) and math.isnan(value)), (key, got[key], value)
    flat_log = (tmp_path / "flat" / "spurious_tokens.jsonl").read_text()
    assert flat_log and flat_log == (tmp_path / "padded" / "spurious_tokens.jsonl").read_text()
    samples = [json.loads(line) for line in (tmp_path / "flat" / "token_samples.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in s.items() if k != "step"} for s in samples] == sample
    assert any(s["silenced"] for s in sample)


@pytest.mark.slow  # starts processes: out of make test-fast
def test_a_step_without_diagnostics_fetches_the_reward_extras_only(tq, tmp_path, monkeypatch):
    batch = _batch(rows=12, seed=5)
    keys = [f"quiet{i}" for i in range(12)]
    quiet_driver = quiet(driver_diagnostics(tmp_path))
    _store(tq, batch, keys)
    gets = _spy(tq, monkeypatch)
    result = quiet_driver.round_trip(3, keys, PARTITION)
    assert [g["select_fields"] for g in gets] == [["extra_fields"]]
    assert result.metrics.keys() == {"reward/acc/mean"}
