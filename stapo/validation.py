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
