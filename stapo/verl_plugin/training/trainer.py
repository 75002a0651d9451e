"""The STAPO trainer: verl's synchronous v1 trainer, its actor worker folding the token mask first.

Data flow (one-way): rollout -> reward -> advantages (verl) -> old-policy log-probs and entropy
(verl, already computed) -> the actor update, whose worker (``actor_worker.STAPOActorWorker``) first
builds the token mask named by ``policy_loss.token_mask`` on its shard of the batch, with the
batch-wide threshold taken over every DP rank (``shard_mask``), and folds it into ``response_mask``
(the policy-gradient sum) and ``loss_mask`` (the token count) -> verl's update with the registered
loss. Folding into ``loss_mask`` is what makes the renormalisation exact: verl's FSDP engine counts
the mini-batch's tokens from ``loss_mask`` (DP all-reduced) before any micro-batch runs
(docs/algorithm.md section 3). After the update the trainer checks that verl's count equals the
count the folded mask left. The driver fetches the full-batch tensors only on the steps that write
diagnostics (``driver_diagnostics``).

Every algorithm of the recipe runs through this trainer and the same loss; they differ only in the
token mask and their config.
"""

from __future__ import annotations

import logging
import math

import ray
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass

from stapo.algorithm.masks import finalize_metrics, get_token_mask
from stapo.verl_plugin.cpu.rollout import announce_submissions
from stapo.verl_plugin.preflight.checkpoint_identity import begin_save, end_save
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from stapo.verl_plugin.training.actor_worker import STAPOActorWorker
from stapo.verl_plugin.training.diagnostic_outputs import GridAndSample, SpuriousTokenLog
from stapo.verl_plugin.training.driver_diagnostics import DriverDiagnostics
from stapo.verl_plugin.training.losses import (
    DEFINED_SUFFIX,
    IN_LOSS_PREFIX,
    LOSS_TOKENS_METRIC,
    METRIC_PREFIX,
    STAPOLossFn,
    mask_settings,
)
from stapo.verl_plugin.training.mini_batches import MiniBatchSplit
from stapo.verl_plugin.training.shard_mask import FOLDED_LOSS_TOKENS
from stapo.verl_plugin.training.val_bootstrap import install as install_vectorised_bootstrap
from stapo.verl_plugin.training.val_decodings import decoded_validation
from stapo.verl_plugin.training.weight_sync import DEFAULT_TIMEOUT_S, with_deadline

logger = logging.getLogger(__name__)

TRAINER_NAME = "stapo"
# the roles verl 0.9.1 maps to ActorRolloutRefWorker for the actor (the reference has a role of its own)
ACTOR_ROLES = (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef)


def in_loss_step_metrics(reduced: dict[str, float], updates_per_epoch: int) -> tuple[dict, dict]:
    """``source: current``: the loss's per-micro-batch SUM metrics as step totals and means.

    verl sums them over a mini-batch's micro-batches (each value already a DP-global total) and
    averages over mini-batches; times the mini-batches of one epoch gives the total of one pass over
    the batch. A threshold is the mean over the micro-batches where it was defined (NaN if none).
    """
    sums = {key[len(IN_LOSS_PREFIX) :]: value for key, value in reduced.items() if key.startswith(IN_LOSS_PREFIX)}
    counts, stats = {}, {}
    for name, value in sums.items():
        if name.endswith(DEFINED_SUFFIX):
            continue
        defined = sums.get(name + DEFINED_SUFFIX)
        if defined is None:
            counts[name] = value * updates_per_epoch
        else:
            stats[name] = value / defined if defined > 0 else math.nan
    return counts, stats


def step_token_count(mean_per_update: float, updates_per_epoch: int) -> int:
    """The tokens one pass over the batch divided by, from verl's ``loss_tokens`` metric.

    verl reports each mini-batch's DP-global count and averages them over the step's updates (every
    epoch counts the same tokens), so the mean times the mini-batches of one epoch is the total. That
    product is not exact in floating point (``(S / 7) * 7`` can be ``S - 1e-8``): the count is the
    nearest integer, exact for any count below 2^52.
    """
    return round(float(mean_per_update) * updates_per_epoch)


def check_step_token_counts(update_metrics: dict, updates_per_epoch: int, folded: bool, mask_name: str) -> None:
    """The step's token counts in ``update_metrics`` (verl's, made one step's; the folded mask's) agree, or the
    step fails. A folded mask's step must report both: a step reporting neither (no update ran, or the actor
    role was mapped to a worker that does not fold) would otherwise skip the check, not pass it."""
    loss_tokens = update_metrics.pop(LOSS_TOKENS_METRIC, None)
    expected = update_metrics.get(METRIC_PREFIX + FOLDED_LOSS_TOKENS)
    if folded and loss_tokens is None:
        raise RuntimeError(
            f"the actor update reported no {LOSS_TOKENS_METRIC}: no update ran this step, or the actor role was "
            f"mapped to a worker class that does not fold the {mask_name} mask"
        )
    if folded and expected is None:
        raise RuntimeError(
            f"the actor update reported no {FOLDED_LOSS_TOKENS}: the STAPO actor worker did not fold the "
            f"{mask_name} mask (was the actor role mapped to another worker class?)"
        )
    if loss_tokens is None:
        return
    loss_tokens = step_token_count(loss_tokens, updates_per_epoch)
    update_metrics[LOSS_TOKENS_METRIC] = float(loss_tokens)
    if expected is not None:
        check_token_count(loss_tokens, expected, mask_name)


def check_token_count(loss_tokens: int, folded: float, mask_name: str) -> None:
    """verl's token count must be the count the folded mask left: compared as integers."""
    if loss_tokens != round(float(folded)):
        raise RuntimeError(
            f"verl's actor divided by {loss_tokens} tokens but the folded {mask_name} mask left {float(folded):.0f}: "
            "the mask did not reach verl's token count (a verl change in how loss_mask is read?); the "
            "renormalisation would be wrong, so the run stops"
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
        self._settings = mask_settings(omega_conf_to_dataclass(self.config.actor_rollout_ref.actor))
        self._mask = get_token_mask(self._settings.token_mask)
        self._driver_diagnostics: DriverDiagnostics | None = None  # built in _setup, where verl loads the tokenizer
        install_vectorised_bootstrap()  # the validation metrics verl computes, the same values in less time

    def _init_resource_pool_mgr(self):
        """verl's roles and pools, with the actor's worker class swapped for the one that folds the mask
        (as verl's separate-async trainer swaps in its own)."""
        super()._init_resource_pool_mgr()
        for role in ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(STAPOActorWorker)

    def _setup(self):
        super()._setup()
        stapo_config = self.config.get("stapo", {})
        actor_ref = self.config.actor_rollout_ref
        self._driver_diagnostics = DriverDiagnostics(
            self._settings,
            self._mask,
            GridAndSample.from_config(stapo_config),
            SpuriousTokenLog.from_config(stapo_config),
            pad_token_id=self.tokenizer.pad_token_id,
            tokenizer=self.tokenizer,
            split=MiniBatchSplit.from_config(actor_ref.actor, actor_ref.rollout.n),
            # verl's own reading of the actor's DP size (the dispatch splits the batch into that many shards)
            dp_size=max(self.actor_rollout_wg._query_dispatch_info("actor")) + 1,
        )
        # verl's own ppo_loss, wrapped so an in-loss mask sees the entropy and DP group (see losses.py)
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(STAPOLossFn(actor_config))

    def fit(self, agent_loop_manager):
        """verl's loop; on the CPU back-end's HF server, each submission announced so it decodes as one batch."""
        if announce_submissions(agent_loop_manager, self.config):
            print("HF rollout: each submission of prompts decodes as one batch (stapo.hf_rollout_batch=submission)",
                  flush=True)
        return super().fit(agent_loop_manager)

    def on_init_end(self):
        """verl's first weight sync (after a checkpoint is loaded), from here on with a deadline."""
        timeout_s = self.config.get("stapo", {}).get("weight_sync_timeout_s", DEFAULT_TIMEOUT_S)
        with_deadline(self.checkpoint_manager, float(timeout_s))
        super().on_init_end()

    def _save_checkpoint(self):
        """verl's save, with the folder's record of the run that saved it (``stapo_run.json``): the step marked as
        being saved before verl writes, listed as this run's once verl's tracker names it, so that a kill at any
        point leaves a record that agrees with the checkpoint verl would resume."""
        begin_save(self.config, self.global_steps)
        super()._save_checkpoint()
        end_save(self.config, self.global_steps)

    def _compute_advantage(self, batch, metrics: dict):
        """verl's advantages, then the driver's round trip: reward extras and the due diagnostics."""
        batch = super()._compute_advantage(batch, metrics)
        metrics.update(self._driver_diagnostics.round_trip(self.global_steps, batch.keys, batch.partition_id).metrics)
        return batch

    def _update_actor(self, batch, metrics: dict):
        update_metrics: dict = {}
        batch = super()._update_actor(batch, update_metrics)
        actor = self.config.actor_rollout_ref
        updates_per_epoch = max(1, len(batch) // (actor.actor.ppo_mini_batch_size * actor.rollout.n))
        check_step_token_counts(update_metrics, updates_per_epoch, self._settings.folded, self._mask.name)
        update_metrics.update(self._driver_mask_check(update_metrics))
        if self._settings.in_loss:
            step = finalize_metrics(self._mask, *in_loss_step_metrics(update_metrics, updates_per_epoch))
            update_metrics = {k: v for k, v in update_metrics.items() if not k.startswith(IN_LOSS_PREFIX)}
            update_metrics.update({METRIC_PREFIX + key: value for key, value in step.items()})
        metrics.update(update_metrics)
        return batch

    def _driver_mask_check(self, update_metrics: dict) -> dict[str, float]:
        """On a step whose diagnostics rebuilt the mask on the driver, the tokens it silenced minus those the
        workers folded (``actor/stapo/driver_mask_diff``, 0 when they agree): the spurious-token log and the
        token sample describe the folded mask only if it is 0."""
        built = self._driver_diagnostics.last_dropped
        folded = update_metrics.get(METRIC_PREFIX + "num_dropped")
        if built is None or built[0] != self.global_steps or folded is None:
            return {}
        diff = built[1] - folded
        if diff:
            logger.warning("step %d: the driver's mask silences %d tokens, the workers folded %d: the diagnostics "
                           "of this step describe another mask", self.global_steps, built[1], folded)
        return {METRIC_PREFIX + "driver_mask_diff": diff}

    def _validate(self) -> dict[str, float]:
        """verl's validation, then one more pass for each setting of ``stapo.val_decodings`` (the paper's second
        decoding, T=0.7 / top-p=0.9), its metrics named after the setting (``val@T0.7/average/acc``)."""
        from stapo.eval.val_metrics import decoding_key

        metrics = super()._validate()
        for name in self.config.get("stapo", {}).get("val_decodings", None) or []:
            with decoded_validation(self, name):
                extra = super()._validate()
            metrics.update({decoding_key(key, name): value for key, value in extra.items()})
        return metrics

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, *args, **kwargs):
        """verl's validation metrics plus ``val/<benchmark>/acc`` and ``val/average/acc``; the reward's 0/1 flags
        get their means here instead of verl's bootstrap (stapo.eval.val_metrics.FLAG_KEYS)."""
        from stapo.eval.val_metrics import FLAG_KEYS, benchmark_val_metrics, flag_means

        infos = {key: values for key, values in reward_extra_infos_dict.items() if key not in FLAG_KEYS}
        metrics = super()._val_metrics_update(data_sources, sample_uids, infos, *args, **kwargs)
        metrics.update(flag_means(data_sources, sample_uids, reward_extra_infos_dict))
        metrics.update(benchmark_val_metrics(metrics))
        return metrics
