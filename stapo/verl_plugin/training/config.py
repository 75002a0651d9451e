"""The typed ``policy_loss`` section, selected in Hydra by ``_target_``.

Pointing ``actor_rollout_ref.actor.policy_loss._target_`` at this class does two things verl
cannot do otherwise: it types the extra fields (plain extra keys are rejected by verl's config
instantiation), and it makes every process that builds the actor config import this package
(so the ``masked_clip`` loss is registered in the workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.workers.config import PolicyLossConfig

from stapo.algorithm.masks import MaskSettings

TARGET = f"{__name__}.STAPOPolicyLossConfig"
PREFIX = "actor_rollout_ref.actor.policy_loss."
_DEFAULTS = MaskSettings()


@dataclass
class STAPOPolicyLossConfig(PolicyLossConfig):
    """verl's PolicyLossConfig plus the token-mask settings; defaults and meanings:
    ``stapo.algorithm.masks.MaskSettings``."""

    token_mask: str = _DEFAULTS.token_mask
    source: str = _DEFAULTS.source
    tau_p: float = _DEFAULTS.tau_p
    entropy_quantile: float = _DEFAULTS.entropy_quantile
    entropy_top_fraction: float = _DEFAULTS.entropy_top_fraction
    entropy_denominator: str = _DEFAULTS.entropy_denominator
    threshold_scope: str = _DEFAULTS.threshold_scope
    taco_alpha: float = _DEFAULTS.taco_alpha
    taco_lambda: float = _DEFAULTS.taco_lambda
    advrew_alpha: float = _DEFAULTS.advrew_alpha
    lopti: bool = _DEFAULTS.lopti
    lopti_eta: float = _DEFAULTS.lopti_eta
    stare_variant: str = _DEFAULTS.stare_variant
    stare_top_ratio: float = _DEFAULTS.stare_top_ratio
    stare_w: float = _DEFAULTS.stare_w
    stare_m: float = _DEFAULTS.stare_m
    stare_target_entropy: float = _DEFAULTS.stare_target_entropy
    steer_lambda_min: float = _DEFAULTS.steer_lambda_min

    def __post_init__(self):
        MaskSettings.from_mapping(self).validate(prefix=PREFIX)
