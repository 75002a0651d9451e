"""The CPU back-end's log-probabilities of the sampled tokens (stapo/verl_plugin/cpu/patches.py): the values and
gradients of verl's own row-by-row fallback, bit for bit with one thread, and the float64 truth."""

from __future__ import annotations

import pytest
import torch
from verl.utils.torch_functional import logprobs_from_logits_v2

from stapo.verl_plugin.cpu import patches


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run (Ray gives each one CPU)
    yield
    torch.set_num_threads(threads)


def _value_and_grad(fn, logits, labels, weights):
    leaf = logits.clone().requires_grad_(True)
    out = fn(leaf, labels)
    (out * weights).sum().backward()
    return out.detach(), leaf.grad


def _float64_loop(logits, labels):
    """Each row on its own, in float64, through log_softmax rather than logsumexp."""
    rows = logits.reshape(-1, logits.shape[-1]).double()
    flat = labels.reshape(-1)
    return torch.stack([torch.log_softmax(rows[i], dim=0)[flat[i]] for i in range(rows.shape[0])]).view(labels.shape)


@pytest.mark.parametrize(
    "shape, chunk",
    [
        ((2500, 27), 1 << 24),  # a testbed micro-batch of packed tokens, one chunk
        ((700, 4096), 1 << 24),  # the tailbed's vocabulary
        ((301, 50), 333),  # chunks of 6 rows, the last one short
        ((1, 7), 1 << 24),  # one token
        ((4, 33, 11), 100),  # (batch, seq, vocab) without remove-padding
        ((5, 9), 1),  # a row wider than a chunk: one row a chunk
    ],
)
def test_equals_verls_row_by_row_fallback_bit_for_bit(shape, chunk, one_thread, monkeypatch):
    monkeypatch.setattr(patches, "LOGSUMEXP_CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(sum(shape) + chunk)
    logits = torch.randn(*shape, generator=g) * 4
    labels = torch.randint(0, shape[-1], shape[:-1], generator=g)
    weights = torch.randn(*shape[:-1], generator=g)
    ours, ours_grad = _value_and_grad(patches.logprobs_of_labels, logits, labels, weights)
    verls, verls_grad = _value_and_grad(logprobs_from_logits_v2, logits, labels, weights)
    assert ours.shape == labels.shape
    assert torch.equal(ours, verls) and torch.equal(ours_grad, verls_grad)
    torch.testing.assert_close(ours.double(), _float64_loop(logits, labels), rtol=0, atol=1e-5)


def test_ties_and_extreme_logits_match_float64():
    logits = torch.tensor([[0.0, 0.0, 0.0], [80.0, -80.0, 80.0], [-1e4, 0.0, -1e4], [5.0, 5.0, -30.0]])
    labels = torch.tensor([1, 1, 0, 2])
    torch.testing.assert_close(patches.logprobs_of_labels(logits, labels).double(), _float64_loop(logits, labels))


def test_no_rows_give_an_empty_result():
    out = patches.logprobs_of_labels(torch.empty(0, 27), torch.empty(0, dtype=torch.long))
    assert out.shape == (0,)


def test_half_precision_takes_log_softmax_as_verl_does(one_thread):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(64, 40, generator=g) * 3).bfloat16()
    labels = torch.randint(0, 40, (64,), generator=g)
    ours = patches.logprobs_of_labels(logits, labels)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, logprobs_from_logits_v2(logits, labels))


def test_the_cpu_back_end_routes_the_fsdp_engine_through_it(monkeypatch):
    from verl.workers import engine_workers
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    # apply() as a worker runs it, on module attributes put back after the test
    monkeypatch.setattr(transformer_impl, "_stapo_cpu_patched", False, raising=False)
    for name in ("logprobs_from_logits", "CPUOffloadPolicy"):
        monkeypatch.setattr(transformer_impl, name, getattr(transformer_impl, name))
    monkeypatch.setattr(engine_workers, "initialize_global_process_group_ray",
                        engine_workers.initialize_global_process_group_ray)
    monkeypatch.setattr(EngineRegistry, "_engines", {k: {b: dict(d) for b, d in v.items()}
                                                      for k, v in EngineRegistry._engines.items()})
    patches.apply()
    assert transformer_impl.logprobs_from_logits is patches.logprobs_of_labels
