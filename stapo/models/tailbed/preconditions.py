"""What STAPO needs from a checkpoint, measured: rare tokens sampled at T=1 that a right answer survives.

S2T silences response tokens with a positive advantage, ``p < tau_p`` and an entropy below ``tau_h``.
On the first testbed nearly every such rare token is a wrong digit (negative advantage), so the mask has
nothing to act on; an LLM's tail, sampled at T=1, often leaves the answer right. This module measures
that on any checkpoint of the addition task (``stapo://testbed``, ``stapo://tailbed``, a trained run):
held-out problems, ``samples`` replies each at T=1 / top-p 1 from a fixed seed, the paper's +1/-1
reward, GRPO advantages per problem's group (verl's own code, ``stapo.demo.analyze.group_advantages``),
the old-policy log-probs and entropies of one forward pass, and the S2T mask of ``stapo.algorithm.masks``. It
reports how often a reply holding a rare token (or a filler) is right, the mask's candidate share and
mask ratio, and the silenced tokens' share of the positive-advantage tokens' gradient: the mask's
clamped lower bound (``grad_bound_share_spurious``) and the exact logit-gradient norm
``|A| * ||e_a - pi|| = |A| sqrt(1 - 2p + sum_b p_b^2)`` (and its square).

Re-run on a checkpoint: ``python -m stapo.models.tailbed.preconditions PATH [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass

import torch

from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask, finalize_metrics, get_token_mask
from stapo.models.tailbed.strays import Zipf
from stapo.models.testbed.warm_start import pass_rate, prompt_and_reply


@dataclass(frozen=True)
class Samples:
    """Replies grouped by problem (``group_size`` consecutive rows a problem), padded ``(rows, length)``."""

    tokens: torch.Tensor
    response_mask: torch.Tensor  # bool: the reply's tokens, its end token included
    log_prob: torch.Tensor
    entropy: torch.Tensor
    collision: torch.Tensor  # sum_b p_b^2 at each position
    rewards: torch.Tensor  # +1 / -1 a reply
    group_size: int
    filler_mass: torch.Tensor | None = None  # probability of every filler together at each position


def _left_padded(tokenizer, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _score(tokenizer, replies: torch.Tensor, problems: list[tuple[int, ...]]) -> torch.Tensor:
    from stapo.reward.boxed import compute_score

    texts = tokenizer.batch_decode(replies, skip_special_tokens=True)
    return torch.tensor([compute_score("", text, str(sum(ops)))["score"] for text, ops in zip(texts, problems)])


@torch.no_grad()
def sample(model, tokenizer, problems: list[tuple[int, ...]], samples: int, seed: int, max_new_tokens: int,
           filler_start: int | None = None, chunk: int = 32) -> Samples:
    """``samples`` replies a problem at T=1, top-p 1, from ``seed``; their per-token statistics from one forward
    pass over prompt and reply (the old-policy pass), ``chunk`` problems at a time."""
    from stapo.algorithm.gradnorm import collision_probability
    from stapo.demo.analyze import _response_mask, token_log_prob_and_entropy

    torch.manual_seed(seed)
    parts: dict[str, list[torch.Tensor]] = {}
    end = tokenizer.eos_token_id
    for first in range(0, len(problems), chunk):
        batch = problems[first : first + chunk]
        prompt_ids, prompt_mask = _left_padded(tokenizer, [prompt_and_reply(tokenizer, ops)[0] for ops in batch])
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0, num_return_sequences=samples, max_new_tokens=max_new_tokens,
                             eos_token_id=end, pad_token_id=tokenizer.pad_token_id)
        replies = out[:, prompt_ids.shape[1]:]
        mask = _response_mask(replies, [end])
        attention = torch.cat([prompt_mask.repeat_interleave(samples, dim=0), mask.long()], dim=1)
        logits = model(input_ids=out, attention_mask=attention).logits[:, prompt_ids.shape[1] - 1 : -1].float()
        log_prob, entropy = token_log_prob_and_entropy(logits, replies)
        values = {"tokens": replies, "response_mask": mask, "log_prob": log_prob, "entropy": entropy,
                  "collision": collision_probability(logits)}
        if filler_start is not None:
            values["filler_mass"] = torch.exp(torch.logsumexp(logits[..., filler_start:], -1)
                                              - torch.logsumexp(logits, -1))
        pad = max_new_tokens - replies.shape[1]
        for key, value in values.items():
            filled = False if key == "response_mask" else (tokenizer.pad_token_id if key == "tokens" else 0.0)
            parts.setdefault(key, []).append(torch.nn.functional.pad(value, (0, pad), value=filled))
        answered = [ops for ops in batch for _ in range(samples)]
        parts.setdefault("rewards", []).append(_score(tokenizer, replies, answered))
    return Samples(**{key: torch.cat(value) for key, value in parts.items()}, group_size=samples)


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def summarize(s: Samples, filler_start: int | None = None, settings: MaskSettings | None = None) -> dict:
    """The preconditions of one set of samples (see the module docstring); ``None`` where a share has no base."""
    from stapo.demo.analyze import group_advantages

    settings = settings or MaskSettings(token_mask="stapo")
    mask, right = s.response_mask.bool(), s.rewards > 0
    tokens = float(mask.sum())
    low = mask & (s.log_prob.exp() < settings.tau_p)
    with_low = low.any(dim=1)
    report = {
        "replies": len(s.rewards), "response_tokens": int(tokens), "t1_pass_rate": float(right.float().mean()),
        "mean_entropy": float(s.entropy[mask].mean()),
        "low_prob_token_share": float(low.sum()) / tokens,
        "replies_with_low_prob": int(with_low.sum()),
        "right_with_low_prob": _share(float((with_low & right).sum()), float(with_low.sum())),
    }
    if filler_start is not None:
        filler = mask & (s.tokens >= filler_start)
        with_filler = filler.any(dim=1)
        report.update({
            "filler_token_share": float(filler.sum()) / tokens,
            "filler_mass_mean": float(s.filler_mass[mask].mean()),
            "filler_mass_max": float(s.filler_mass[mask].max()),
            "replies_with_filler": int(with_filler.sum()),
            "right_with_filler": _share(float((with_filler & right).sum()), float(with_filler.sum())),
        })
    advantages = group_advantages(s.rewards, s.group_size).unsqueeze(-1).expand_as(s.log_prob)
    built = build_token_mask(MaskInputs(mask, advantages, s.log_prob, s.entropy), settings)
    metrics = finalize_metrics(get_token_mask("stapo"), built.counts, built.stats)
    silenced, positive = built.drop_response & mask, mask & (advantages > 0)
    norm = (1.0 - 2.0 * s.log_prob.double().exp() + s.collision.double()).clamp(min=0.0).sqrt() * advantages.abs()
    report["s2t"] = {
        "num_candidates": int(metrics["num_candidates"]), "num_silenced": int(metrics["num_spurious"]),
        "candidate_share": metrics["num_candidates"] / tokens, "mask_ratio": metrics["mask_ratio"],
        "tau_h": None if math.isnan(metrics["tau_h"]) else metrics["tau_h"],  # NaN: no candidate
        "grad_bound_share_spurious": metrics["grad_bound_share_spurious"],
        "exact_norm_share": _share(float(norm[silenced].sum()), float(norm[positive].sum())),
        "exact_sq_norm_share": _share(float(norm[silenced].pow(2).sum()), float(norm[positive].pow(2).sum())),
    }
    if filler_start is not None:
        report["s2t"]["silenced_filler_share"] = _share(float((silenced & filler).sum()), float(silenced.sum()))
    return report


@torch.no_grad()
def probe_pass_rate(model, tokenizer, problems: list[tuple[int, ...]], filler_start: int, seed: int,
                    max_new_tokens: int) -> float:
    """Greedy pass rate after one stray: each problem's worked solution up to a uniform position of its chain of
    thought, one Zipf-drawn filler, then the model's greedy continuation, scored as a whole reply."""
    rng, zipf = random.Random(f"stapo-tailbed-probe-{seed}"), Zipf(filler_start, len(tokenizer) - filler_start)
    backslash, prefixes = tokenizer.convert_tokens_to_ids("\\"), []
    for ops in problems:
        prompt, reply = prompt_and_reply(tokenizer, ops)
        cut = rng.randrange(reply.index(backslash) + 1)
        prefixes.append((prompt, reply[:cut] + [zipf.draw(rng)]))
    ids, attention = _left_padded(tokenizer, [prompt + forced for prompt, forced in prefixes])
    out = model.generate(input_ids=ids, attention_mask=attention, do_sample=False, max_new_tokens=max_new_tokens,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    forced = [torch.tensor(f) for _, f in prefixes]
    width = max(len(f) for f in forced) + out.shape[1] - ids.shape[1]
    replies = torch.full((len(problems), width), tokenizer.pad_token_id)
    for row, f in enumerate(forced):
        whole = torch.cat([f, out[row, ids.shape[1]:]])
        replies[row, : len(whole)] = whole
    return float((_score(tokenizer, replies, problems) > 0).float().mean())


def measure(model, tokenizer, problems: list[tuple[int, ...]], samples: int, seed: int, max_new_tokens: int,
            filler_start: int | None = None) -> dict:
    """Greedy and T=1 pass rates, the one-stray probe (with fillers) and ``summarize`` of the T=1 samples."""
    has_fillers = filler_start is not None and len(tokenizer) > filler_start
    filler_start = filler_start if has_fillers else None
    greedy = pass_rate(model, tokenizer, problems, {"seed": seed, "max_new_tokens": max_new_tokens}, 0.0)
    report = {"problems": len(problems), "samples_per_problem": samples, "seed": seed, "greedy_pass_rate": greedy}
    if has_fillers:
        report["probe_pass_rate"] = probe_pass_rate(model, tokenizer, problems, filler_start, seed, max_new_tokens)
    drawn = sample(model, tokenizer, problems, samples, seed, max_new_tokens, filler_start)
    return {**report, **summarize(drawn, filler_start)}


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo.models.tailbed.vocabulary import filler_start
    from stapo.models.testbed import RECIPE, difficulty_of
    from stapo.models.testbed.warm_start import heldout_problems

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="checkpoint folder of the addition task (testbed or tailbed tokenizer)")
    parser.add_argument("--problems", type=int, default=256, help="held-out problems (default 256)")
    parser.add_argument("--samples", type=int, default=8, help="T=1 replies a problem (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", help="write the report here as JSON (default: print it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    problems = heldout_problems({**RECIPE, "eval_problems": args.problems}, difficulty_of(RECIPE))
    report = measure(model, tokenizer, problems, args.samples, args.seed, args.max_new_tokens, filler_start())
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
