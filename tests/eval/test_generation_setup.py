"""One set-up of HF generation (eval back-end, S2T analysis): end and pad ids from the generation config."""

from __future__ import annotations

import pytest
from transformers import GenerationConfig

from stapo.models.generation import GenerationIds, generation_ids, load_for_generation
from stapo.models.tiny import build_tiny_model


class _Tokenizer:
    eos_token_id = 7


@pytest.mark.parametrize(
    "eos, pad, tokenizer, expected",
    [
        (2, 0, _Tokenizer(), GenerationIds([2], 0)),  # the config names both: the tokenizer is not asked
        ([2, 5], None, _Tokenizer(), GenerationIds([2, 5], 2)),  # several ends; the first pads
        (None, None, _Tokenizer(), GenerationIds([7], 7)),  # nothing in the config: the tokenizer's eos
        (None, 3, None, GenerationIds([], 3)),  # the CPU rollout has no tokenizer: no end, pad as named
        (None, None, None, GenerationIds([], 0)),
    ],
)
def test_generation_ids(eos, pad, tokenizer, expected):
    assert generation_ids(GenerationConfig(eos_token_id=eos, pad_token_id=pad), tokenizer) == expected


def test_load_for_generation_on_the_tiny_model():
    model, tokenizer, ids = load_for_generation(build_tiny_model())
    assert ids == GenerationIds([tokenizer.convert_tokens_to_ids("<|im_end|>")], tokenizer.pad_token_id)
    assert tokenizer.padding_side == "left" and not model.training
    assert next(model.parameters()).dtype.is_floating_point and str(next(model.parameters()).dtype) == "torch.float32"
