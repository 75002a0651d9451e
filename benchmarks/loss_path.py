"""What STAPO's loss costs inside verl's actor, against verl's own vanilla path in the same run.

Each variant runs verl's ``ppo_loss`` on the same micro-batch (forward of the loss + backward to the
log-probs): ``vanilla`` through verl's stock function, ``stapo/old`` through ``STAPOLossFn`` with
the mask already folded (what the STAPO trainer produces), ``stapo/current`` with detection inside
the loss from the forward's entropy. Variants are interleaved A/B/C/A/B/C; medians are reported.
"""

from __future__ import annotations

import math
import statistics
import time

import torch
from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import ppo_loss

from stapo.verl_plugin.losses import MASK_FOLDED_KEY, STAPOLossFn
from tests.integration.verl_batches import actor_config, make_micro_batch

PATTERNS = ("mixed", "all_positive", "all_zero", "many_low_prob")


def make_rows(rows: int, tokens: int, pattern: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    low_share = 0.3 if pattern == "many_low_prob" else 0.02
    data = {k: [] for k in ("log_prob", "old_log_prob", "model_entropy", "advantages", "response_mask", "loss_mask")}
    for i in range(rows):
        low = torch.rand(tokens, generator=g) < low_share
        old = torch.where(
            low,
            torch.empty(tokens).uniform_(math.log(1e-6), math.log(0.002), generator=g),
            torch.empty(tokens).uniform_(math.log(0.002), 0.0, generator=g),
        )
        data["old_log_prob"].append(old)
        data["log_prob"].append(old + torch.empty(tokens).uniform_(-0.05, 0.05, generator=g))
        data["model_entropy"].append(torch.rand(tokens, generator=g) * 4)
        value = {"mixed": 1.0 if i % 2 else -1.0, "all_positive": 1.0, "all_zero": 0.0, "many_low_prob": 1.0}[pattern]
        data["advantages"].append(torch.full((tokens,), value))
        data["response_mask"].append(torch.ones(tokens, dtype=torch.long))
        data["loss_mask"].append(torch.ones(tokens, dtype=torch.long))
    return data


def _variants():
    """name -> (loss function, mask folded?, entropy in the update forward?)."""
    vanilla_cfg = actor_config(loss_mode="vanilla")
    return {
        "vanilla": (lambda model_output, data: ppo_loss(vanilla_cfg, model_output, data), False, False),
        "stapo/old": (STAPOLossFn(actor_config(loss_mode="stapo", source="old")), True, False),
        "stapo/current": (STAPOLossFn(actor_config(loss_mode="stapo", source="current")), False, True),
    }


def run(rows: int = 8, tokens: int = 4096, repeats: int = 7) -> list[dict]:
    results = []
    variants = _variants()
    for pattern in PATTERNS:
        data_rows = make_rows(rows, tokens, pattern)
        prompt_lens = [16] * rows
        times: dict[str, list[float]] = {name: [] for name in variants}
        for repeat in range(repeats + 1):  # the first round warms up
            for name, (fn, folded, with_entropy) in variants.items():
                rows_in = data_rows if with_entropy else {k: v for k, v in data_rows.items() if k != "model_entropy"}
                model_output, data, _ = make_micro_batch(rows_in, prompt_lens, rows * tokens, rows)
                tu.assign_non_tensor(data, **{MASK_FOLDED_KEY: folded})
                start = time.perf_counter()
                loss, _ = fn(model_output=model_output, data=data)
                loss.backward()
                elapsed = time.perf_counter() - start
                if repeat:
                    times[name].append(elapsed)
        base = statistics.median(times["vanilla"])
        for name, samples in times.items():
            median = statistics.median(samples)
            results.append(
                {
                    "bench": "loss_path",
                    "case": f"{pattern} {rows}x{tokens}",
                    "variant": name,
                    "median_ms": 1000 * median,
                    "ratio_vs_vanilla": median / base,
                    "spread": (max(samples) - min(samples)) / median,
                }
            )
    return results
