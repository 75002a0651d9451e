"""Held-out validation at further decoding settings, beside verl's own (``stapo.val_decodings``).

The paper trains at T=1 / top-p=1 and evaluates at both T=1 / top-p=1 and T=0.7 / top-p=0.9
(``stapo.eval.core``, the evaluation protocol). verl validates once, with ``rollout.val_kwargs``. For each name in
``stapo.val_decodings`` (a setting of ``stapo.eval.core.DECODING``) the STAPO trainer validates again:
the same problems, the same n, the same per-request seeds (common random numbers across decodings),
and logs every metric of that pass under the setting's name (``stapo.eval.val_metrics.decoding_key``).

The setting reaches the rollout as a column of the validation batch (``DECODING_FIELD``): verl's agent
loop worker hands each row's fields to the agent loop, and the ``stapo_seeded`` loop puts the setting's
temperature and top-p into the request's sampling parameters. Training rollouts are seeded per request,
so the extra passes change no training sample (tests/e2e/test_paired.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from omegaconf import open_dict

from stapo.eval.core import DECODING

DECODING_FIELD = "stapo_decoding"
SETTING = "stapo.val_decodings"


def sampling_of(name: str) -> dict[str, float]:
    """The sampling parameters a request takes at the named setting (temperature and top-p)."""
    if name not in DECODING:
        raise ValueError(f"{SETTING}: unknown decoding {name!r}; choose from {list(DECODING)}")
    return dict(DECODING[name])


class DecodedBatches:
    """The validation loader's batches, each row tagged with the decoding setting to sample it at."""

    def __init__(self, loader, name: str):
        sampling_of(name)
        self.loader, self.name = loader, name

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict]:
        for batch in self.loader:
            rows = len(batch["raw_prompt"])
            yield {**batch, DECODING_FIELD: np.array([self.name] * rows, dtype=object)}


@contextmanager
def decoded_validation(trainer, name: str):
    """Within: ``trainer._validate()`` samples at the named setting, and writes verl's generation dump (when
    ``trainer.validation_data_dir`` is set) to a subfolder named after it instead of over the first pass's."""
    loader = trainer.val_dataloader
    dump_dir = trainer.config.trainer.get("validation_data_dir", None)
    trainer.val_dataloader = DecodedBatches(loader, name)
    if dump_dir:
        with open_dict(trainer.config):
            trainer.config.trainer.validation_data_dir = f"{dump_dir}/{name}"
    try:
        yield
    finally:
        trainer.val_dataloader = loader
        if dump_dir:
            with open_dict(trainer.config):
                trainer.config.trainer.validation_data_dir = dump_dir
