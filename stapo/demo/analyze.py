"""S2T analysis of a real model: sample groups, score them, and show what STAPO would silence.

One forward pass, no training: rollouts at temperature 1 (as in the paper), a rule reward,
group-relative advantages, the model's own per-token probabilities and full-vocabulary entropies,
then the S2T mask and its diagnostics. This is the first half of a STAPO step, on a CPU.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from stapo.masks import MaskInputs, MaskSettings, build_token_mask, finalize_metrics, get_token_mask
from stapo.spurious_log import append_jsonl, most_frequent, spurious_records

ANSWER_SUFFIX = "Put the final answer in \\boxed{}."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


def arithmetic_problems(count: int, seed: int = 0) -> list[Problem]:
    """Easy additions (one- and two-digit operands): mixed outcomes within a group at T=1."""
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        problems.append(Problem(f"What is {a} + {b}? {ANSWER_SUFFIX}", str(a + b)))
    return problems


def final_number_reward(text: str, answer: str) -> float:
    """+1 when the last number of the reply is the answer, else -1 (lenient, for a 135M model)."""
    numbers = _NUMBER.findall(text.replace(",", ""))
    return 1.0 if numbers and numbers[-1].rstrip("0").rstrip(".") == answer else -1.0


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: (r - group mean) / (group std + eps), one value per response."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.ones_like(mean)
    return ((grouped - mean) / (std + eps)).view(-1)


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
    tau_p: float = 0.002,
    entropy_quantile: float = 0.75,
    seed: int = 0,
) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    # the generation config knows the chat's end token (the tokenizer's eos may be the BOS-like one)
    eos_ids = model.generation_config.eos_token_id
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [tokenizer.eos_token_id])
    pad_id = model.generation_config.pad_token_id
    pad_id = eos_ids[0] if pad_id is None else pad_id
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)

    problems = arithmetic_problems(prompts, seed)
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}], tokenize=False, add_generation_prompt=True)
        for p in problems
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
    answers = [p.answer for p in problems for _ in range(group_size)]
    rewards = torch.tensor([final_number_reward(text, answer) for text, answer in zip(decoded, answers)])
    advantages = group_advantages(rewards, group_size)
    token_advantages = advantages.unsqueeze(-1).expand_as(log_prob)

    settings = MaskSettings(token_mask="stapo", tau_p=tau_p, entropy_quantile=entropy_quantile)
    built = build_token_mask(MaskInputs(response_mask, token_advantages, log_prob, entropy), settings)
    metrics = finalize_metrics(get_token_mask("stapo"), built.counts, built.stats)
    metrics.update(
        accuracy=float((rewards > 0).float().mean()),
        mixed_groups=int(((rewards.view(-1, group_size) > 0).float().std(dim=1) > 0).sum()),
        response_tokens=int(response_mask.sum()),
        seconds=round(time.time() - started, 1),
    )
    records = spurious_records(responses, built.drop_response, log_prob, entropy, lambda ids: tokenizer.decode(ids))
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
    print(f"responses: {len(decoded)}, accuracy {metrics['accuracy']:.2f}, groups with mixed rewards: {metrics['mixed_groups']}")
    print(f"response tokens: {metrics['response_tokens']}, candidates (A>0, p<tau_p): {int(metrics['num_candidates'])}")
    print(f"tau_h: {metrics['tau_h']:.4f}   silenced: {int(metrics['num_spurious'])}   mask ratio: {metrics['mask_ratio']:.2e}")
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
