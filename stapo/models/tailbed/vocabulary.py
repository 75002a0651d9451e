"""The tailbed's long tail: word-like filler tokens after the testbed's characters, and their embedding rows.

An LLM's vocabulary holds tens of thousands of tokens a given reply never needs, each keeping a sliver
of probability at every position: sampled at T=1 they are the rare tokens STAPO is about. The fillers
play that part. Each is a space and consonant-vowel syllables (`` ka``, `` zumi``) written with letters
none of the task's characters use (``b o x e d`` spell ``boxed``), so a filler never joins a digit, a
brace or the ``\\boxed`` command: one in the chain of thought leaves the boxed answer's parse as it was
(tests/unit/test_tailbed.py checks every filler against the reward). Shorter words come first, as an
LLM's frequent tokens are short, and the ids' order is the fillers' frequency rank (``strays.py``).

The new rows of the tied embedding are ``-beta * u + N(0, noise_std)``: ``u`` is the unit direction along
which the base model's final hidden states at reply positions project most nearly alike (all positively),
and ``beta`` is solved (bisection) so that the fillers together hold ``filler_mass`` of a position's
probability on average over those positions. The base's logits over its own tokens are untouched (their
order and ratios stay the base's): the extension adds a thin tail, as a real checkpoint spreads mass over
tokens a task never needs, without changing what the model does with its own tokens.
"""

from __future__ import annotations

from itertools import islice, product

import torch

CONSONANTS = "cfghjklmnpqrstvwz"
VOWELS = "aiu"
LETTERS = "".join(sorted(CONSONANTS + VOWELS))


def filler_words(count: int) -> tuple[str, ...]:
    """``count`` distinct fillers: `` ``+syllables, all one-syllable words, then two-syllable ones, and so on."""
    syllables = ["".join(pair) for pair in product(CONSONANTS, VOWELS)]

    def words():
        length = 1
        while True:
            yield from (" " + "".join(parts) for parts in product(syllables, repeat=length))
            length += 1

    return tuple(islice(words(), count))


def build_tailbed_tokenizer(vocab_size: int):
    """The testbed's tokenizer with fillers up to ``vocab_size`` tokens in all (ids after the characters)."""
    from stapo.models.testbed.tokenizer import build_tokenizer

    base = len(build_tokenizer())
    if vocab_size <= base:
        raise ValueError(f"vocab_size must exceed the testbed's {base} tokens, got {vocab_size}")
    return build_tokenizer(filler_words(vocab_size - base), LETTERS)


def filler_start() -> int:
    """The first filler id: every id from here on is a filler (the testbed's own tokens come first)."""
    from stapo.models.testbed.tokenizer import build_tokenizer

    return len(build_tokenizer())


@torch.no_grad()
def final_hidden_states(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The base model's final (normed) hidden states at the positions that predict a label, ``(n, hidden)``."""
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    predicts = batch["labels"][:, 1:] != -100  # position t predicts label t + 1
    return hidden[:, :-1][predicts].to(torch.float64)


def filler_rows(embedding: torch.Tensor, hidden: torch.Tensor, count: int, filler_mass: float, noise_std: float,
                seed: int) -> tuple[torch.Tensor, float]:
    """``count`` new embedding rows and their ``beta``: mean filler probability ``filler_mass`` at ``hidden``."""
    # the direction along which every state projects most nearly alike (least squares of H u = 1): the base's
    # states share no mean direction (their mean's projection changes sign), but they do share this one. QR
    # ("gels"): the CPU default ("gelsy") gives other last bits from one process to the next
    ones = torch.ones(len(hidden), 1, dtype=hidden.dtype)
    direction = torch.linalg.lstsq(hidden, ones, driver="gels").solution.squeeze(1)
    direction = direction / direction.norm()
    generator = torch.Generator(device="cpu").manual_seed(seed)
    noise = torch.randn(count, embedding.shape[1], generator=generator, dtype=torch.float64, device="cpu")
    noise = noise.to(hidden.device) * noise_std
    own = torch.logsumexp(hidden @ embedding.to(torch.float64).T, dim=-1)
    noise_logits, along = hidden @ noise.T, hidden @ direction

    def mass(beta: float) -> float:
        fillers = torch.logsumexp(noise_logits - beta * along.unsqueeze(-1), dim=-1)
        return float(torch.sigmoid(fillers - own).mean())  # e^f / (e^own + e^f)

    low, high = 0.0, 1.0
    while mass(high) > filler_mass:
        low, high = high, 2 * high
        if high > 1e6:
            raise ValueError("no beta reaches the filler mass: the hidden states share no direction")
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if mass(middle) > filler_mass else (low, middle)
    beta = (low + high) / 2
    return (noise - beta * direction).to(embedding.dtype), beta


def extend_vocabulary(model, vocab_size: int, rows: torch.Tensor):
    """A copy of ``model`` with ``rows`` appended to its tied embedding (``vocab_size`` rows in all)."""
    from transformers import Qwen3ForCausalLM

    from stapo.models.qwen3 import UNUSED_FROM_KEY

    config = model.config.to_dict()
    # the fillers start where the base's vocabulary ends: the CPU rollout logs the mass they take
    config.update(vocab_size=vocab_size, **{UNUSED_FROM_KEY: model.config.vocab_size})
    extended = Qwen3ForCausalLM(type(model.config).from_dict(config)).float()
    state = model.state_dict()
    state["model.embed_tokens.weight"] = torch.cat([state["model.embed_tokens.weight"], rows])
    state.pop("lm_head.weight", None)  # tied: the embedding is the output layer
    missing, unexpected = extended.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"the extension lost weights: missing {missing}, unexpected {unexpected}")
    extended.tie_weights()
    extended.generation_config = model.generation_config
    return extended.eval()
