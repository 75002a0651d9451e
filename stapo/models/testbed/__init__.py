"""``stapo://testbed``: a 1M-parameter Qwen3 that adds well greedily but slips when sampled, for fast RL runs.

A 4-layer ``Qwen3ForCausalLM`` (hidden 128, 4 heads of head_dim 32, as vLLM's CPU attention needs,
tied embeddings, fp32) with a character tokenizer (``tokenizer.py``), trained from a fixed seed on
worked solutions of ``stapo.data.addition`` for a fixed number of steps (``warm_start.py``), so that
its sampled pass rate on the held-out split is well inside (0, 1): RL on CPU then has mixed groups
to learn from in its first steps.

The build is deterministic (same recipe, same seed, same thread count: the same weights bit for
bit) and cached under ``~/.cache/stapo/testbed-<hash of the recipe>``; ``stapo_testbed.json`` in
that folder holds the recipe and the pass rates measured at the end of the build.

RL on it uses ``GainAdamW`` (``optim.py``; set in ``conf/model_preset/testbed.yaml``): the weight
matrices tolerate only a small learning rate, the norm gains that sharpen the output need a larger one.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from stapo.models.cache import build_once, save_checkpoint
from stapo.models.tiny import default_cache_dir

MARKER = "stapo_testbed.json"
RECIPE = {
    "version": 1,
    # the task (stapo.data.addition.Difficulty)
    "operands": 3,
    "min_digits": 2,
    "max_digits": 3,
    # the model
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 256,
    # the supervised warm start; held-out pass rate (greedy / T=1) at the end of the cosine schedule:
    # 250 steps 0.79 / 0.12, 320 steps 0.96 / 0.32, 400 steps 1.0 / 0.56. At 320 a sampled group is
    # mostly mixed, and RL's gain is sharpening what greedy decoding already knows
    "sft_steps": 320,
    "sft_batch_size": 64,
    "lr": 1e-3,
    "warmup_steps": 50,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.0,
    # the measurement of the starting point
    "eval_problems": 256,
    "max_new_tokens": 64,
    # initialisation, data order and sampling; the thread count fixes the kernels' reduction order (one
    # thread: several would also spin-wait for each other on a busy machine, several times slower)
    "seed": 0,
    "threads": 1,
}


def recipe_key(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def difficulty_of(recipe: dict):
    from stapo.data.addition import Difficulty

    return Difficulty(recipe["operands"], recipe["min_digits"], recipe["max_digits"])


def build_model(recipe: dict):
    """``(model, tokenizer)`` freshly initialised from ``recipe["seed"]`` (no training)."""
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    from stapo.models.qwen3 import small_qwen3_config
    from stapo.models.testbed.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    config = small_qwen3_config(recipe, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(recipe["seed"])
    model = Qwen3ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model, tokenizer


def _progress(recipe: dict, start: float):
    """A line every tenth of the warm start: the first build takes minutes."""
    every = max(1, recipe["sft_steps"] // 10)

    def log(step: int, loss: float) -> None:
        if (step + 1) % every == 0:
            print(f"[testbed] warm start {step + 1}/{recipe['sft_steps']} steps, loss {loss:.3f}, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)

    return log


def _build(target: Path, recipe: dict) -> None:
    import torch

    from stapo.models.testbed.warm_start import heldout_problems, pass_rate, supervised_warm_start

    threads = torch.get_num_threads()
    torch.set_num_threads(recipe["threads"])
    try:
        start = time.perf_counter()
        model, tokenizer = build_model(recipe)
        supervised_warm_start(model, tokenizer, recipe, difficulty_of(recipe), log=_progress(recipe, start))
        trained = time.perf_counter()
        heldout = heldout_problems(recipe, difficulty_of(recipe))
        rates = {"greedy": pass_rate(model, tokenizer, heldout, recipe, 0.0),
                 "t1": pass_rate(model, tokenizer, heldout, recipe, 1.0)}
    finally:
        torch.set_num_threads(threads)
    report = {
        "recipe": recipe,
        "seed": recipe["seed"],
        "heldout_pass_rate": rates,
        "heldout_problems": len(heldout),
        "sft_seconds": round(trained - start, 1),
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    save_checkpoint(target, model, tokenizer, MARKER, report)


def build_testbed_model(cache_dir: str | Path | None = None, recipe: dict | None = None) -> str:
    """Path of the testbed checkpoint for ``recipe`` (default ``RECIPE``), built once and cached."""
    recipe = dict(RECIPE if recipe is None else recipe)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(root / f"testbed-qwen3-{recipe_key(recipe)}", MARKER, lambda target: _build(target, recipe))
