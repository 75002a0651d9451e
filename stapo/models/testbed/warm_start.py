"""Supervised warm start on worked solutions, and the held-out pass rate it reaches.

RL needs groups with mixed outcomes: a model that never solves a problem gets no advantage, one that
always does has nothing to learn. Training from scratch on the worked solutions for a fixed number
of steps brings the sampled (T=1) pass rate part of the way; RL is left the rest. The loss covers the
assistant turn only (its end token included, so the model learns to stop), as verl's own SFT does.
"""

from __future__ import annotations

import math
from itertools import islice

import torch

from stapo.data.addition import Difficulty, problems, question, worked_solution


def _messages(operands: tuple[int, ...], with_answer: bool) -> list[dict]:
    turns = [{"role": "user", "content": question(operands)}]
    if with_answer:
        turns.append({"role": "assistant", "content": worked_solution(operands)})
    return turns


def _encode(tokenizer, operands: tuple[int, ...], with_answer: bool) -> list[int]:
    text = tokenizer.apply_chat_template(_messages(operands, with_answer), tokenize=False,
                                         add_generation_prompt=not with_answer)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sft_batch(tokenizer, batch: list[tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Right-padded inputs with labels on the assistant turn only (-100 elsewhere)."""
    rows = []
    for operands in batch:
        prompt, reply = prompt_and_reply(tokenizer, operands)
        rows.append((prompt + reply, [-100] * len(prompt) + reply))
    return padded_batch(tokenizer, rows)


def prompt_and_reply(tokenizer, operands: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """The ids of the rendered prompt and of the worked solution's assistant turn (its end token included)."""
    prompt, full = _encode(tokenizer, operands, False), _encode(tokenizer, operands, True)
    assert full[: len(prompt)] == prompt, "the chat template must extend the prompt with the answer"
    return prompt, full[len(prompt):]


def padded_batch(tokenizer, rows: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """``(input_ids, labels)`` rows right-padded into one batch (labels -100 on the padding)."""
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, row_labels) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(row_labels)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def learning_rate(step: int, recipe: dict) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio`` of the peak: the end point does not hang on
    where a constant-rate run happened to stop."""
    peak, warmup, total = recipe["lr"], recipe["warmup_steps"], recipe["sft_steps"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    floor = recipe["min_lr_ratio"]
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def supervised_warm_start(model, tokenizer, recipe: dict, difficulty: Difficulty, log=None) -> None:
    """``recipe["sft_steps"]`` AdamW steps on the training split, in a fixed order (seeded stream)."""
    stream = problems("train", recipe["seed"], difficulty, distinct=False)
    batches = (sft_batch(tokenizer, list(islice(stream, recipe["sft_batch_size"]))) for _ in range(recipe["sft_steps"]))
    supervised_steps(model, recipe, batches, log)


def supervised_steps(model, schedule: dict, batches, log=None) -> None:
    """One fresh AdamW step a batch for ``schedule["sft_steps"]`` steps, at ``learning_rate(step, schedule)``
    with ``schedule["weight_decay"]``; the model is left in eval mode."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=schedule["lr"], weight_decay=schedule["weight_decay"])
    model.train()
    for step, batch in zip(range(schedule["sft_steps"]), batches):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, schedule)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if log is not None:
            log(step, loss.item())
    model.eval()


@torch.no_grad()
def pass_rate(model, tokenizer, heldout: list[tuple[int, ...]], recipe: dict, temperature: float) -> float:
    """Share of ``heldout`` whose reply boxes the right sum (the paper's reward, ``stapo.reward.boxed``);
    greedy at temperature 0, else sampled from a fixed seed."""
    from stapo.reward.boxed import compute_score

    prompts = [_encode(tokenizer, operands, False) for operands in heldout]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {
        "do_sample": False}
    torch.manual_seed(recipe["seed"])
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=recipe["max_new_tokens"],
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sampling)
    replies = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    right = [compute_score("", reply, str(sum(operands)))["acc"] for reply, operands in zip(replies, heldout)]
    return sum(right) / len(right)


def heldout_problems(recipe: dict, difficulty: Difficulty) -> list[tuple[int, ...]]:
    """The first ``eval_problems`` held-out problems of seed 0: the preset validates on a prefix of them."""
    return list(islice(problems("heldout", 0, difficulty), recipe["eval_problems"]))
