"""fp32 vs bf16 agree on the S2T mask (bf16 on the CPU back-end).

What "agree" can mean when bf16 rounds p and H:

1. **Identical inputs** -- log-probs, entropies and advantages that bf16 represents exactly (fp32 values
   rounded through bf16), built once as fp32 tensors and once as bf16 tensors: the masks are identical,
   token for token, as long as no token's probability lies within bf16's rounding of ``exp`` around
   ``tau_p`` (``exp`` of the same log-prob in bf16 and fp32 may land on either side of tau_p; the inputs
   keep every p at least 5 % away from tau_p). tau_h is a quantile of exactly equal entropies, so the
   entropy side cannot differ.
2. **A real model's forward** in fp32 vs under ``torch.autocast("cpu", bfloat16)`` (what verl's FSDP
   engine does when ``mixed_precision.param_dtype=bf16``): p and H differ by bf16 rounding of the logits,
   so tokens near tau_p or near tau_h can flip. Measured on the tiny Qwen3 (4 x 64 response tokens, seed
   0): 4 of 113 spurious tokens flip (``MAX_FLIPS`` allows 6); every flipped token sits within the
   measured |dH| of tau_h or within the measured |dp| of tau_p, i.e. the difference is only where bf16
   cannot tell the sides apart.
"""

from __future__ import annotations

import math

import torch

from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask
from stapo.models.local import resolve_model_path

SETTINGS = MaskSettings(token_mask="stapo")
MAX_FLIPS = 6  # measured 4 (of 113 spurious, max|dp| 1.0e-2, max|dH| 0.11) on an AVX2 CPU; slack for others


def bf16_exact_inputs(seed: int, rows: int = 16, cols: int = 48) -> tuple[torch.Tensor, ...]:
    """fp32 tensors whose values bf16 represents exactly; p kept >= 5 % away from tau_p."""
    g = torch.Generator().manual_seed(seed)
    log_prob = torch.empty(rows, cols).uniform_(math.log(1e-5), 0.0, generator=g)
    near = (log_prob - math.log(SETTINGS.tau_p)).abs() < 0.05
    log_prob = torch.where(near, log_prob - 0.2, log_prob)
    entropy = torch.empty(rows, cols).uniform_(0.0, 4.0, generator=g)
    advantages = torch.randn(rows, 1, generator=g).expand(rows, cols).contiguous()
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    mask = torch.arange(cols)[None, :] < lengths[:, None]
    log_prob, entropy, advantages = (t.to(torch.bfloat16).float() for t in (log_prob, entropy, advantages))
    return mask, advantages, log_prob, entropy


def build(mask, advantages, log_prob, entropy, dtype):
    inputs = MaskInputs(mask, advantages.to(dtype), log_prob.to(dtype), entropy.to(dtype))
    return build_token_mask(inputs, SETTINGS)


def test_identical_bf16_exact_inputs_give_identical_masks():
    for seed in range(5):
        mask, advantages, log_prob, entropy = bf16_exact_inputs(seed)
        fp32 = build(mask, advantages, log_prob, entropy, torch.float32)
        bf16 = build(mask, advantages, log_prob, entropy, torch.bfloat16)
        assert fp32.counts["num_spurious"] > 0, "inputs must exercise the mask"
        assert torch.equal(fp32.drop_response, bf16.drop_response)
        assert torch.equal(fp32.drop_count, bf16.drop_count)
        assert fp32.stats["tau_h"] == bf16.stats["tau_h"]


def tiny_forward(model, ids: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``ids[:, 1:]`` and entropies as verl's FSDP engine computes them: inside the autocast
    region, in the logits' dtype (bf16 under autocast: verl does not upcast), then widened to fp32."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits[:, :-1]
        log_prob = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    return log_prob.float(), entropy.float()


def test_real_forward_fp32_vs_bf16_autocast():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("stapo://tiny"), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (4, 65), generator=g)
    lp32, h32 = tiny_forward(model, ids, autocast=False)
    lp16, h16 = tiny_forward(model, ids, autocast=True)
    mask = torch.ones_like(lp32, dtype=torch.bool)
    advantages = torch.tensor([[1.0], [0.5], [-1.0], [2.0]]).expand_as(lp32).contiguous()
    fp32 = build_token_mask(MaskInputs(mask, advantages, lp32, h32), SETTINGS)
    bf16 = build_token_mask(MaskInputs(mask, advantages, lp16, h16), SETTINGS)
    flips = fp32.drop_response ^ bf16.drop_response
    dp = (lp32.exp() - lp16.exp()).abs().max().item()
    dh = (h32 - h16).abs().max().item()
    print(f"flips={int(flips.sum())} of {fp32.counts['num_spurious']:.0f} spurious; max|dp|={dp:.2e} "
          f"max|dH|={dh:.2e} tau_h fp32={fp32.stats['tau_h']:.4f} bf16={bf16.stats['tau_h']:.4f}")
    assert fp32.counts["num_spurious"] > 0
    assert int(flips.sum()) <= MAX_FLIPS
    near_p = (lp32.exp() - SETTINGS.tau_p).abs() <= dp
    near_h = (h32 - fp32.stats["tau_h"]).abs() <= dh + abs(fp32.stats["tau_h"] - bf16.stats["tau_h"])
    assert bool((near_p | near_h)[flips].all()), "a token far from both thresholds changed sides"
