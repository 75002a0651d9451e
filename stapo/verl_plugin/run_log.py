"""What the STAPO trainer writes beside verl's metrics: silenced tokens and reward extra info.

Both run inside the trainer (verl's TaskRunner process), which holds the tokenizer and the whole
batch after advantages. Files go to ``stapo.run_dir``; put it on shared storage in a cluster. The
record format, the selection and the file are ``stapo.spurious_log``'s; this is the glue that reads
verl's batch (``old_log_probs``, ``entropy``, ``response_mask``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stapo.spurious_log import LOG_NAME, append_jsonl, spread_evenly, spurious_records, valid_lengths


@dataclass(frozen=True)
class SpuriousTokenLog:
    """Every ``every`` steps, up to ``max_tokens`` silenced tokens, decoded with ``context`` tokens."""

    path: Path | None
    every: int = 1
    max_tokens: int = 200
    context: int = 6

    @classmethod
    def from_config(cls, stapo_config: Any) -> SpuriousTokenLog:
        run_dir = stapo_config.get("run_dir") if stapo_config else None
        settings = (stapo_config.get("spurious_log") if stapo_config else None) or {}
        every = int(settings.get("every", 1))
        path = Path(run_dir) / LOG_NAME if run_dir and every > 0 else None
        return cls(path, every, int(settings.get("max_tokens", 200)), int(settings.get("context", 6)))

    def wants(self, step: int) -> bool:
        return self.path is not None and step % self.every == 0

    def write(self, step: int, responses: torch.Tensor, spurious: torch.Tensor, padded, tokenizer) -> None:
        """Append this step's records (at most ``max_tokens``, spread over the batch) and flush."""
        keep = spread_evenly(spurious, self.max_tokens)
        if not bool(keep.any()):
            return
        records = spurious_records(
            responses,
            keep,
            padded["old_log_probs"].float(),
            padded["entropy"].float(),
            lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            context=self.context,
            step=step,
            lengths=valid_lengths(padded["response_mask"]),
        )
        append_jsonl(self.path, records)


def reward_extra_means(extra_fields: list) -> dict[str, float]:
    """Mean of every numeric ``reward_extra_info`` value over the batch, as ``reward/<key>/mean``."""
    values: dict[str, list[float]] = defaultdict(list)
    for item in extra_fields:
        item = getattr(item, "data", item)  # a TensorDict non-tensor entry wraps the dict
        info = item.get("reward_extra_info", {}) if isinstance(item, dict) else {}
        for key, value in info.items():
            if isinstance(value, bool | int | float) and math.isfinite(float(value)):
                values[key].append(float(value))
    return {f"reward/{key}/mean": sum(found) / len(found) for key, found in values.items()}
