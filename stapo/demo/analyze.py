"""S2T analysis of a real model: sample groups, score them, and show what STAPO would silence.

One forward pass, no training: rollouts at temperature 1 (as in the paper) on the demo's arithmetic
task (``stapo.data.arithmetic``), the demo's reward (``stapo.reward.arithmetic``), verl's own GRPO
advantages, the model's per-token probabilities and full-vocabulary entropies, then the S2T mask
and its diagnostics. This is the first half of a STAPO step, on a CPU.

The advantage is verl's ``compute_grpo_outcome_advantage`` itself, not a copy: the analysis then
scores tokens exactly as the trainer does (unbiased std, its epsilon, one-response groups). The
pure core cannot import verl; this demo module can, and the trainer's process loads verl anyway.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask, finalize_metrics, get_token_mask
from stapo.algorithm.validation import PAPER_ENTROPY_QUANTILE, PAPER_TAU_P
from stapo.data.arithmetic import DATA_SOURCE, make_rows
from stapo.models.generation import load_for_generation
from stapo.reward.arithmetic import compute_score
from stapo.spurious_log import append_jsonl, most_frequent, spurious_records
from stapo.verl_plugin.training.diagnostic_outputs import SpuriousTokenLog


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO advantages, one per response (groups of ``group_size`` consecutive responses), by verl's code."""
    import numpy as np
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    scores = rewards.float().unsqueeze(-1)  # one "token" holding the outcome reward
    index = np.arange(len(rewards)) // group_size
    advantages, _ = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), index)
    return advantages.squeeze(-1)


def token_log_prob_and_entropy(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(token) and the full-vocabulary entropy, from one softmax pass (float32)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    chosen = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy


def analyze(
    model_path: str,
    out_dir: Path,
    prompts: int = 8,
    group_size: int = 8,
    max_new_tokens: int = 48,
    tau_p: float = PAPER_TAU_P,
    entropy_quantile: float = PAPER_ENTROPY_QUANTILE,
    seed: int = 0,
    level: str = "easy",
) -> dict:
    torch.manual_seed(seed)
    started = time.time()
    model, tokenizer, ids = load_for_generation(model_path)
    eos_ids, pad_id = ids.eos_ids, ids.pad_id

    problems = make_rows(prompts, "train", seed, level)
    texts = [
        tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True) for row in problems
    ]
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    print(f"[analyze] sampling {prompts} prompts x {group_size} responses at temperature 1.0 ...", flush=True)
    with torch.no_grad():
        sequences = model.generate(
            **encoded,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=group_size,
            pad_token_id=pad_id,
            eos_token_id=eos_ids,
        )
        prompt_len = encoded["input_ids"].shape[1]
        responses = sequences[:, prompt_len:]
        attention = torch.ones_like(sequences)
        attention[:, :prompt_len] = encoded["attention_mask"].repeat_interleave(group_size, dim=0)
        response_mask = _response_mask(responses, eos_ids)
        attention[:, prompt_len:] = response_mask.long()
        print("[analyze] scoring and computing per-token probabilities and entropies ...", flush=True)
        logits = model(input_ids=sequences, attention_mask=attention).logits[:, prompt_len - 1 : -1]
        log_prob, entropy = token_log_prob_and_entropy(logits, responses)

    decoded = [tokenizer.decode(row[mask], skip_special_tokens=True) for row, mask in zip(responses, response_mask)]
    answers = [row["reward_model"]["ground_truth"] for row in problems for _ in range(group_size)]
    scores = [compute_score(DATA_SOURCE, text, answer) for text, answer in zip(decoded, answers)]
    rewards = torch.tensor([score["score"] for score in scores])
    advantages = group_advantages(rewards, group_size)
    token_advantages = advantages.unsqueeze(-1).expand_as(log_prob)

    settings = MaskSettings(token_mask="stapo", tau_p=tau_p, entropy_quantile=entropy_quantile)
    built = build_token_mask(MaskInputs(response_mask, token_advantages, log_prob, entropy), settings)
    metrics = finalize_metrics(get_token_mask("stapo"), built.counts, built.stats)
    metrics.update(
        accuracy=sum(score["acc"] for score in scores) / len(scores),
        mixed_groups=int((rewards.view(-1, group_size).std(dim=1) > 0).sum()),
        response_tokens=int(response_mask.sum()),
        seconds=round(time.time() - started, 1),
    )
    records = spurious_records(
        responses, built.drop_response, log_prob, entropy, lambda ids: tokenizer.decode(ids),
        context=SpuriousTokenLog.context,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "s2t_analysis.json").write_text(json.dumps(metrics, indent=2))
    append_jsonl(out_dir / "spurious_tokens.jsonl", records)
    _print_report(metrics, records, decoded, rewards)
    return {"metrics": metrics, "records": records}


def _response_mask(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """Tokens up to and including the first EOS; what generate() padded after it is not response."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids))
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return ~after_eos


def _print_report(metrics: dict, records: list[dict], decoded: list[str], rewards: torch.Tensor) -> None:
    print("\n=== S2T analysis (one STAPO detection step on real rollouts) ===")
    print(f"responses: {len(decoded)}, accuracy {metrics['accuracy']:.2f}, "
          f"groups with mixed rewards: {metrics['mixed_groups']}")
    print(f"response tokens: {metrics['response_tokens']}, candidates (A>0, p<tau_p): {int(metrics['num_candidates'])}")
    print(f"tau_h: {metrics['tau_h']:.4f}   silenced: {int(metrics['num_spurious'])}   "
          f"mask ratio: {metrics['mask_ratio']:.2e}")
    print(
        "entropy p50/p80/p95: "
        f"{metrics['entropy_p50']:.3f} / {metrics['entropy_p80']:.3f} / {metrics['entropy_p95']:.3f}"
    )
    for record in records[:15]:
        print(
            f"  silenced {record['token']!r:>12} p={record['prob']:.1e} H={record['entropy']:.2f}   "
            f"...{record['before']!r} [{record['token']}] {record['after']!r}..."
        )
    if records:
        print("most frequent silenced tokens:", most_frequent(records, 10))
    best = int(torch.argmax(rewards))
    print(f"\nexample rewarded response: {decoded[best][:300]!r}")
