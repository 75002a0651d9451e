"""Loss path: what STAPO adds to verl's actor loss, against verl's own ``ppo_loss`` in the same run.

One micro-batch laid out the way verl's FSDP engine hands it to the loss function (jagged
prompt+response sequences, response-only masks; see ``tests/integration/verl_batches.py``), forward
of the loss + backward to the per-token log-probs. Variants, interleaved round-robin:

- ``vanilla``: verl's stock loss, ``partial(ppo_loss, config=...)`` with ``loss_mode=vanilla``
  (a config composed from verl's own ``ppo_trainer.yaml``, no STAPO ``_target_``), no entropy.
- ``stapo/old``: ``STAPOLossFn`` with ``source=old``; the batch carries the S2T mask already folded
  into ``response_mask``/``loss_mask`` (built from the old log-probs and entropy, as the trainer does).
- ``vanilla+H``: verl's stock loss with ``entropy`` in the model output (what
  ``calculate_entropy=true`` costs inside verl's own loss: the entropy aggregate), the fair
  yardstick for ``stapo/current``.
- ``stapo/current``: ``STAPOLossFn`` with ``source=current``: detection (candidates, exact quantile,
  mask), the DP-global valid fraction and the diagnostics inside the loss, entropy in the model output.

The loss functions only ever see per-token tensors (log-probs and entropy of shape (tokens,)); the
memory pass records the largest tensor each variant creates to show it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

from benchmarks.common import fmt_num, fmt_peak, interleaved, md_row, measure_memory, paired_ratio
from benchmarks.mask_build import LOW_PROB_SHARE
from stapo.algorithm.s2t import detect_spurious
from stapo.verl_plugin.training.losses import STAPOLossFn, folded_mask_update
from tests.integration.verl_batches import actor_config, compose_verl

PATTERNS = ("all_positive", "mixed", "all_zero", "many_low_prob")
VARIANTS = ("vanilla", "stapo/old", "vanilla+H", "stapo/current")
TAU_P = 0.002
CLIP = [
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
]


def verl_vanilla_config():
    """verl's own actor config (no STAPO ``_target_``), loss_mode=vanilla, the paper's clip values."""
    return omega_conf_to_dataclass(compose_verl(CLIP).actor_rollout_ref.actor)


def make_rows(rows: int, tokens: int, pattern: str, seed: int = 0) -> dict[str, list[torch.Tensor]]:
    """Per-response tensors with a realistic shape of probabilities and entropies.

    Most sampled tokens are confident (log p ~ -Exp(mean 0.25)); a share of them (3e-4, which gives
    the paper's mask ratio of about 1e-4, or 30% for the ``many_low_prob`` stress case) is sampled far
    below tau_p, at positions whose entropy spreads over [0, 4].
    The current policy differs from the old by a small drift. Advantages are one value per
    response (GRPO), tiled over its tokens.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"unknown advantage pattern {pattern!r}; choose from {PATTERNS}")
    g = torch.Generator().manual_seed(seed)
    low_share = 0.3 if pattern == "many_low_prob" else LOW_PROB_SHARE
    out = {k: [] for k in ("old_log_prob", "old_entropy", "log_prob", "entropy", "advantages")}
    for i in range(rows):
        low = torch.rand(tokens, generator=g) < low_share
        confident = -torch.empty(tokens).exponential_(4.0, generator=g)
        rare = torch.empty(tokens).uniform_(math.log(1e-7), math.log(TAU_P), generator=g)
        old = torch.where(low, rare, confident)
        entropy = torch.where(
            low, torch.rand(tokens, generator=g) * 4.0, torch.empty(tokens).exponential_(2.0, generator=g)
        )
        out["old_log_prob"].append(old)
        out["old_entropy"].append(entropy)
        out["log_prob"].append(old + 0.02 * torch.randn(tokens, generator=g))
        out["entropy"].append((entropy + 0.02 * torch.randn(tokens, generator=g)).clamp(min=0))
        magnitude = 0.5 + float(torch.rand(1, generator=g))
        alternating = 1.0 if i % 2 else -1.0
        sign = {"all_positive": 1.0, "all_zero": 0.0, "mixed": alternating, "many_low_prob": alternating}[pattern]
        out["advantages"].append(torch.full((tokens,), sign * magnitude))
    return out


def folded_masks(rows: dict[str, list[torch.Tensor]]) -> list[torch.Tensor]:
    """The ``source=old`` loss mask per response: response tokens minus the S2T mask of the old pass."""
    log_prob = torch.stack(rows["old_log_prob"])
    detection = detect_spurious(
        log_prob, torch.stack(rows["old_entropy"]), torch.stack(rows["advantages"]), torch.ones_like(log_prob), TAU_P
    )
    return list((~detection.spurious).long().unbind(0))


def _jagged(pieces: list[torch.Tensor], device) -> torch.Tensor:
    return torch.nested.as_nested_tensor([p.to(device) for p in pieces], layout=torch.jagged)


@dataclass
class MicroBatchSpec:
    rows: dict[str, list[torch.Tensor]]
    masks: list[torch.Tensor]
    prompt_len: int
    with_entropy: bool
    folded: bool
    device: torch.device


def build(spec: MicroBatchSpec):
    """(model_output, data) as verl's FSDP engine gives them to the loss; log-probs (and entropy) require grad."""
    rows, device, prompt_len = spec.rows, spec.device, spec.prompt_len

    def sequence(key: str) -> torch.Tensor:
        pieces = []
        for values in rows[key]:  # position t predicts token t+1: the response's values start at prompt_len-1
            pieces += [torch.zeros(prompt_len - 1), values, torch.zeros(1)]
        return torch.cat(pieces).to(device).detach().requires_grad_(True)

    lengths = torch.tensor([prompt_len + len(r) for r in rows["log_prob"]])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(device)
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(sequence("log_prob"), offsets)}
    if spec.with_entropy:
        model_output["entropy"] = torch.nested.nested_tensor_from_jagged(sequence("entropy"), offsets)
    count = len(rows["log_prob"])
    masks = spec.masks if spec.folded else [torch.ones_like(m) for m in spec.masks]
    data = TensorDict(
        {
            "prompts": _jagged([torch.ones(prompt_len, dtype=torch.long)] * count, device),
            "responses": _jagged([torch.ones(len(r), dtype=torch.long) for r in rows["log_prob"]], device),
            "response_mask": _jagged(masks, device),
            "loss_mask": _jagged(masks, device),
            "old_log_probs": _jagged(rows["old_log_prob"], device),
            "advantages": _jagged(rows["advantages"], device),
        },
        batch_size=count,
    )
    tu.assign_non_tensor(
        data, batch_num_tokens=int(sum(int(m.sum()) for m in masks)), dp_size=1, global_batch_size=count
    )
    return model_output, data


def loss_functions():
    """variant -> (loss function, mask folded, entropy in the model output)."""
    vanilla = partial(ppo_loss, config=verl_vanilla_config())
    return {
        "vanilla": (vanilla, False, False),
        "stapo/old": (STAPOLossFn(actor_config(token_mask="stapo", source="old")), True, False),
        "vanilla+H": (vanilla, False, True),
        "stapo/current": (STAPOLossFn(actor_config(token_mask="stapo", source="current")), False, True),
    }


def _prepare(fn, spec: MicroBatchSpec):
    def prepare():
        model_output, data = build(spec)

        def run():
            with folded_mask_update():  # the STAPO actor worker's span (nothing for the other entries)
                loss, _ = fn(model_output=model_output, data=data)
            loss.backward()

        return run

    return prepare


def run(
    rows: int = 8,
    tokens: int = 4096,
    prompt_len: int = 512,
    repeats: int = 15,
    patterns: tuple[str, ...] = PATTERNS,
    device: torch.device | str = "cpu",
    memory: bool = True,
) -> list[dict]:
    device = torch.device(device)
    functions = loss_functions()
    results = []
    for pattern in patterns:
        data_rows = make_rows(rows, tokens, pattern)
        masks = folded_masks(data_rows)
        specs = {
            name: MicroBatchSpec(data_rows, masks, prompt_len, with_entropy, folded, device)
            for name, (_, folded, with_entropy) in functions.items()
        }
        prepared = {name: _prepare(fn, specs[name]) for name, (fn, _, _) in functions.items()}
        times = interleaved(prepared, repeats, device)
        mem = {name: measure_memory(prepared[name], device) for name in prepared} if memory else {}
        base = times["vanilla"].median
        with_h = times["vanilla+H"].median
        for name in VARIANTS:
            samples = times[name]
            entropy_variant = name in ("vanilla+H", "stapo/current")
            row = {
                "bench": "loss",
                "case": f"{pattern} {rows}x{tokens}",
                "pattern": pattern,
                "tokens": rows * tokens,
                "masked": int(sum(int((m == 0).sum()) for m in masks)),
                "variant": name,
                "median_ms": 1000 * samples.median,
                "spread": samples.spread,
                "ratio_vs_vanilla": samples.median / base,
                # median over rounds of the ratio to the variant timed just before/after it in the same round
                "paired_vs_vanilla": paired_ratio(samples, times["vanilla"]),
                "ratio_vs_vanilla_H": samples.median / with_h if entropy_variant else math.nan,
                "paired_vs_vanilla_H": paired_ratio(samples, times["vanilla+H"]) if entropy_variant else math.nan,
                "samples_ms": [1000 * v for v in samples.values],
            }
            if name in mem:
                m = mem[name]
                row.update(
                    peak_tensor_bytes=m.peak_tensor_bytes,
                    largest_numel=m.largest_numel,
                    largest_shape=m.largest_shape,
                    largest_per_token=m.largest_numel / (rows * (tokens + prompt_len)),
                    cuda_peak_bytes=m.cuda_peak_bytes,
                )
            results.append(row)
    for row in results:  # memory ratio against vanilla of the same pattern
        if "peak_tensor_bytes" in row:
            base_row = next(r for r in results if r["pattern"] == row["pattern"] and r["variant"] == "vanilla")
            row["mem_ratio_vs_vanilla"] = row["peak_tensor_bytes"] / max(base_row["peak_tensor_bytes"], 1)
    return results


# ---------------------------------------------------------------- its section of BENCHMARKS.md

NAME = "loss"
TITLE = "1. Loss path: verl's `ppo_loss`, one micro-batch, forward + backward"
SIZES = {
    "quick": dict(rows=2, tokens=256, prompt_len=32, repeats=5),
    "full": dict(rows=8, tokens=4096, prompt_len=512, repeats=101),
}


def measure(device, **size) -> list[dict]:
    return run(device=device, **size)


def render(rows: list[dict]) -> str:
    lines = [
        md_row("case", "variant", "median ms", "spread", "ratio vs vanilla: of medians, paired",
               "ratio vs vanilla+H: of medians, paired", "peak tensor memory", "memory vs vanilla",
               "largest tensor (elements, per token)"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            md_row(
                r["case"],
                r["variant"],
                fmt_num(r["median_ms"]),
                fmt_num(r["spread"]),
                f"{fmt_num(r['ratio_vs_vanilla'], 3)}, {fmt_num(r['paired_vs_vanilla'], 3)}",
                f"{fmt_num(r['ratio_vs_vanilla_H'], 3)}, {fmt_num(r['paired_vs_vanilla_H'], 3)}",
                fmt_peak(r),
                fmt_num(r.get("mem_ratio_vs_vanilla"), 3),
                f"{r.get('largest_numel', 0):,} ({fmt_num(r.get('largest_per_token'))})",
            )
        )
    old = [r["ratio_vs_vanilla"] for r in rows if r["variant"] == "stapo/old"]
    old_paired = [r["paired_vs_vanilla"] for r in rows if r["variant"] == "stapo/old"]
    cur = [r for r in rows if r["variant"] == "stapo/current"]
    with_h = {r["case"]: r["median_ms"] for r in rows if r["variant"] == "vanilla+H"}
    added = [r["median_ms"] - with_h[r["case"]] for r in cur]
    largest = max(r.get("largest_per_token", 0) for r in rows)
    lines += [
        "",
        f"- `stapo/old` / `vanilla`: ratio of medians {min(old):.3f} to {max(old):.3f}, paired "
        f"{min(old_paired):.3f} to {max(old_paired):.3f} over the advantage patterns (target: within 1.05).",
        f"- `stapo/current` adds {min(added):.1f} to {max(added):.1f} ms per micro-batch of {rows[0]['tokens']:,} "
        f"response tokens over `vanilla+H` (ratio {min(r['ratio_vs_vanilla_H'] for r in cur):.2f} to "
        f"{max(r['ratio_vs_vanilla_H'] for r in cur):.2f}).",
        f"- Largest tensor any variant creates: {largest:.2f} x the micro-batch's sequence tokens (prompt + response), "
        "i.e. per-token vectors; no tensor has a vocabulary dimension.",
    ]
    return "\n".join(lines)
