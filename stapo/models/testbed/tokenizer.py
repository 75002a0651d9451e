"""A character-level tokenizer for the addition task, with a chat template verl can use.

Every character of a problem and of its worked solution is one token, so the model never has to
learn how digits were merged, and an answer's tokens are its digits. The turn markers and the
end-of-turn token are special tokens: verl's agent loop renders the chat template, tokenizes it,
and stops sampling at ``eos_token``; ``pad_token`` fills its batches. There is no BOS.

``words`` appends whole-word tokens after the characters (``stapo://tailbed``'s fillers): each is a
space and letters none of the task's characters use, so a word is split off as one piece and text
made of the characters tokenizes exactly as without them.
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


def word_pattern(letters: str) -> str:
    """The pre-tokenizer's pattern when words are added: a space and a run of ``letters``, else one character."""
    if set(letters) & set("".join(CHARACTERS)) or not letters.isalpha():
        raise ValueError(f"word letters must be letters the task's characters do not use, got {letters!r}")
    return f" [{letters}]+|."


def build_tokenizer(words: tuple[str, ...] = (), letters: str = ""):
    """A ``PreTrainedTokenizerFast`` (loads back with ``AutoTokenizer``); decoding joins the pieces.

    ``words`` (each a space then ``letters``) get the ids after the characters, in their order."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = (PAD, UNK, END, *ROLE_TOKENS)
    vocab = {token: index for index, token in enumerate(specials + CHARACTERS + tuple(words))}
    if len(vocab) != len(specials) + len(CHARACTERS) + len(words):
        raise ValueError("added words must be distinct and differ from the characters")
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(word_pattern(letters) if words else "."), behavior="isolated")
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
