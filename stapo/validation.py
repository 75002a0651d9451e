"""Checks of STAPO settings, with errors that name the setting and its allowed range.

Pure Python, so the same checks run in the core functions, in the verl config dataclass and on the
driver before any worker (and any GPU time) starts. ``prefix`` lets the caller name the full
Hydra key, e.g. ``actor_rollout_ref.actor.policy_loss.tau_p``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

SOURCES = ("old", "current")
ENTROPY_DENOMINATORS = ("all", "kept")
# loss_mode values this project adds to verl's registry
MASKING_LOSS_MODES = ("stapo", "entropy20")
# verl's aggregation modes; with source=current only token-mean can be renormalised exactly enough
TOKEN_MEAN = "token-mean"


class STAPOConfigError(ValueError):
    """A STAPO setting is out of range or contradicts another setting."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_tau_p(value: Any, prefix: str = "") -> None:
    if not _is_number(value) or not 0.0 < value < 1.0:
        raise STAPOConfigError(f"{prefix}tau_p must be a probability in (0, 1) (paper: 0.002), got {value!r}")


def check_entropy_quantile(value: Any, prefix: str = "") -> None:
    if not _is_number(value) or not 0.0 < value <= 1.0:
        raise STAPOConfigError(f"{prefix}entropy_quantile must be in (0, 1] (paper: 0.75), got {value!r}")


def check_top_fraction(value: Any, prefix: str = "") -> None:
    if not _is_number(value) or not 0.0 < value <= 1.0:
        raise STAPOConfigError(
            f"{prefix}entropy_top_fraction must be in (0, 1] (20-Entropy baseline: 0.2), got {value!r}"
        )


def check_choice(name: str, value: Any, allowed: tuple[str, ...], prefix: str = "") -> None:
    if value not in allowed:
        raise STAPOConfigError(f"{prefix}{name} must be one of {list(allowed)}, got {value!r}")


def validate_policy_loss(policy_loss: Mapping[str, Any], prefix: str = "") -> None:
    """Range checks of the fields STAPO adds to verl's ``policy_loss`` section."""
    check_tau_p(policy_loss.get("tau_p", 0.002), prefix)
    check_entropy_quantile(policy_loss.get("entropy_quantile", 0.75), prefix)
    check_choice("source", policy_loss.get("source", "old"), SOURCES, prefix)
    check_top_fraction(policy_loss.get("entropy_top_fraction", 0.2), prefix)
    check_choice("entropy_denominator", policy_loss.get("entropy_denominator", "all"), ENTROPY_DENOMINATORS, prefix)


def validate_actor(actor: Mapping[str, Any], prefix: str = "actor_rollout_ref.actor.") -> None:
    """Cross-setting checks of an actor section (``actor_rollout_ref.actor``) that uses STAPO.

    - ``source: current`` needs the current policy's entropy in the update forward, which verl
      computes only with ``calculate_entropy: true`` (or a non-zero entropy bonus).
    - ``source: current`` renormalises each micro-batch by its DP-global valid fraction, which is
      defined for token-mean only. ``source: old`` folds the mask into the loss mask upstream, so
      every verl aggregation mode then counts valid tokens only.
    """
    policy_loss = actor.get("policy_loss", {}) or {}
    loss_mode = policy_loss.get("loss_mode", "vanilla")
    if loss_mode not in MASKING_LOSS_MODES:
        return
    prefix_pl = f"{prefix}policy_loss."
    validate_policy_loss(policy_loss, prefix_pl)
    if loss_mode == "stapo" and policy_loss.get("source", "old") == "current":
        entropy_on = bool(actor.get("calculate_entropy", False)) or float(actor.get("entropy_coeff", 0.0)) != 0.0
        if not entropy_on:
            raise STAPOConfigError(
                f"{prefix_pl}source=current detects spurious tokens from the update forward's entropy; "
                f"set {prefix}calculate_entropy=true (or use source=old, the default, which reuses the "
                "old-policy pass and costs nothing extra)"
            )
        agg = actor.get("loss_agg_mode", TOKEN_MEAN)
        if agg != TOKEN_MEAN:
            raise STAPOConfigError(
                f"{prefix}loss_agg_mode={agg!r} is not supported with {prefix_pl}source=current: the "
                "renormalisation over valid tokens is defined for token-mean only; use token-mean, or "
                "source=old, which works with every aggregation mode"
            )
    if loss_mode == "entropy20" and policy_loss.get("source", "old") != "old":
        raise STAPOConfigError(
            f"{prefix_pl}loss_mode=entropy20 builds its mask from the old-policy pass; source must be 'old'"
        )


# --- clip ratios and batch sizes (spec section 3 / 5) -------------------------------------------
# A wrong value here is not caught by verl before the workers start: the dual-clip constant is
# asserted inside the loss, and the mini/micro-batch divisibility inside each worker's update, i.e.
# after a cluster start-up and a whole rollout.

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def check_clip_ratios(actor: Mapping[str, Any], prefix: str = "actor_rollout_ref.actor.") -> None:
    """``clip_ratio``/``clip_ratio_low`` in [0, 1) (1 - eps must stay a positive ratio), ``clip_ratio_high``
    >= 0, ``clip_ratio_c`` > 1 (verl's dual clip), all finite; ``None`` low/high fall back to clip_ratio."""
    for name in ("clip_ratio", "clip_ratio_low"):
        value = actor.get(name, None)
        if value is not None and (not _is_number(value) or not 0.0 <= value < 1.0):
            raise STAPOConfigError(f"{prefix}{name} must be in [0, 1) (paper: 0.2), got {value!r}")
    value = actor.get("clip_ratio_high", None)
    if value is not None and (not _is_number(value) or value < 0.0):
        raise STAPOConfigError(f"{prefix}clip_ratio_high must be a finite number >= 0 (paper: 0.28), got {value!r}")
    value = actor.get("clip_ratio_c", 3.0)
    if not _is_number(value) or value <= 1.0:
        raise STAPOConfigError(
            f"{prefix}clip_ratio_c must be a finite number > 1 (dual clip, paper: 10), got {value!r}"
        )
    check_choice("loss_agg_mode", actor.get("loss_agg_mode", TOKEN_MEAN), LOSS_AGG_MODES, prefix)


def check_positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise STAPOConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def check_batch_sizes(
    train_batch_size: int,
    rollout_n: int,
    mini_batch_size: int,
    world_size: int,
    sp_size: int = 1,
    micro_batch_size: int | None = None,
    log_prob_micro_batch_sizes: Mapping[str, int | None] | None = None,
) -> None:
    """The divisibility verl's workers assert mid-step, checked up front (sizes in prompts, as in verl).

    One step holds ``train_batch_size * rollout_n`` responses, split evenly over the ``world_size /
    sp_size`` data-parallel ranks; each PPO mini-batch holds ``mini_batch_size * rollout_n``.
    ``micro_batch_size`` (the update) and ``log_prob_micro_batch_sizes`` (key -> size, the log-prob
    passes) are per GPU, ``None`` when dynamic batching replaces them.
    """
    tb, mini = "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"
    world = "trainer.nnodes * trainer.n_gpus_per_node"
    if world_size % sp_size:
        raise STAPOConfigError(
            f"{world} ({world_size}) must be a multiple of actor_rollout_ref.actor.ulysses_sequence_parallel_size "
            f"({sp_size})"
        )
    dp = world_size // sp_size
    if mini_batch_size > train_batch_size or train_batch_size % mini_batch_size:
        raise STAPOConfigError(
            f"{tb} ({train_batch_size}) must be a multiple of {mini} ({mini_batch_size}): otherwise verl pads the "
            "last PPO mini-batch with empty synthetic samples"
        )
    responses, mini_responses = train_batch_size * rollout_n, mini_batch_size * rollout_n
    if mini_responses % dp:
        raise STAPOConfigError(
            f"{mini} * actor_rollout_ref.rollout.n ({mini_batch_size} * {rollout_n} = {mini_responses} responses) "
            f"must be divisible by the data-parallel size {world} / ulysses_sequence_parallel_size ({dp})"
        )
    if micro_batch_size is not None and (mini_responses // dp) % micro_batch_size:
        raise STAPOConfigError(
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu ({micro_batch_size}) must divide the responses "
            f"of one mini-batch on one rank ({mini} * rollout.n / data-parallel size = {mini_responses // dp})"
        )
    for key, micro in (log_prob_micro_batch_sizes or {}).items():
        if micro is not None and (responses // dp) % micro:
            raise STAPOConfigError(
                f"{key} ({micro}) must divide the responses of one step on one rank "
                f"({tb} * rollout.n / data-parallel size = {responses // dp})"
            )
