"""The mask settings' defaults are written once (``MaskSettings``); the paper's preset and verl's typed
config may not drift from them.

conf/algo/stapo.yaml is the paper's recipe and spells its values out for the reader; where a key
there means the same thing as a ``MaskSettings`` default, the two must be equal. ``token_mask`` and
``threshold_scope`` differ on purpose: the default is no mask (a plain verl run) with thresholds over the
step's batch, the preset turns S2T on with the paper's scope, each PPO mini-batch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from stapo.algorithm.masks import TOKEN_MASK_REGISTRY, MaskSettings
from stapo.verl_plugin.training.config import STAPOPolicyLossConfig

ALGO_DIR = Path(__file__).resolve().parents[2] / "conf" / "algo"
SAME_MEANING = ("source", "tau_p", "entropy_quantile", "entropy_top_fraction", "entropy_denominator", "taco_alpha",
                "taco_lambda", "advrew_alpha", "lopti", "lopti_eta")
DIFFERS = ("token_mask", "threshold_scope")


def preset_policy_loss(name: str):
    return OmegaConf.load(ALGO_DIR / f"{name}.yaml").actor_rollout_ref.actor.policy_loss


def test_paper_preset_spells_out_the_defaults():
    policy_loss, defaults = preset_policy_loss("stapo"), MaskSettings()
    assert set(SAME_MEANING) | set(DIFFERS) <= {f.name for f in dataclasses.fields(MaskSettings)}
    for key in SAME_MEANING:
        assert key in policy_loss, f"conf/algo/stapo.yaml does not spell out policy_loss.{key}"
        assert policy_loss[key] == getattr(defaults, key), key
    assert policy_loss.token_mask == "stapo" and defaults.token_mask == "none"
    assert policy_loss.threshold_scope == "mini_batch" and defaults.threshold_scope == "step"


def test_typed_verl_config_has_every_setting_with_the_same_default():
    typed = {f.name: f.default for f in dataclasses.fields(STAPOPolicyLossConfig)}
    for field in dataclasses.fields(MaskSettings):
        assert field.name in typed, f"STAPOPolicyLossConfig lacks {field.name}: Hydra would refuse the key"
        assert typed[field.name] == field.default, field.name
    assert MaskSettings.from_mapping(STAPOPolicyLossConfig()) == MaskSettings()


@pytest.mark.parametrize("path", sorted(ALGO_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_preset_names_a_registered_mask(path):
    policy_loss = OmegaConf.load(path).actor_rollout_ref.actor.policy_loss
    if path.stem == "stapo":  # the base every other preset starts from
        assert policy_loss.loss_mode == "masked_clip"
    assert policy_loss.get("token_mask", "none") in TOKEN_MASK_REGISTRY


def test_entropy20_preset_is_the_original_20_entropy_and_the_defaults():
    """The 20-Entropy paper's recipe (top 20%, all-token denominator) is also what the defaults mean."""
    policy_loss, defaults = preset_policy_loss("entropy20"), MaskSettings()
    assert policy_loss.token_mask == "entropy20"
    assert (policy_loss.entropy_top_fraction, policy_loss.entropy_denominator) == (0.2, "all")
    assert (defaults.entropy_top_fraction, defaults.entropy_denominator) == (0.2, "all")
