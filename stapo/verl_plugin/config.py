"""The typed ``policy_loss`` section for STAPO, selected in Hydra by ``_target_``.

Pointing ``actor_rollout_ref.actor.policy_loss._target_`` at this class does two things verl
cannot do otherwise: it types the extra fields (plain extra keys are rejected by verl's config
instantiation), and it makes every process that builds the actor config import this package.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.workers.config import PolicyLossConfig

from stapo.validation import validate_policy_loss

TARGET = f"{__name__}.STAPOPolicyLossConfig"


@dataclass
class STAPOPolicyLossConfig(PolicyLossConfig):
    """verl's PolicyLossConfig plus the S2T and 20-Entropy settings (spec sections 2 and 5).

    Args:
        tau_p: probability threshold of a candidate (strict ``p < tau_p``), in (0, 1).
        entropy_quantile: q of the adaptive entropy threshold tau_h, in (0, 1].
        source: ``old`` (mask from the old-policy pass, folded into the loss mask on the driver)
            or ``current`` (mask from the update forward inside the loss, paper-literal).
        entropy_top_fraction: share of highest-entropy tokens the 20-Entropy baseline keeps.
        entropy_denominator: 20-Entropy's denominator: ``all`` response tokens (the original) or
            the ``kept`` ones.
    """

    tau_p: float = 0.002
    entropy_quantile: float = 0.75
    source: str = "old"
    entropy_top_fraction: float = 0.2
    entropy_denominator: str = "all"

    def __post_init__(self):
        validate_policy_loss(
            {
                "tau_p": self.tau_p,
                "entropy_quantile": self.entropy_quantile,
                "source": self.source,
                "entropy_top_fraction": self.entropy_top_fraction,
                "entropy_denominator": self.entropy_denominator,
            },
            prefix="actor_rollout_ref.actor.policy_loss.",
        )
