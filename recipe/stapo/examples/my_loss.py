"""A whole policy loss from a file: registered with verl's registry, chosen with ``policy_loss.loss_mode``.

    stapo check stapo.import_files=[$PWD/recipe/stapo/examples/my_loss.py] \
      actor_rollout_ref.actor.policy_loss.loss_mode=my_ppo_clip

``stapo.import_files`` imports this file in the driver and in every Ray worker, so the name exists wherever
verl looks it up. The STAPO trainer folds the preset's token rule (S2T for algo=stapo, or a custom rule) into
``response_mask`` and verl's token count before the update, whatever the loss: aggregating over
``response_mask`` with verl's ``agg_loss`` and ``config.global_batch_info`` keeps the silenced tokens out of the
sum and the count. (A weighting rule, TACO's, is applied only by the project's ``masked_clip``.)

This one is PPO's symmetric clip without verl's dual clip: the objective a reader knows, as a template.
"""

from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss


@register_policy_loss("my_ppo_clip")
def my_ppo_clip(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                rollout_is_weights=None) -> tuple[torch.Tensor, dict[str, Any]]:
    """-min(rho A, clip(rho, 1 - eps, 1 + eps) A) per token, eps = actor.clip_ratio; verl's aggregation."""
    eps = config.clip_ratio
    mask = response_mask.bool()
    log_ratio = torch.where(mask, log_prob - old_log_prob, torch.zeros_like(log_prob)).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    advantages = torch.where(mask, advantages, torch.zeros_like(advantages))
    unclipped, clipped = -advantages * ratio, -advantages * ratio.clamp(1.0 - eps, 1.0 + eps)
    losses = torch.maximum(unclipped, clipped)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    loss = agg_loss(loss_mat=losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    tokens = mask.sum().clamp(min=1)
    metrics = {
        "actor/pg_clipfrac": float(((clipped > unclipped) & mask).sum() / tokens),
        "actor/ppo_kl": float((-log_ratio * mask).sum() / tokens),
    }
    return loss, metrics
