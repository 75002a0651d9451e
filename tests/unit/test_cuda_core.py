"""The algorithm's core on a CUDA device, against the same float64 loop references as on CPU.

The trainer builds the mask on the driver's CPU, but the loss, the entropy the mask reads and, in the
actor, every tensor the objective touches live on the GPU: a kernel that orders a reduction differently,
a sort that breaks ties otherwise or a dtype promoted another way would change which tokens are silenced.
These tests need a CUDA device, so CI (no GPU) skips them; they run on a lent GPU machine with
``python3 -m pytest --noconftest tests/unit/test_cuda_core.py`` (BENCHMARKS.md records the last run).
Nothing is mocked: without a GPU they do not run at all.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from stapo.algorithm.loss import masked_pg_losses
from stapo.algorithm.masks import TOKEN_MASK_REGISTRY, MaskInputs, MaskSettings, build_token_mask
from stapo.algorithm.quantile import linear_quantile
from stapo.algorithm.s2t import detect_spurious
from tests.reference import REFERENCES, reference_masked_loss, reference_spurious
from tests.unit.test_loss import CLIP, with_old_policy
from tests.unit.test_masks import CASES, SETTINGS, assert_matches_reference, mask_inputs
from tests.unit.test_s2t import random_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none)")
CUDA = "cuda"


def on_cuda(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    return {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).to(CUDA) for k, v in tensors.items()}


@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "other", "edges"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", sorted(TOKEN_MASK_REGISTRY))
def test_every_registered_mask_on_cuda_equals_its_loop_reference(name, case, settings):
    chosen = MaskSettings(token_mask=name, **settings)
    for seed in range(3):
        tensors = mask_inputs(seed, case)
        built = build_token_mask(MaskInputs(**on_cuda(tensors)), chosen)
        assert built.drop_response.device.type == CUDA
        as_lists = {key: value.tolist() for key, value in tensors.items()}
        assert_matches_reference(built, REFERENCES[name](as_lists, dataclasses.asdict(chosen)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(TOKEN_MASK_REGISTRY))
def test_masks_from_low_precision_cuda_tensors_equal_the_cpu_build(name, dtype):
    """The same float32 / bf16 values give the same mask on CUDA as on CPU; float32 also the reference's on those
    values (bf16's own exp may put a p on the other side of tau_p than float64's: tests/unit/test_bf16_mask.py)."""
    settings = MaskSettings(token_mask=name)
    for seed in range(4):
        tensors = mask_inputs(70 + seed, "random", rows=32, cols=96)
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
        on_gpu = build_token_mask(MaskInputs(**on_cuda(tensors)), settings)
        on_cpu = build_token_mask(MaskInputs(**tensors), settings)
        assert torch.equal(on_gpu.drop_response.cpu(), on_cpu.drop_response)
        assert torch.equal(on_gpu.drop_count.cpu(), on_cpu.drop_count)
        if dtype == torch.bfloat16:
            continue
        as_lists = {k: (v.double() if v.is_floating_point() else v).tolist() for k, v in tensors.items()}
        expected = REFERENCES[name](as_lists, dataclasses.asdict(settings))
        assert on_gpu.drop_response.tolist() == expected["drop_response"]


@pytest.mark.parametrize("seed", range(4))
def test_detect_spurious_on_cuda_matches_the_loop_reference(seed):
    log_prob, entropy, advantages, response_mask = random_batch(seed, 24, 64)
    on_gpu = (t.to(CUDA) for t in (log_prob, entropy, advantages, response_mask))
    detection = detect_spurious(*on_gpu, tau_p=0.002, entropy_quantile=0.75)
    want, tau_h = reference_spurious(
        log_prob.tolist(), entropy.tolist(), advantages.tolist(), response_mask.tolist(), 0.002, 0.75
    )
    assert detection.spurious.device.type == CUDA and detection.spurious.tolist() == want
    assert detection.tau_h == tau_h  # bit-exact with numpy's linear method, as on CPU
    assert detection.num_candidates > 10


@pytest.mark.parametrize("seed", range(3))
def test_masked_pg_losses_and_gradient_on_cuda_match_the_loop_reference(seed):
    old_lp, lp, adv, mask, _ = with_old_policy(seed)
    old_lp, lp, adv, mask = (t.to(CUDA) for t in (old_lp, lp, adv, mask))
    leaf = lp.clone().requires_grad_(True)
    losses, _ = masked_pg_losses(old_lp, leaf, adv, mask, **CLIP)
    losses.sum().backward()
    total, grad = reference_masked_loss(old_lp.tolist(), lp.tolist(), adv.tolist(), mask.tolist(), 1)
    assert float(losses.sum().detach()) == pytest.approx(total, rel=1e-12)
    np.testing.assert_allclose(leaf.grad.cpu().numpy(), np.array(grad), rtol=1e-10, atol=1e-15)
    assert (leaf.grad[~mask] == 0).all()


@pytest.mark.parametrize("n", [1, 2, 17, 1000, 20_000_000])
def test_linear_quantile_on_cuda_is_numpys(n):
    """Up to 20M values: above torch.quantile's 16M-element limit, where a long-CoT batch's candidates can be."""
    values = torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    for q in (0.0, 0.2, 0.75, 1.0):
        got = linear_quantile(values.to(CUDA), q)
        assert float(got) == float(np.quantile(values.numpy(), q)), (n, q)


@pytest.mark.parametrize("name", ["stapo", "entropy20"])
def test_a_mask_in_parts_on_cuda_equals_the_cpu_build(name):
    """The paper's per-mini-batch scope (``build_token_mask_in_parts``) on CUDA tensors and on CPU: the same
    dropped tokens, counts and thresholds (part 1 empty, as a rank without rows of a mini-batch)."""
    from stapo.algorithm.masks import build_token_mask_in_parts

    tensors = mask_inputs(3, "ties")
    part = torch.where(torch.rand(tensors["response_mask"].shape, generator=torch.Generator().manual_seed(3)) < 0.5,
                       0, 2)
    settings = MaskSettings(token_mask=name, threshold_scope="mini_batch")
    cpu = build_token_mask_in_parts(MaskInputs(**tensors), settings, part, 3)
    gpu = build_token_mask_in_parts(MaskInputs(**on_cuda(tensors)), settings, part.to(CUDA), 3)
    assert torch.equal(gpu.drop_response.cpu(), cpu.drop_response)
    assert torch.equal(gpu.drop_count.cpu(), cpu.drop_count)
    assert gpu.counts.keys() == cpu.counts.keys()
    for key, value in cpu.counts.items():
        assert gpu.counts[key] == pytest.approx(value, rel=1e-9), key
    for key, value in cpu.stats.items():
        assert gpu.stats[key] == pytest.approx(value, rel=1e-6, nan_ok=True), key
