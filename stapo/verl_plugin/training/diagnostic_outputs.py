"""The settings of what the driver writes beside verl's metrics on the steps that are due: the silenced
tokens (``SpuriousTokenLog``), the threshold ablation grid and the token sample of the probability-entropy
map (``GridAndSample``); ``driver_diagnostics`` runs them.

Both run inside the trainer (verl's TaskRunner process), which holds the tokenizer and the whole
batch after advantages. Files go to ``stapo.run_dir``; put it on shared storage in a cluster. The
record format, the selection and the file are ``stapo.spurious_log``'s; this is the glue that reads
verl's batch (``old_log_probs``, ``entropy``, ``response_mask``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stapo.algorithm.ablation import DEFAULT_QS, DEFAULT_TAU_PS, threshold_grid
from stapo.algorithm.token_sample import token_sample
from stapo.spurious_log import DOWNWEIGHTED_NAME, LOG_NAME, append_jsonl

ABLATION_PREFIX = "actor/stapo/ablation/"
SAMPLE_NAME = "token_samples.jsonl"


@dataclass(frozen=True)
class SpuriousTokenLog:
    """Every ``every`` steps, up to ``max_tokens`` silenced tokens, decoded with ``context`` tokens.

    The defaults here are the recipe's (``stapo.spurious_log`` in conf/stapo_trainer.yaml spells them
    out; a test keeps the two equal)."""

    path: Path | None
    every: int = 1
    max_tokens: int = 200
    context: int = 6

    @classmethod
    def from_config(cls, stapo_config: Any) -> SpuriousTokenLog:
        run_dir = stapo_config.get("run_dir") if stapo_config else None
        settings = (stapo_config.get("spurious_log") if stapo_config else None) or {}
        every = int(settings.get("every", cls.every))
        path = Path(run_dir) / LOG_NAME if run_dir and every > 0 else None
        max_tokens, context = int(settings.get("max_tokens", cls.max_tokens)), int(settings.get("context", cls.context))
        return cls(path, every, max_tokens, context)

    def wants(self, step: int) -> bool:
        return self.path is not None and step % self.every == 0

    @property
    def downweighted_path(self) -> Path | None:
        """Where a custom weight rule's down-weighted tokens go, beside the silenced ones."""
        return self.path.with_name(DOWNWEIGHTED_NAME) if self.path is not None else None


@dataclass(frozen=True)
class GridAndSample:
    """``stapo.algorithm.ablation`` (the threshold grid, as metrics) and ``stapo.algorithm.token_sample``
    (run_dir file).

    The defaults here are the recipe's (conf/stapo_trainer.yaml spells them out; a test keeps the two
    equal); a key absent from the config takes them."""

    ablation_every: int = 1
    tau_ps: tuple[float, ...] = DEFAULT_TAU_PS
    qs: tuple[float, ...] = DEFAULT_QS
    sample_path: Path | None = None
    sample_every: int = 1
    sample_size: int = 2000

    @classmethod
    def from_config(cls, stapo_config: Any) -> GridAndSample:
        stapo_config = stapo_config or {}
        ablation = stapo_config.get("ablation") or {}
        sample = stapo_config.get("token_sample") or {}
        run_dir = stapo_config.get("run_dir")
        sample_every = int(sample.get("every", cls.sample_every))
        return cls(
            ablation_every=int(ablation.get("every", cls.ablation_every)),
            tau_ps=tuple(float(v) for v in ablation.get("tau_p", cls.tau_ps)),
            qs=tuple(float(v) for v in ablation.get("q", cls.qs)),
            sample_path=Path(run_dir) / SAMPLE_NAME if run_dir and sample_every > 0 else None,
            sample_every=sample_every,
            sample_size=int(sample.get("size", cls.sample_size)),
        )

    def ablation_wanted(self, step: int) -> bool:
        return self.ablation_every > 0 and bool(self.tau_ps) and bool(self.qs) and step % self.ablation_every == 0

    def sample_wanted(self, step: int) -> bool:
        return self.sample_path is not None and self.sample_size > 0 and step % self.sample_every == 0

    def ablation_metrics(self, log_prob, entropy, advantages, response_mask) -> dict[str, float]:
        grid = threshold_grid(log_prob, entropy, advantages, response_mask, self.tau_ps, self.qs)
        return {ABLATION_PREFIX + key: value for key, value in grid.items()}

    def write_sample(self, step: int, log_prob, entropy, advantages, response_mask, silenced) -> None:
        records = token_sample(log_prob, entropy, advantages, response_mask, silenced, self.sample_size)
        append_jsonl(self.sample_path, [{"step": step, **record} for record in records])
