"""Set-up of a Hugging Face ``generate`` loop, one way for every caller (eval, the S2T analysis, the CPU rollout).

The end and padding tokens come from the model's *generation config*, not from the tokenizer: a chat
model's turn ends with its chat end token (SmolLM2's ``<|im_end|>``, which the converted checkpoint
names there), while the tokenizer's ``eos_token`` may be another one (the GGUF metadata names
``<|im_start|>``). Sampling then stops where verl's rollout stops, and the response masks agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GenerationIds:
    """``eos_ids``: every id that ends a response; ``pad_id``: what fills the batch after it."""

    eos_ids: list[int]
    pad_id: int


def generation_ids(generation_config: Any, tokenizer: Any = None) -> GenerationIds:
    """End and pad ids from a ``GenerationConfig``; the tokenizer's eos only when the config names none.

    Without a pad id the first end id pads (as ``generate`` itself does), without either 0 does.
    """
    eos = generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not eos_ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        eos_ids = [tokenizer.eos_token_id]
    pad = generation_config.pad_token_id
    return GenerationIds(eos_ids, pad if pad is not None else (eos_ids[0] if eos_ids else 0))


def load_for_generation(model_path: str):
    """``(model, tokenizer, ids)``: float32 model in eval mode, left-padding tokenizer with a pad token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"  # generate() appends at the right end of every row
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = generation_ids(model.generation_config, tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(ids.pad_id)
    return model, tokenizer, ids
