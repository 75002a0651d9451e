"""A character-level tokenizer for the addition task, with a chat template verl can use.

Every character of a problem and of its worked solution is one token, so the model never has to
learn how digits were merged, and an answer's tokens are its digits. The turn markers and the
end-of-turn token are special tokens: verl's agent loop renders the chat template, tokenizes it,
and stops sampling at ``eos_token``; ``pad_token`` fills its batches. There is no BOS.
"""

from __future__ import annotations

PAD, UNK, END = "<|pad|>", "<|unk|>", "<|end|>"
ROLES = ("user", "assistant", "system")
ROLE_TOKENS = tuple(f"<|{role}|>" for role in ROLES)
CHARACTERS = tuple("0123456789+=;\\{}boxed")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` (loads back with ``AutoTokenizer``); decoding joins characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = (PAD, UNK, END, *ROLE_TOKENS)
    vocab = {token: index for index, token in enumerate(specials + CHARACTERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=END,
        additional_special_tokens=list(ROLE_TOKENS),
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
