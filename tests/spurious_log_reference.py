"""References for the silenced-token log: the padded-batch path the driver's flat path must match.

The driver (``stapo.verl_plugin.training.driver_diagnostics``) writes the log from verl's jagged fields,
fetching only the rows it names; these write the same records from padded tensors of the whole
batch, the obvious way, for the tests to compare.
"""

from __future__ import annotations

import torch

from stapo.algorithm.token_sample import spread_positions
from stapo.spurious_log import append_jsonl, spurious_records, valid_lengths


def spread_evenly(spurious: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """A copy of the mask keeping at most ``max_tokens`` of its tokens, evenly spread in batch order.

    The k silenced tokens (row-major order) are cut into ``max_tokens`` equal runs and the middle
    one of each run is kept: deterministic, and a capped step shows tokens from the whole batch
    (every prompt group, early and late positions), not only its first rows.
    """
    keep = torch.zeros(spurious.shape, dtype=torch.bool, device=spurious.device)
    keep.view(-1)[spread_positions(spurious, max_tokens)] = True
    return keep


def write_padded_log(log, step: int, responses: torch.Tensor, spurious: torch.Tensor, padded, tokenizer) -> None:
    """``log`` (a ``SpuriousTokenLog``)'s records of this step from padded tensors (at most ``max_tokens``,
    spread over the batch), appended to its file."""
    keep = spread_evenly(spurious, log.max_tokens)
    if not bool(keep.any()):
        return
    records = spurious_records(
        responses,
        keep,
        padded["old_log_probs"].float(),
        padded["entropy"].float(),
        lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        context=log.context,
        step=step,
        lengths=valid_lengths(padded["response_mask"]),
    )
    append_jsonl(log.path, records)
