"""A tiny Qwen3-architecture model and its tokenizer, built locally and deterministically.

No hub access: a byte-level BPE tokenizer is trained on the synthetic task's text, a 2-layer
Qwen3 model is initialised from a fixed seed, and both are saved as an ordinary HF checkpoint,
cached under ``~/.cache/stapo/tiny-<hash of the settings>``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from stapo.models.cache import build_once

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SETTINGS = {
    "version": 3,
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    # head size 32: the smallest vLLM's CPU attention accepts (rollout.name=vllm runs this model too);
    # two heads sharing one key/value head keep the parameter count of the earlier 4 x 16 layout
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "initializer_range": 0.3,  # peaked enough that some sampled tokens fall below tau_p
    "seed": 0,
}


def default_cache_dir() -> Path:
    return Path(os.environ.get("STAPO_CACHE", Path.home() / ".cache" / "stapo"))


def _train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _build(target: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    from stapo.data.synthetic import corpus_text, make_rows
    from stapo.models.qwen3 import small_qwen3_config

    rows = make_rows(2000, "tokenizer", seed=0) + make_rows(200, "val", seed=0)
    texts = corpus_text(rows) + ["Let me think step by step.", "So the answer is", "assistant", "user"]
    tokenizer = _train_tokenizer(texts, SETTINGS["vocab_size"])
    torch.manual_seed(SETTINGS["seed"])
    config = small_qwen3_config(
        SETTINGS,
        len(tokenizer),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        initializer_range=SETTINGS["initializer_range"],
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True
    )
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / "stapo_tiny.json").write_text(json.dumps(SETTINGS, indent=2))


def build_tiny_model(cache_dir: str | Path | None = None) -> str:
    """Path of the tiny checkpoint, built once per settings hash and cached."""
    key = hashlib.sha256(json.dumps(SETTINGS, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return build_once(root / f"tiny-qwen3-{key}", "stapo_tiny.json", _build)
