"""Checks of a whole composed run config, run on the driver before Ray or any worker starts.

A bad setting found here costs a second; found inside a worker it costs a cluster start-up and
possibly hours of GPU time. Every message names the key and the allowed values.
"""

from __future__ import annotations

from stapo.validation import STAPOConfigError, validate_actor
from stapo.verl_plugin.config import TARGET


def validate_run_config(config) -> None:
    """Checks of a whole run config that must fail before any worker starts."""
    actor = config.actor_rollout_ref.actor
    validate_actor(actor)
    loss_mode = actor.policy_loss.get("loss_mode", "vanilla")
    target = actor.policy_loss.get("_target_", None)
    if loss_mode in ("stapo", "entropy20") and target != TARGET:
        raise STAPOConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} needs "
            f"actor_rollout_ref.actor.policy_loss._target_={TARGET} (got {target}): it types tau_p, "
            "entropy_quantile, source, ... and makes every worker import the plugin; algo=stapo sets it"
        )
    needs_old_pass = loss_mode == "entropy20" or (
        loss_mode == "stapo" and actor.policy_loss.get("source", "old") == "old"
    )
    rollout_correction = config.algorithm.get("rollout_correction", None) or {}
    if needs_old_pass and rollout_correction.get("bypass_mode", False):
        raise STAPOConfigError(
            "algorithm.rollout_correction.bypass_mode=true skips the old-policy pass whose entropy "
            f"policy_loss.loss_mode={loss_mode} (source=old) needs; turn bypass_mode off or use source=current"
        )
