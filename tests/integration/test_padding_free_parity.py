"""Padding-free and padded batches give the same per-token log-probs, entropies and S2T mask.

verl's FSDP engine runs the actor's forward one of two ways, chosen by ``model.use_remove_padding``: every row of
a micro-batch packed into one sequence (the GPU presets' way; attention is kept within each row by its position
ids), or rows padded to a rectangle with an attention mask (the tiny CPU presets'). Here both run verl's own
``FSDPEngineWithLMHead.forward_step`` (inputs, autocast, model, log-probs and entropy from the logits) on the same
micro-batch of ragged rows through the tiny Qwen3 with sdpa attention, in one process without FSDP (a sharded
model on one rank computes the same forward), and the S2T mask is built from each.

Tolerances, stated per precision (measured on the tiny model in the comments; a row that attends across the
packing boundary or a shifted label is off by O(1), far above them):
- float32, no autocast: 1e-5 on log-probs and entropies (measured at most 1.9e-6 over seeds 0-2), the same mask.
- bf16 autocast (verl's default ``mixed_precision``): the two paths run different matmul shapes in bf16, so
  log-probs and entropies agree to a few bf16 steps: 0.1 (measured: log-probs equal, entropies up to 0.031 =
  one bf16 step at 4 nats) and the mask may flip only tokens within those differences of tau_p or tau_h
  (measured: none flipped).
The compiled ``entropy_from_logits`` (verl's ``use_torch_compile``) is not used here (a compile costs most of a
minute on 2 cores); the GPU-preset parity run (tests/e2e/test_gpu_preset_parity.py) runs it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl")

from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask
from stapo.models.local import resolve_model_path

SETTINGS = MaskSettings(token_mask="stapo", tau_p=0.002, entropy_quantile=0.75)
FP32_TOL = 1e-5
BF16_TOL = 0.1


def engine_for(model, compiled: bool = False, autocast_dtype=torch.float32):
    """verl's FSDPEngineWithLMHead around a plain module: only the fields its forward_step reads."""
    from verl.utils import torch_functional as verl_F
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    engine = object.__new__(FSDPEngineWithLMHead)
    entropy = torch.compile(verl_F.entropy_from_logits, dynamic=True) if compiled else verl_F.entropy_from_logits
    engine.__dict__.update(
        module=model, use_ulysses_sp=False, ulysses_sequence_parallel_size=1, pad_to_length=False,
        pad_to_length_bucket=1024, compute_entropy_from_logits=entropy, _autocast_dtype=autocast_dtype,
        engine_config=SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False,
                                      entropy_from_logits_chunk_size=2048, use_torch_compile=compiled),
    )
    return engine


def ragged_batch(seed: int, vocab: int, rows: int = 6):
    """Nested prompt+response rows of unequal lengths, as verl's v1 trainer hands them to the engine."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, 30, (rows,), generator=g).tolist()
    responses = torch.randint(1, 17, (rows,), generator=g).tolist()
    ids = [torch.randint(0, vocab, (p + r,), generator=g) for p, r in zip(prompts, responses)]

    def nested(values):
        return torch.nested.as_nested_tensor(values, layout=torch.jagged)

    data = TensorDict(
        {
            "input_ids": nested(ids),
            "position_ids": nested([torch.arange(len(row)) for row in ids]),
            "prompts": nested([row[:p] for row, p in zip(ids, prompts)]),
            "responses": nested([row[p:] for row, p in zip(ids, prompts)]),
            "attention_mask": nested([torch.ones(len(row), dtype=torch.long) for row in ids]),
            "response_mask": nested([torch.ones(r, dtype=torch.long) for r in responses]),
        },
        batch_size=rows,
    )
    tu.assign_non_tensor(data, temperature=1.0, calculate_entropy=True)
    return data, prompts, responses


def forward(engine, data, remove_padding: bool):
    """Per-row response log-probs and entropies from verl's forward_step (padded to the longest response)."""
    from verl.utils import tensordict_utils as tu

    batch = data.clone()
    tu.assign_non_tensor(batch, use_remove_padding=remove_padding)
    with torch.no_grad():
        _, output = engine.forward_step(batch, loss_function=None, forward_only=True)
    out = output["model_output"]
    return out["log_probs"], out["entropy"]


def response_part(values, prompts, responses) -> tuple[torch.Tensor, torch.Tensor]:
    """The response positions of each row (verl's output at position t scores token t + 1), padded, and the mask."""
    width = max(responses)
    rows = values.unbind() if getattr(values, "is_nested", False) else list(values)
    padded = torch.zeros(len(rows), width, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (row, p, r) in enumerate(zip(rows, prompts, responses)):
        padded[i, :r] = row[p - 1 : p - 1 + r].double()
        mask[i, :r] = True
    return padded, mask


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoModelForCausalLM
    from verl.workers.engine.fsdp import transformer_impl

    from stapo.verl_plugin.cpu import patches

    with pytest.MonkeyPatch.context() as patch:
        # the CPU back-end's log-prob head in verl's engine module, as in a CPU run
        patch.setattr(transformer_impl, "logprobs_from_logits", patches.logprobs_of_labels)
        # the device verl's engine module asks its platform for (the CPU back-end's platform answers "cpu" in a run;
        # this process keeps verl's default platform, so the two names the forward reads are set here)
        patch.setattr(transformer_impl, "get_device_id", lambda: "cpu")
        patch.setattr(transformer_impl, "get_device_name", lambda: "cpu")
        yield AutoModelForCausalLM.from_pretrained(
            resolve_model_path("stapo://tiny"), dtype=torch.float32, attn_implementation="sdpa").eval()


def both_paths(model, seed: int, autocast_dtype, compiled: bool = False):
    data, prompts, responses = ragged_batch(seed, model.config.vocab_size)
    engine = engine_for(model, compiled=compiled, autocast_dtype=autocast_dtype)
    results = {}
    for remove_padding in (True, False):
        log_prob, entropy = forward(engine, data, remove_padding)
        lp, mask = response_part(log_prob, prompts, responses)
        h, _ = response_part(entropy, prompts, responses)
        results[remove_padding] = (lp, h, mask)
    g = torch.Generator().manual_seed(100 + seed)
    advantages = torch.randn(len(prompts), 1, generator=g, dtype=torch.float64).expand_as(results[True][0])
    return results, advantages


def s2t(lp, h, mask, advantages):
    return build_token_mask(MaskInputs(mask, advantages, lp, h), SETTINGS)


def reference_forward(model, data, prompts, responses):
    """Each row alone through the HF model (fp32), log-softmax and entropy in float64: per token."""
    lps, hs = [], []
    for row in data["input_ids"].unbind():
        with torch.no_grad():
            logits = model(input_ids=row[None]).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        lps.append(torch.cat([logp[:-1].gather(-1, row[1:, None]).squeeze(-1), torch.zeros(1, dtype=torch.float64)]))
        hs.append(-(logp.exp() * logp).sum(-1))
    return response_part(lps, prompts, responses)[0], response_part(hs, prompts, responses)[0]


@pytest.mark.parametrize("seed", range(3))
def test_fp32_padding_free_equals_padded_and_each_row_alone(tiny_model, seed):
    results, advantages = both_paths(tiny_model, seed, torch.float32)
    (lp_free, h_free, mask), (lp_pad, h_pad, mask_pad) = results[True], results[False]
    assert torch.equal(mask, mask_pad)
    assert (lp_free - lp_pad)[mask].abs().max() < FP32_TOL
    assert (h_free - h_pad)[mask].abs().max() < FP32_TOL
    # an independent reference: each row alone, log-softmax in float64 (a packed row attending past its own
    # start, or an off-by-one label, would miss by O(1))
    data, prompts, responses = ragged_batch(seed, tiny_model.config.vocab_size)
    lp_ref, h_ref = reference_forward(tiny_model, data, prompts, responses)
    assert (lp_free - lp_ref)[mask].abs().max() < FP32_TOL
    assert (h_free - h_ref)[mask].abs().max() < FP32_TOL
    free, pad = s2t(lp_free, h_free, mask, advantages), s2t(lp_pad, h_pad, mask, advantages)
    assert torch.equal(free.drop_response, pad.drop_response) and torch.equal(free.drop_count, pad.drop_count)
    assert free.counts["num_spurious"] == pad.counts["num_spurious"] > 0, free.counts
    assert free.stats["tau_h"] == pytest.approx(pad.stats["tau_h"], abs=FP32_TOL)


@pytest.mark.parametrize("seed", range(3))
def test_bf16_autocast_paths_agree_within_bf16_rounding(tiny_model, seed):
    results, advantages = both_paths(tiny_model, seed, torch.bfloat16)
    (lp_free, h_free, mask), (lp_pad, h_pad, _) = results[True], results[False]
    dlp, dh = (lp_free - lp_pad)[mask].abs().max(), (h_free - h_pad)[mask].abs().max()
    assert dlp < BF16_TOL and dh < BF16_TOL, (float(dlp), float(dh))
    free, pad = s2t(lp_free, h_free, mask, advantages), s2t(lp_pad, h_pad, mask, advantages)
    flipped = (free.drop_response ^ pad.drop_response) & mask
    if flipped.any():
        # only where bf16 cannot tell the sides apart: p within the measured difference of tau_p, or H within
        # the measured difference of either path's tau_h
        near_p = (lp_free - math.log(SETTINGS.tau_p)).abs() <= dlp
        tau_h = [s.stats["tau_h"] for s in (free, pad)]
        near_h = torch.zeros_like(mask)
        for threshold in tau_h:
            near_h |= (h_free - threshold).abs() <= dh + abs(tau_h[0] - tau_h[1])
        assert bool((near_p | near_h)[flipped].all()), flipped.nonzero().tolist()
    assert int(flipped.sum()) <= max(2, int(0.05 * int(free.drop_response.sum()))), int(flipped.sum())
