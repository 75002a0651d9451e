"""``python -m benchmarks.testbed_model_work [--json OUT]``: the testbed model's own work in a step and a
validation, one thread (as the trainer's workers run), to set the trainer's step and validation against.

- ``decode_step``: a training step's 8 prompts x 8 samples at T=1, up to 64 tokens, decoded as ONE batch by
  ``sample_batch`` (what the HF server runs for a submission), and ``decode_step_by_group``: the same 8 groups
  one after another (``sample_group``, the server's group mode);
- ``update``: forward + backward + GainAdamW step over those 64 sampled sequences (one micro-batch, as the preset);
- ``decode_validation``: 64 held-out prompts x 8 samples as one batch, and how many tokens its rows drew
  (``validation_row_tokens``: the decode lasts as long as its longest row; each request is answered when its own
  row ends).
Prompts are the first rows of the testbed's own train / held-out files (``stapo data prepare`` builds them; the
trainer does at start-up). Medians of ``--repeats`` rounds after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def prompts(tokenizer, file: Path, count: int) -> list[list[int]]:
    import pandas as pd

    rows = pd.read_parquet(file).head(count)
    texts = [tokenizer.apply_chat_template(list(row), tokenize=False, add_generation_prompt=True)
             for row in rows["prompt"]]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def row_token_quantiles(lengths: list[int]) -> dict[str, int]:
    """How many tokens the rows of a decode drew before they ended (nearest-rank quantiles): the batch runs until
    its longest row ends, and the server hands each request over when its own row ends."""
    ordered = sorted(lengths)
    at = {"min": 0.0, "q25": 0.25, "median": 0.5, "q75": 0.75, "q95": 0.95, "max": 1.0}
    return {name: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for name, q in at.items()}


def timed(fn, repeats: int) -> tuple[float, object]:
    fn()
    samples, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path.home() / ".cache" / "stapo" / "addition")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo.models.generation import generation_ids
    from stapo.models.local import resolve_model_path
    from stapo.models.testbed.optim import GainAdamW
    from stapo.verl_plugin.cpu.sampling import Sampling, sample_batch, sample_group

    path = resolve_model_path("stapo://testbed")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    eos = generation_ids(model.generation_config).eos_ids
    sampling = Sampling(temperature=1.0, max_tokens=64, logprobs=True)
    train = prompts(tokenizer, args.data / "train.parquet", 8)
    val = prompts(tokenizer, args.data / "heldout.parquet", 64)
    rows = [p for p in train for _ in range(8)]
    seeds = list(range(len(rows)))
    out = {}
    out["decode_step_s"], samples = timed(lambda: sample_batch(model, rows, sampling, seeds, eos), args.repeats)
    out["decode_step_by_group_s"], _ = timed(
        lambda: [sample_group(model, p, sampling, seeds[8 * i: 8 * i + 8], eos) for i, p in enumerate(train)],
        args.repeats)
    sequences = [p + tokens for p, (tokens, *_) in zip(rows, samples)]
    width = max(map(len, sequences))
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
    optimizer = GainAdamW(model.parameters(), lr=1e-5, gain_lr_scale=100)

    def update():
        model.train()
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        log_probs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-(log_probs * mask[:, 1:]).sum() / mask.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
        model.eval()

    out["update_s"], _ = timed(update, args.repeats)
    val_rows = [p for p in val for _ in range(8)]
    out["decode_validation_s"], val_samples = timed(
        lambda: sample_batch(model, val_rows, sampling, list(range(len(val_rows))), eos), max(1, args.repeats - 1))
    out["validation_row_tokens"] = row_token_quantiles([len(tokens) for tokens, *_ in val_samples])
    out["step_model_work_s"] = out["decode_step_s"] + out["update_s"]
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
