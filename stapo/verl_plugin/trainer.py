"""The STAPO trainer: verl's synchronous v1 trainer plus one step, mask folding after advantages.

Data flow (one-way): rollout -> reward -> advantages (verl) -> old-policy log-probs and entropy
(verl, already computed) -> token mask over the whole batch (``stapo.s2t`` / ``stapo.loss``) ->
folded into ``response_mask`` and ``loss_mask`` -> verl's actor update. Folding into ``loss_mask``
is what makes the renormalisation exact: verl's FSDP engine counts the mini-batch's tokens from
``loss_mask`` (DP all-reduced) before any micro-batch runs.

Every algorithm of the recipe (stapo, justrl, grpo, entropy20) runs through this trainer, so the
comparison differs only in the mask.
"""

from __future__ import annotations

import logging

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.padding import response_to_nested

from stapo.loss import high_entropy_keep_mask
from stapo.s2t import detect_spurious, s2t_diagnostics
from stapo.verl_plugin.losses import MASK_FOLDED_KEY, METRIC_PREFIX, STAPOLossFn
from stapo.verl_plugin.run_checks import validate_run_config
from stapo.verl_plugin.run_log import SpuriousTokenLog, reward_extra_means

logger = logging.getLogger(__name__)

TRAINER_NAME = "stapo"
_FOLD_FIELDS = ["response_mask", "loss_mask", "entropy", "old_log_probs", "advantages"]


def fold_masks(
    response_mask: torch.Tensor, loss_mask: torch.Tensor, drop_response: torch.Tensor, drop_loss: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero the dropped positions, keeping each mask's dtype (padded (B, T) tensors)."""
    return (
        response_mask * (~drop_response).to(response_mask.dtype),
        loss_mask * (~drop_loss).to(loss_mask.dtype),
    )


@register_trainer(TRAINER_NAME)
class STAPOTrainer(PPOTrainerSync):
    """``trainer.v1.trainer_mode=stapo``, behaving as verl's ``sync`` trainer in every branch."""

    # verl 0.9.1's trainer_base branches on the literal mode name "sync" (replay buffer class,
    # gen_batch_size, TransferQueue snapshots in checkpoints and on resume, prompt data stored in
    # TransferQueue). Registered under another name, this trainer would take the async branches, so
    # the mode verl reads is pinned to "sync" and the name only selects the class.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, _registered_name: str) -> None:
        pass  # verl assigns config.trainer.v1.trainer_mode ("stapo") here; see the getter

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        validate_run_config(self.config)
        # typed, with the dataclass defaults for keys the yaml leaves out
        self._policy_loss = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor.policy_loss)
        self._loss_mode = self._policy_loss.loss_mode
        self._source = getattr(self._policy_loss, "source", "old")
        self._spurious_log = SpuriousTokenLog.from_config(self.config.get("stapo", {}))

    def _setup(self):
        super()._setup()
        # verl's own ppo_loss, wrapped so the registered loss sees entropy, DP group and the fold flag
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(STAPOLossFn(actor_config))

    @property
    def _folds_mask(self) -> bool:
        return self._loss_mode == "entropy20" or (self._loss_mode == "stapo" and self._source == "old")

    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics)
        metrics.update(self._reward_extra_metrics(batch))
        if not self._folds_mask:
            return batch
        log_tokens = self._spurious_log.wants(self.global_steps) and self._loss_mode == "stapo"
        fields = _FOLD_FIELDS + (["responses"] if log_tokens else [])
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        nested_response_mask = data["response_mask"]
        if not torch.equal(nested_response_mask.offsets(), data["loss_mask"].offsets()):
            raise RuntimeError(
                "STAPO expects response-only loss_mask and response_mask of equal lengths (verl 0.9.1 v1 "
                "agent loop); this verl version lays them out differently"
            )
        responses = data.pop("responses").to_padded_tensor(padding=self.tokenizer.pad_token_id) if log_tokens else None
        padded = data.to_padded_tensor()
        drop_response, drop_loss, fold_metrics = self._build_drop_mask(padded)
        if log_tokens:
            self._spurious_log.write(self.global_steps, responses, drop_response, padded, self.tokenizer)
        response_mask, loss_mask = fold_masks(padded["response_mask"], padded["loss_mask"], drop_response, drop_loss)
        fields = TensorDict(
            {
                "response_mask": response_to_nested(response_mask, nested_response_mask),
                "loss_mask": response_to_nested(loss_mask, nested_response_mask),
            },
            batch_size=len(batch),
        )
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        metrics.update({METRIC_PREFIX + key: value for key, value in fold_metrics.items()})
        return batch

    def _build_drop_mask(self, padded) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """(drop from response_mask, drop from loss_mask, metrics) over the whole batch."""
        policy_loss = self._policy_loss
        response_mask = padded["response_mask"].bool()
        entropy = padded["entropy"].float()
        if self._loss_mode == "stapo":
            tau_p = policy_loss.tau_p
            log_prob = padded["old_log_probs"].float()
            advantages = padded["advantages"].float()
            detection = detect_spurious(
                log_prob, entropy, advantages, response_mask, tau_p=tau_p, entropy_quantile=policy_loss.entropy_quantile
            )
            diagnostics = s2t_diagnostics(detection, log_prob, entropy, advantages, response_mask, tau_p)
            return detection.spurious, detection.spurious, diagnostics
        keep = high_entropy_keep_mask(entropy, response_mask, policy_loss.entropy_top_fraction)
        drop = response_mask & ~keep
        # the original 20-Entropy keeps the all-token denominator: leave loss_mask (the count) whole
        drop_loss = drop if policy_loss.entropy_denominator == "kept" else torch.zeros_like(drop)
        num_tokens = int(response_mask.sum())
        return drop, drop_loss, {"keep_ratio": float(keep.sum()) / num_tokens if num_tokens else 0.0}

    def _reward_extra_metrics(self, batch) -> dict[str, float]:
        """``reward/<key>/mean`` of the reward's numeric extra info (e.g. ``acc``) over the batch."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        return reward_extra_means(list(data["extra_fields"]))

    def _val_metrics_update(self, *args, **kwargs) -> dict[str, float]:
        """verl's validation metrics plus ``val/<benchmark>/acc`` and ``val/average/acc``."""
        from stapo.eval.val_metrics import benchmark_val_metrics

        metrics = super()._val_metrics_update(*args, **kwargs)
        metrics.update(benchmark_val_metrics(metrics))
        return metrics

    def _update_actor(self, batch, metrics: dict):
        batch.extra_info[MASK_FOLDED_KEY] = self._folds_mask
        return super()._update_actor(batch, metrics)
