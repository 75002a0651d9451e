"""The small Qwen3 configuration the locally built models share (``stapo://tiny``, ``stapo://testbed``).

Both are decoder-only Qwen3s with tied embeddings and no BOS token, shaped by a settings/recipe dict
that is stored with the checkpoint; only the shape, the vocabulary and the special tokens differ.
"""

from __future__ import annotations

# a model config attribute: token ids from this one up are ones the task never needs (a testbed's filler
# tokens); the CPU rollout then logs the probability mass they take (stapo.verl_plugin.cpu.sampling)
UNUSED_FROM_KEY = "stapo_unused_token_from"
SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)


def small_qwen3_config(shape: dict, vocab_size: int, eos_token_id: int, pad_token_id: int, **extra):
    """A ``Qwen3Config`` with the ``SHAPE_KEYS`` of ``shape``, tied embeddings and no BOS; ``extra`` passes
    further fields (``initializer_range``)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        **{key: shape[key] for key in SHAPE_KEYS},
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        **extra,
    )
