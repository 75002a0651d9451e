"""verl 0.9.1's jagged response-only fields as flat tensors, and back (the driver's and the workers' mask).

The v1 trainer stores ``response_mask``, ``loss_mask``, ``advantages``, ``old_log_probs`` and
``entropy`` as jagged nested tensors, one row per response. Every mask of the registry and every
diagnostic is token-wise or over the whole batch, so both sites work on the rows' flat values (views,
no copy; a padded copy would triple the work on a long-CoT batch, whose mean length is a third of
the maximum) and rebuild jagged tensors over the same offsets. Row-major order is kept.
"""

from __future__ import annotations

import itertools

import torch
from tensordict import TensorDict

# a weighted registry entry's per-token weights (stapo.algorithm.masks.TokenMask.weight), stored in the shard as a field
# of its own: a float cannot be folded into the 0/1 masks. verl's mini- and micro-batch splits index every
# tensor field by row, so each micro-batch carries its rows' weights to the loss.
TOKEN_WEIGHT = "stapo_token_weight"


def fold_masks(
    response_mask: torch.Tensor, loss_mask: torch.Tensor, drop_response: torch.Tensor, drop_loss: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero the dropped positions, keeping each mask's dtype (any layout, all four of one shape).

    ``masked_fill``, not a product with the inverted mask: one pass, no full-batch temporary."""
    return response_mask.masked_fill(drop_response, 0), loss_mask.masked_fill(drop_loss, 0)


def flat_fields(data: TensorDict, names) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The response offsets (from 0) and each jagged field's flat values over exactly those rows."""
    reference = data["response_mask"]
    lengths = reference.offsets().diff()
    flat = {}
    for name in names:
        nested = data[name]
        if nested.lengths() is not None or not torch.equal(nested.offsets().diff(), lengths):
            raise RuntimeError(
                f"STAPO expects the response-only field {name!r} laid out as response_mask (same row lengths, "
                "no holes, as verl 0.9.1's v1 agent loop and trainer store them); this verl version lays it "
                "out differently"
            )
        start, end = int(nested.offsets()[0]), int(nested.offsets()[-1])
        flat[name] = nested.values()[start:end]
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    return offsets, flat


def jagged(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A jagged tensor over ``values`` (no copy), with the row-length bounds ``as_nested_tensor`` caches
    (without them ``to_padded_tensor`` pads every row to the length of ``values``)."""
    lengths = offsets.diff()
    bounds = {"min_seqlen": int(lengths.min()), "max_seqlen": int(lengths.max())} if lengths.numel() else {}
    return torch.nested.nested_tensor_from_jagged(values, offsets, **bounds)


def empty_rows(response_mask: torch.Tensor, offsets: torch.Tensor) -> int:
    """Rows without a response token (verl's padding samples, instant EOS), from the flat mask."""
    bounds = offsets.tolist()
    return sum(1 for a, b in itertools.pairwise(bounds) if not bool(response_mask[a:b].any()))


def store_token_weight(data: TensorDict, weight: torch.Tensor | None, offsets: torch.Tensor) -> None:
    """Put a weighted entry's flat weights into ``data`` as the jagged field :data:`TOKEN_WEIGHT`, laid out as
    ``response_mask`` (``offsets`` from :func:`flat_fields`); a 0/1 entry (``weight`` None) stores nothing."""
    if weight is not None:
        data[TOKEN_WEIGHT] = jagged(weight.to(offsets.device), offsets)


def padded_token_weight(data: TensorDict) -> torch.Tensor | None:
    """A micro-batch's weights padded to ``(batch, response_len)`` as verl pads ``response_mask`` (0 past a
    response's end); None when the shard carries none."""
    if TOKEN_WEIGHT not in data.keys():
        return None
    return data.select(TOKEN_WEIGHT).to_padded_tensor()[TOKEN_WEIGHT]
