"""The token mask folded into one DP rank's shard of the batch, before verl's actor update.

docs/algorithm.md section 3. Each actor worker holds its shard of the step's batch (fetched from
TransferQueue by verl's dispatch) when its ``update_actor`` starts. :func:`fold_shard` builds the
mask there: the token-wise rules run on the shard, a threshold over the batch (S2T's tau_h, the
20-Entropy cut) is taken over every DP rank of ``group``, over the step's batch or, with
``threshold_scope: mini_batch``, over each PPO mini-batch verl will split the update into
(``mini_batches``; the paper's scope) (for S2T only the candidates' entropies
travel, a small share of the tokens; the logged percentiles gather up to 2^20 entropies), and the
mask is folded into the shard's ``response_mask`` (the policy-gradient sum) and ``loss_mask`` (the
token count). verl's engine then counts the mini-batch's tokens from the folded ``loss_mask``, DP
all-reduced, so the renormalisation stays exact, and the
mask equals the one the whole batch would give in one process, bit for bit.

The driver never touches the full-batch tensors for the mask (it fetches them only on the steps
that write diagnostics: ``driver_diagnostics``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tensordict import TensorDict

from stapo.algorithm.masks import (
    MaskInputs,
    MaskSettings,
    MaskSpec,
    build_token_mask,
    build_token_mask_in_parts,
    finalize_metrics,
    get_token_mask,
    group_totals,
)
from stapo.verl_plugin.training.jagged import empty_rows, flat_fields, fold_masks, jagged, store_token_weight
from stapo.verl_plugin.training.mini_batches import MiniBatchSplit, token_parts

# the folded loss_mask's DP-global token count; the trainer checks that verl divided by it
FOLDED_LOSS_TOKENS = "loss_tokens_folded"
OLD_PASS_FIELDS = ("old_log_probs", "entropy")


def needed_fields(spec: MaskSpec) -> tuple[str, ...]:
    """The batch fields the registry entry ``spec`` cannot do without."""
    return (
        ("response_mask", "loss_mask", "advantages")
        + (("old_log_probs",) if spec.needs_log_prob else ())
        + (("entropy",) if spec.needs_entropy else ())
    )


def fold_shard(
    data: TensorDict,
    settings: MaskSettings,
    group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Fold the mask into ``data``'s ``response_mask`` and ``loss_mask`` (replaced in ``data``) and
    return its metrics, totals over every rank of ``group`` (the same on every rank).

    ``data`` holds verl's jagged response-only fields. The mask is built on ``device`` (where the
    group's collectives run: a NCCL group needs the accelerator) and folded on the fields' device.
    """
    spec = get_token_mask(settings.token_mask)
    present, needed = set(data.keys()), needed_fields(spec)
    missing = [name for name in needed if name not in present]
    if missing:
        raise RuntimeError(
            f"policy_loss.token_mask={settings.token_mask} reads {missing}, which the actor update's batch "
            "lacks; the old-policy pass must store them (actor_rollout_ref.actor.calculate_entropy=true "
            "keeps the entropy)"
        )
    # the old pass's fields are read when present even if the mask does not need them: their
    # non-finite counts are reported for every mask
    names = needed + tuple(name for name in OLD_PASS_FIELDS if name in present and name not in needed)
    offsets, flat = flat_fields(data, names)

    def on_device(name: str) -> torch.Tensor | None:
        return flat[name].to(device).float() if name in flat else None

    response_mask = flat["response_mask"].to(device).bool()
    inputs = MaskInputs(
        response_mask, on_device("advantages"), on_device("old_log_probs"), on_device("entropy"), group, offsets
    )
    if settings.threshold_scope == "mini_batch":  # the paper's: each PPO mini-batch's own threshold
        rank, size = (0, 1) if group is None else (dist.get_rank(group), dist.get_world_size(group))
        row_index, num_parts = MiniBatchSplit.from_batch(data).shard_index(len(offsets) - 1, rank, size)
        built = build_token_mask_in_parts(inputs, settings, token_parts(row_index, offsets).to(device), num_parts)
    else:
        built = build_token_mask(inputs, settings)
    drop_response = built.drop_response.to(flat["response_mask"].device)
    drop_count = built.drop_count.to(flat["loss_mask"].device)
    folded_response, folded_loss = fold_masks(flat["response_mask"], flat["loss_mask"], drop_response, drop_count)
    counts = {
        **built.counts,
        "empty_responses": float(empty_rows(flat["response_mask"], offsets)),
        FOLDED_LOSS_TOKENS: float(torch.count_nonzero(folded_loss)),
    }
    data["response_mask"] = jagged(folded_response, offsets)
    data["loss_mask"] = jagged(folded_loss, offsets)
    store_token_weight(data, built.weight, offsets)  # a weighted entry's factors travel to the loss as a field
    return finalize_metrics(spec, group_totals(spec, counts, group, device), built.stats)
