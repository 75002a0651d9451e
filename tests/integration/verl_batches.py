"""Real verl inputs for the integration tests: Hydra-composed configs and jagged micro-batches.

Micro-batches are laid out the way verl's FSDP engine hands them to the loss function (nested
prompts/responses, response-only masks, model log-probs over the whole sequence, left-shifted by
one), so the tests drive verl's own ``ppo_loss`` rather than a copy of it.
"""

from __future__ import annotations

import copy
import functools

import torch
from hydra import compose, initialize_config_module
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass

from stapo.algorithm.masks import MaskInputs, MaskSettings, TokenMask, build_token_mask
from stapo.verl_plugin.training.config import TARGET
from stapo.verl_plugin.training.jagged import TOKEN_WEIGHT, fold_masks
from stapo.verl_plugin.training.losses import folded_mask_update

PL = "actor_rollout_ref.actor.policy_loss"


def compose_verl(overrides: list[str]):
    """verl's own ppo_trainer config with the given Hydra overrides."""
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def stapo_overrides(trainer_mode: str = "stapo", **policy_loss) -> list[str]:
    """The typed policy_loss section with the registered ``masked_clip`` loss (unless ``loss_mode`` says
    otherwise) and the given mask settings, STAPO's clip constants, and the trainer that folds masks."""
    policy_loss = {"loss_mode": "masked_clip", **policy_loss}
    overrides = [
        f"trainer.v1.trainer_mode={trainer_mode}",
        f"{PL}._target_={TARGET}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=10.0",
    ]
    for key, value in policy_loss.items():
        prefix = "" if key == "loss_mode" else "+"
        overrides.append(f"{prefix}{PL}.{key}={value}")
    return overrides


def actor_config(**policy_loss):
    """The typed actor config (a fresh copy: verl's ppo_loss writes into ``global_batch_info``)."""
    return copy.deepcopy(_actor_config(tuple(sorted(policy_loss.items()))))


@functools.cache
def _actor_config(policy_loss: tuple):
    # a Hydra composition takes seconds on a loaded 2-core machine; each distinct config is composed once
    return omega_conf_to_dataclass(compose_verl(stapo_overrides(**dict(policy_loss))).actor_rollout_ref.actor)


def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def make_micro_batch(
    rows: dict[str, list[torch.Tensor]],
    prompt_lens: list[int],
    batch_num_tokens: int,
    global_bsz: int,
    flat_log_probs: torch.Tensor | None = None,
):
    """A micro-batch TensorDict and a model output whose response log-probs are ``rows['log_prob']``.

    Returns ``(model_output, data, leaf)`` where ``leaf`` is the flat tensor the gradient reaches.
    ``flat_log_probs`` (a model's output over every position, laid out as verl's engine does) replaces
    the leaf built from ``rows['log_prob']``; the rows then only give the response lengths.
    """
    pieces = []
    for prompt_len, log_prob in zip(prompt_lens, rows["log_prob"]):
        # positions prompt_len-1 .. prompt_len+resp_len-2 predict the response tokens
        pieces += [torch.zeros(prompt_len - 1, dtype=log_prob.dtype), log_prob, torch.zeros(1, dtype=log_prob.dtype)]
    leaf = torch.cat(pieces).detach().requires_grad_(True) if flat_log_probs is None else flat_log_probs
    lengths = torch.tensor([p + len(r) for p, r in zip(prompt_lens, rows["log_prob"])])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(leaf, offsets)}
    if "model_entropy" in rows:
        entropy_pieces = []
        for prompt_len, entropy in zip(prompt_lens, rows["model_entropy"]):
            entropy_pieces += [torch.zeros(prompt_len - 1), entropy, torch.zeros(1)]
        model_output["entropy"] = torch.nested.nested_tensor_from_jagged(torch.cat(entropy_pieces), offsets)
    data = TensorDict(
        {
            "prompts": jagged([torch.ones(p, dtype=torch.long) for p in prompt_lens]),
            "responses": jagged([torch.ones(len(r), dtype=torch.long) for r in rows["log_prob"]]),
            "response_mask": jagged(rows["response_mask"]),
            "loss_mask": jagged(rows["loss_mask"]),
            "old_log_probs": jagged(rows["old_log_prob"]),
            "advantages": jagged(rows["advantages"]),
        },
        batch_size=len(prompt_lens),
    )
    for key in ("rollout_is_weights", "ref_log_prob", TOKEN_WEIGHT):  # TOKEN_WEIGHT: a weighted entry's, folded
        if key in rows:
            data[key] = jagged(rows[key])
    tu.assign_non_tensor(data, batch_num_tokens=batch_num_tokens, dp_size=1, global_batch_size=global_bsz)
    return model_output, data, leaf


def fold_as_trainer(
    tensors: dict[str, torch.Tensor], settings: MaskSettings
) -> tuple[torch.Tensor, torch.Tensor, TokenMask]:
    """``source: old``: the mask over the whole batch from the old-policy pass, folded as the STAPO actor
    worker does on one rank (``shard_mask.fold_shard``). Returns padded ``(response_mask, loss_mask, built)``."""
    mask = tensors["response_mask"].bool()
    built = build_token_mask(
        MaskInputs(mask, tensors["advantages"], tensors["old_log_prob"], tensors.get("entropy")), settings
    )
    response_mask, loss_mask = fold_masks(mask.long(), mask.long(), built.drop_response, built.drop_count)
    return response_mask, loss_mask, built


def padded_rows(tensors: dict[str, torch.Tensor], response_mask: torch.Tensor, loss_mask: torch.Tensor) -> dict:
    """Full-width rows for :func:`make_micro_batch`: positions past a response's end stay in the row with
    mask 0, so whatever value sits there (NaN, inf) really reaches verl's loss code."""
    rows = {
        "old_log_prob": list(tensors["old_log_prob"]),
        "log_prob": list(tensors["log_prob"]),
        "advantages": list(tensors["advantages"]),
        "response_mask": list(response_mask.long()),
        "loss_mask": list(loss_mask.long()),
    }
    if tensors.get("model_entropy") is not None:
        rows["model_entropy"] = list(tensors["model_entropy"].float())
    return rows


def run_micro_batches(
    loss_fn, rows, prompt_lens, splits, batch_num_tokens, dp_size=1, dp_group=None, global_batch_size=None
):
    """verl's micro-batch loop for one mini-batch: loss per micro-batch, backward, gradient per response token.

    Returns ``(summed loss, gradient rows, metrics per micro-batch)``; the summed loss is what verl's
    gradient accumulation optimises (each micro-batch is already normalised by the mini-batch count).
    Runs inside the STAPO actor worker's span of an update over a folded shard (the rows hold masks
    the caller folded as the worker does).
    """
    with folded_mask_update():
        return _run_micro_batches(
            loss_fn, rows, prompt_lens, splits, batch_num_tokens, dp_size, dp_group, global_batch_size
        )


def _run_micro_batches(loss_fn, rows, prompt_lens, splits, batch_num_tokens, dp_size, dp_group, global_batch_size):
    total, grads, all_metrics, start = 0.0, [], [], 0
    for size in splits:
        part = {key: value[start : start + size] for key, value in rows.items()}
        lens = prompt_lens[start : start + size]
        global_bsz = global_batch_size or len(prompt_lens)
        model_output, data, leaf = make_micro_batch(part, lens, batch_num_tokens, global_bsz)
        tu.assign_non_tensor(data, dp_size=dp_size)
        loss, metrics = loss_fn(model_output=model_output, data=data, dp_group=dp_group)
        loss.backward()
        total += float(loss.detach())
        all_metrics.append(metrics)
        offset = 0
        for p, r in zip(lens, part["log_prob"]):
            grads.append(leaf.grad[offset + p - 1 : offset + p - 1 + len(r)].tolist())
            offset += p + len(r)
        start += size
    return total, grads, all_metrics


def metric_values(metrics: dict, prefix: str = "actor/stapo/") -> dict[str, float]:
    """The first value of each verl ``Metric`` under ``prefix`` (one micro-batch's own value)."""
    return {key: float(m.values[0]) for key, m in metrics.items() if key.startswith(prefix)}
