"""Mask building for ``source: old`` on one whole batch of the paper's size, once per step.

The STAPO trainer (``stapo/verl_plugin/training/trainer.py``) builds the S2T mask on the driver from the
padded ``(responses, max_len)`` old log-probs, old entropy and advantages that verl already
computed, then folds it into the masks. This times, on such a batch: ``detect_spurious`` alone
(``detect``), the registry's ``stapo`` entry with every diagnostic (``diagnostics``: detection
included, i.e. what the trainer calls), the threshold-ablation grid (``grid``, 5 tau_p x 4 q for
both advantage signs) and the fold, and measures their peak tensor memory; ``total`` is what a step
pays: diagnostics + grid + fold. The yardstick is verl's old-log-prob pass over the same tokens
(``benchmarks/old_pass.py``).

Length distribution: the paper samples 256 prompts x 8 responses with up to 15k response tokens.
``realistic`` draws lengths from a log-normal (median 3,500 tokens, sigma 0.75) cut at the
maximum, so a few percent of the responses are truncated, which is how long-CoT RL batches look;
``all_max`` puts every response at the maximum (the padded worst case: 31.5M tokens).
"""

from __future__ import annotations

import math
import time

import torch

from benchmarks.common import Samples, fmt_bytes, fmt_num, md_row, measure_memory, rss_kib, rss_peak_reset, sync
from benchmarks.old_pass import PassCost
from stapo.algorithm.ablation import threshold_grid
from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask
from stapo.algorithm.s2t import detect_spurious

try:  # the fold is verl's layout (stapo.verl_plugin imports verl); a lent GPU machine has no verl: fold n/a
    from stapo.verl_plugin.training.jagged import fold_masks
except ImportError:
    fold_masks = None

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


SETTINGS = MaskSettings(token_mask="stapo", tau_p=TAU_P, entropy_quantile=Q)


def _build(log_prob, entropy, advantages, mask):
    return build_token_mask(MaskInputs(mask, advantages, log_prob, entropy), SETTINGS)


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
        parts = {name: Samples() for name in ("detect", "diagnostics", "grid", "fold", "total")}
        rss_peak_reset()
        rss_before, _ = rss_kib()
        built = None
        for round_index in range(repeats + 1):  # the first round warms up
            sync(device)
            t0 = time.perf_counter()
            detect_spurious(log_prob, entropy, advantages, mask, tau_p=TAU_P, entropy_quantile=Q)
            sync(device)
            t1 = time.perf_counter()
            built = _build(log_prob, entropy, advantages, mask)
            sync(device)
            t2 = time.perf_counter()
            threshold_grid(log_prob, entropy, advantages, mask)
            sync(device)
            t3 = time.perf_counter()
            if fold_masks is not None:
                fold_masks(mask, mask, built.drop_response, built.drop_count)
            sync(device)
            t4 = time.perf_counter()
            if round_index:
                parts["detect"].values.append(t1 - t0)
                parts["diagnostics"].values.append(t2 - t1)
                parts["grid"].values.append(t3 - t2)
                if fold_masks is not None:
                    parts["fold"].values.append(t4 - t3)
                parts["total"].values.append(t4 - t1)
        _, rss_peak = rss_kib()
        row = {
            "bench": "mask",
            "distribution": distribution,
            "responses": responses,
            "max_len": max_len,
            "tokens": int(mask.sum()),
            "mean_len": float(lengths.float().mean()),
            "truncated_share": float((lengths == max_len).float().mean()),
            "candidates": int(built.counts["num_candidates"]),
            "masked": int(built.counts["num_spurious"]),
            "mask_ratio": built.counts["num_spurious"] / max(built.counts["num_response_tokens"], 1.0),
            "tau_h": built.stats["tau_h"],
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
                    b = _build(lp, h, a, m)
                    threshold_grid(lp, h, a, m)
                    if fold_masks is not None:
                        fold_masks(m, m, b.drop_response, b.drop_count)

                return go

            mem = measure_memory(prepare, device)
            row["peak_tensor_bytes"] = mem.peak_tensor_bytes
            row["cuda_peak_bytes"] = mem.cuda_peak_bytes
        results.append(row)
        del log_prob, entropy, advantages, mask, built
    return results


# ---------------------------------------------------------------- its section of BENCHMARKS.md

NAME = "mask"
TITLE = "2a. Mask building for `source: old`, one whole batch of the paper's size"
SIZES = {
    "quick": dict(responses=32, max_len=1024, repeats=2, old_pass=dict(tokens=64, repeats=1)),
    "full": dict(responses=2048, max_len=15360, repeats=2, old_pass=dict(tokens=1024, repeats=3)),
}
_COST_FIELDS = (
    "model", "params", "tokens", "network_s_per_token", "head_s_per_token", "achieved_flops", "spread", "head_ops"
)


def measure(device, old_pass: dict, **size) -> list[dict]:
    """The yardstick (verl's old-log-prob pass, measured here) first, then one row per length distribution."""
    from benchmarks import old_pass as old_pass_bench

    cost = old_pass_bench.measure(device=device, **old_pass)
    rows = run(device=device, **size)
    for r in rows:
        est = old_pass_bench.batch_estimate(cost, r.pop("lengths"), PROMPT_LEN)
        r.update(est)
        r["ratio_measured_model"] = r["total_s"] / est["measured_model_s"]
        r["ratio_qwen3_1p7b"] = r["total_s"] / est["qwen3_1p7b_s"]
    return [{"bench": "old_pass", **{k: getattr(cost, k) for k in _COST_FIELDS}}, *rows]


def render(rows: list[dict]) -> str:
    cost, *rows = rows
    lines = [
        f"Yardstick, measured in this run: verl's old-log-prob pass (network forward, then "
        f"{cost.get('head_ops', PassCost.head_ops)}) on {cost['model']}, {cost['tokens']} tokens: "
        f"{1000 * cost['network_s_per_token']:.3g} ms/token network ({cost['achieved_flops'] / 1e9:.0f} GFLOP/s) + "
        f"{1000 * cost['head_s_per_token']:.3g} ms/token head ops (spread {cost['spread']:.2f}).",
        "",
        "| lengths | responses x max | response tokens (mean length, truncated) | candidates | masked (ratio) | "
        "detect s | diagnostics s | grid s | fold s | total s (spread) | peak tensor memory (inputs) | "
        "RSS peak delta | "
        "old pass, measured model: s (mask / pass) | old pass, Qwen3-1.7B by FLOPs: s (mask / pass) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            md_row(
                r["distribution"],
                f"{r['responses']} x {r['max_len']}",
                f"{r['tokens']:,} ({r['mean_len']:.0f}, {100 * r['truncated_share']:.1f}%)",
                f"{r['candidates']:,}",
                f"{r['masked']:,} ({r['mask_ratio']:.1e})",
                fmt_num(r["detect_s"]),
                fmt_num(r["diagnostics_s"]),
                fmt_num(r["grid_s"]),
                fmt_num(r["fold_s"]),
                f"{fmt_num(r['total_s'])} ({fmt_num(r['total_spread'])})",
                f"{fmt_bytes(r.get('peak_tensor_bytes'))} ({fmt_bytes(r['input_bytes'])})",
                fmt_bytes(r["rss_peak_delta_bytes"]),
                f"{r['measured_model_s']:,.0f} ({r['ratio_measured_model']:.1e})",
                f"{r['qwen3_1p7b_s']:,.0f} ({r['ratio_qwen3_1p7b']:.1e})",
            )
        )
    return "\n".join(lines)
