"""Mask building for ``source: old`` on one whole batch of the paper's size, once per step.

The STAPO trainer (``stapo/verl_plugin/trainer.py``) builds the S2T mask on the driver from the
padded ``(responses, max_len)`` old log-probs, old entropy and advantages that verl already
computed, then folds it into the masks. This times ``detect_spurious`` + ``s2t_diagnostics`` on such
a batch (and the fold) and measures their peak tensor memory; the yardstick is verl's old-log-prob
pass over the same tokens (``benchmarks/old_pass.py``).

Length distribution: the paper samples 256 prompts x 8 responses with up to 15k response tokens.
``realistic`` draws lengths from a log-normal (median 3,500 tokens, sigma 0.75) cut at the
maximum, so a few percent of the responses are truncated, which is how long-CoT RL batches look;
``all_max`` puts every response at the maximum (the padded worst case: 31.5M tokens).
"""

from __future__ import annotations

import math
import time

import torch

from benchmarks.common import Samples, measure_memory, rss_kib, rss_peak_reset, sync
from stapo.s2t import detect_spurious, s2t_diagnostics
from stapo.verl_plugin.trainer import fold_masks

TAU_P, Q = 0.002, 0.75
LOW_PROB_SHARE = 3e-4  # tokens sampled below tau_p: gives a mask ratio near the paper's 1e-4
PROMPT_LEN = 256  # for the attention term of the old-pass estimate (DAPO-Math prompts with the template)


def response_lengths(responses: int, max_len: int, distribution: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if distribution == "all_max":
        return torch.full((responses,), max_len)
    if distribution != "realistic":
        raise ValueError(f"unknown length distribution {distribution!r}")
    median = 3500 * max_len / 15360
    lengths = torch.exp(math.log(median) + 0.75 * torch.randn(responses, generator=g))
    return lengths.round().long().clamp(16, max_len)


def paper_batch(responses: int, max_len: int, distribution: str = "realistic", seed: int = 0):
    """Padded old log-probs, old entropy, token-level advantages, response mask and the lengths.

    Per token: confident samples (log p ~ -Exp(mean 0.25), entropy ~ Exp(mean 0.5)) and a share
    ``LOW_PROB_SHARE`` sampled below tau_p at positions with entropy uniform in [0, 4], calibrated so
    the mask ratio comes out near the paper's 1e-4. Advantages: one value per response, uniform in
    [-1, 1] (about half positive), zero on padding.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = response_lengths(responses, max_len, distribution, seed)
    mask = (torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)).long()
    log_prob = -torch.empty(responses, max_len).exponential_(4.0, generator=g)
    entropy = torch.empty(responses, max_len).exponential_(2.0, generator=g)
    tail = torch.rand(responses, max_len, generator=g) < LOW_PROB_SHARE
    count = int(tail.sum())
    log_prob[tail] = torch.empty(count).uniform_(math.log(1e-7), math.log(TAU_P), generator=g)
    entropy[tail] = torch.rand(count, generator=g) * 4.0
    advantages = (torch.rand(responses, generator=g) * 2 - 1).unsqueeze(1) * mask  # token-level, 0 on padding
    log_prob, entropy = log_prob * mask, entropy * mask
    return log_prob, entropy, advantages, mask, lengths


def _build(log_prob, entropy, advantages, mask):
    detection = detect_spurious(log_prob, entropy, advantages, mask, tau_p=TAU_P, entropy_quantile=Q)
    return detection


def run(
    responses: int = 2048,
    max_len: int = 15360,
    distributions: tuple[str, ...] = ("realistic", "all_max"),
    repeats: int = 3,
    device: torch.device | str = "cpu",
    memory: bool = True,
) -> list[dict]:
    device = torch.device(device)
    results = []
    for distribution in distributions:
        batch = paper_batch(responses, max_len, distribution)
        log_prob, entropy, advantages, mask, lengths = (t.to(device) for t in batch)
        parts = {"detect": Samples(), "diagnostics": Samples(), "fold": Samples(), "total": Samples()}
        rss_peak_reset()
        rss_before, _ = rss_kib()
        detection = None
        for round_index in range(repeats + 1):  # the first round warms up
            sync(device)
            t0 = time.perf_counter()
            detection = _build(log_prob, entropy, advantages, mask)
            sync(device)
            t1 = time.perf_counter()
            metrics = s2t_diagnostics(detection, log_prob, entropy, advantages, mask, TAU_P)
            sync(device)
            t2 = time.perf_counter()
            fold_masks(mask, mask, detection.spurious, detection.spurious)
            sync(device)
            t3 = time.perf_counter()
            if round_index:
                parts["detect"].values.append(t1 - t0)
                parts["diagnostics"].values.append(t2 - t1)
                parts["fold"].values.append(t3 - t2)
                parts["total"].values.append(t3 - t0)
        _, rss_peak = rss_kib()
        row = {
            "bench": "mask",
            "distribution": distribution,
            "responses": responses,
            "max_len": max_len,
            "tokens": int(mask.sum()),
            "mean_len": float(lengths.float().mean()),
            "truncated_share": float((lengths == max_len).float().mean()),
            "candidates": detection.num_candidates,
            "masked": int(detection.spurious.sum()),
            "mask_ratio": metrics["mask_ratio"],
            "tau_h": detection.tau_h,
            "input_bytes": sum(t.element_size() * t.numel() for t in (log_prob, entropy, advantages, mask)),
            "rss_peak_delta_bytes": 1024 * (rss_peak - rss_before) if rss_peak else None,
            "sum_pos_tokens": int(lengths.sum()),
            "lengths": lengths.tolist(),
        }
        for name, samples in parts.items():
            row[f"{name}_s"] = samples.median
            row[f"{name}_spread"] = samples.spread
        if memory:

            def prepare(lp=log_prob, h=entropy, a=advantages, m=mask):
                def go():
                    d = _build(lp, h, a, m)
                    s2t_diagnostics(d, lp, h, a, m, TAU_P)
                    fold_masks(m, m, d.spurious, d.spurious)

                return go

            mem = measure_memory(prepare, device)
            row["peak_tensor_bytes"] = mem.peak_tensor_bytes
            row["cuda_peak_bytes"] = mem.cuda_peak_bytes
        results.append(row)
        del log_prob, entropy, advantages, mask, detection
    return results
