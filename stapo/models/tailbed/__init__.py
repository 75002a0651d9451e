"""``stapo://tailbed``: the testbed with an LLM-like long tail that a right answer survives, for STAPO's claim.

The first testbed's tokens are all decisive: a token sampled with p < 0.002 is nearly always a wrong
digit (negative advantage), so STAPO's S2T mask, which silences rare tokens of *positive* advantage,
has almost nothing to act on there (docs/tailbed.md). STAPO's claim is about an LLM's long tail: rare
tokens sampled at T=1 that usually leave the answer right. This model adds one:

1. the first testbed's checkpoint (``build_testbed_model(recipe["base"])``), its vocabulary extended to
   ``vocab_size`` tokens with word-like fillers whose embedding rows hold about ``filler_mass`` of each
   position's probability (``vocabulary.py``);
2. continued supervised training with stray fillers inserted into the worked solutions, the
   continuation unchanged, so that a sampled filler is survivable (``strays.py``), in ``stages``;
3. the preconditions measured on held-out problems (``preconditions.py``) and written, with the recipe,
   into ``stapo_tailbed.json`` in the cached folder.

The tail and the tolerance are synthetic by construction: a result on this model says less about LLMs
than a natural tail would (docs/tailbed.md). The build is deterministic (same recipe, seed and thread
count: the same weights bit for bit) and cached under ``~/.cache/stapo/tailbed-qwen3-<hash of the recipe>``.
"""

from __future__ import annotations

import time
from pathlib import Path

from stapo.models.cache import build_once, save_checkpoint
from stapo.models.testbed import RECIPE as TESTBED_RECIPE
from stapo.models.testbed import build_testbed_model, difficulty_of, recipe_key
from stapo.models.tiny import default_cache_dir

MARKER = "stapo_tailbed.json"
RECIPE = {
    "version": 1,
    # the starting checkpoint, and the task (its difficulty) with it
    "base": TESTBED_RECIPE,
    # the vocabulary: the testbed's 27 tokens and fillers up to this size. A step's model work (1 thread, 64
    # samples x ~45 tokens, generation + update) costs 0.76 s at 27 tokens, 1.12 s at 4,096, 1.69 s at 8,192
    "vocab_size": 4096,
    # mean probability of all fillers together at a reply position of the base model, and the new rows' noise
    "filler_mass": 1e-3,
    "noise_std": 0.02,
    "calibration_problems": 64,
    # teaching tolerance of a stray: the notes' three stages, each from the last with a fresh AdamW (strays.py).
    # From a sweep (docs/tailbed.md; greedy / one-stray probe / T=1 on held-out problems): a constant lr to the
    # end leaves the model where its last steps threw it (greedy 0.18-0.45 in 4 runs, 0.88 in a fifth); a cosine
    # decay in the last stage gives 0.98-1.0 / 0.95-0.99 / 0.77-0.79 (5 runs); one 500-step stage with the last
    # settings 0.98 / 0.89 / 0.66 in the same time. The last stage's label share sets how often a filler is
    # sampled: 0.0125 gives 6e-4 of reply tokens, 0.02 1.0e-3, 0.025 1.4e-3
    "stages": [
        {"sft_steps": 100, "lr": 3e-4, "warmup_steps": 10, "min_lr_ratio": 1.0, "weight_decay": 0.0,
         "where": "anywhere", "stray_rate": 0.02, "stray_label_share": 0.05, "seed": 1},
        {"sft_steps": 200, "lr": 5e-4, "warmup_steps": 10, "min_lr_ratio": 1.0, "weight_decay": 0.0,
         "where": "reasoning", "stray_rate": 0.05, "stray_label_share": 0.02, "seed": 2},
        {"sft_steps": 200, "lr": 5e-4, "warmup_steps": 10, "min_lr_ratio": 0.1, "weight_decay": 0.0,
         "where": "reasoning", "stray_rate": 0.08, "stray_label_share": 0.02, "seed": 3},
    ],
    "sft_batch_size": 64,
    # the measurement of the preconditions: held-out problems x T=1 samples (preconditions.py)
    "eval_problems": 256,
    "eval_samples": 8,
    "max_new_tokens": 64,
    "seed": 0,
    "threads": 1,
}


def _progress(stage: int, stages: int, steps: int, start: float):
    every = max(1, steps // 5)

    def log(step: int, loss: float) -> None:
        if (step + 1) % every == 0:
            print(f"[tailbed] stage {stage}/{stages}: {step + 1}/{steps} steps, loss {loss:.3f}, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)

    return log


def extended_base(base_path: str, recipe: dict):
    """``(model, tokenizer, beta)``: the base checkpoint with its vocabulary extended (no training yet)."""
    import torch
    from transformers import AutoModelForCausalLM

    from stapo.data.addition import problems
    from stapo.models.tailbed.vocabulary import (
        build_tailbed_tokenizer,
        extend_vocabulary,
        filler_rows,
        final_hidden_states,
    )
    from stapo.models.testbed.tokenizer import build_tokenizer
    from stapo.models.testbed.warm_start import sft_batch

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
    stream = problems("train", recipe["seed"], difficulty_of(recipe["base"]), distinct=False)
    calibration = sft_batch(build_tokenizer(), [next(stream) for _ in range(recipe["calibration_problems"])])
    embedding = base.get_input_embeddings().weight.detach()
    count = recipe["vocab_size"] - embedding.shape[0]
    rows, beta = filler_rows(embedding, final_hidden_states(base, calibration), count, recipe["filler_mass"],
                             recipe["noise_std"], recipe["seed"])
    torch.manual_seed(recipe["seed"])
    return extend_vocabulary(base, recipe["vocab_size"], rows), build_tailbed_tokenizer(recipe["vocab_size"]), beta


def _build(target: Path, recipe: dict, base_path: str) -> None:
    import torch

    from stapo.models.tailbed.preconditions import measure
    from stapo.models.tailbed.strays import Zipf, stray_batches
    from stapo.models.tailbed.vocabulary import filler_start
    from stapo.models.testbed.warm_start import heldout_problems, supervised_steps

    threads = torch.get_num_threads()
    torch.set_num_threads(recipe["threads"])
    try:
        start = time.perf_counter()
        model, tokenizer, beta = extended_base(base_path, recipe)
        print(f"[tailbed] vocabulary extended to {recipe['vocab_size']} tokens (beta {beta:.3f}), "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        zipf = Zipf(filler_start(), recipe["vocab_size"] - filler_start())
        for index, stage in enumerate(recipe["stages"], 1):
            batches = stray_batches(tokenizer, stage, recipe["sft_batch_size"], difficulty_of(recipe["base"]), zipf)
            log = _progress(index, len(recipe["stages"]), stage["sft_steps"], start)
            supervised_steps(model, stage, batches, log)
        trained = time.perf_counter()
        print(f"[tailbed] measuring the preconditions on {recipe['eval_problems']} held-out problems x "
              f"{recipe['eval_samples']} samples ...", flush=True)
        heldout = heldout_problems(recipe, difficulty_of(recipe["base"]))
        measured = measure(model, tokenizer, heldout, recipe["eval_samples"], recipe["seed"],
                           recipe["max_new_tokens"], filler_start())
    finally:
        torch.set_num_threads(threads)
    report = {
        "recipe": recipe,
        "seed": recipe["seed"],
        "base": Path(base_path).name,
        "beta": beta,
        "heldout_pass_rate": {"greedy": measured["greedy_pass_rate"], "t1": measured["t1_pass_rate"]},
        "preconditions": measured,
        "sft_seconds": round(trained - start, 1),
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    save_checkpoint(target, model, tokenizer, MARKER, report)
    print(f"[tailbed] built in {report['build_seconds']:.0f} s: greedy {measured['greedy_pass_rate']:.3f}, "
          f"T=1 {measured['t1_pass_rate']:.3f}, probe {measured['probe_pass_rate']:.3f}", flush=True)


def build_tailbed_model(cache_dir: str | Path | None = None, recipe: dict | None = None) -> str:
    """Path of the tailbed checkpoint for ``recipe`` (default ``RECIPE``), built once and cached (its base too)."""
    recipe = dict(RECIPE if recipe is None else recipe)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    base_path = build_testbed_model(root, recipe["base"])
    target = root / f"tailbed-qwen3-{recipe_key(recipe)}"
    return build_once(target, MARKER, lambda staging: _build(staging, recipe, base_path))
