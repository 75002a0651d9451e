"""The GPU presets run verl's own agent loop by default; seeding is the CPU presets' default and an opt-in elsewhere.

On a GPU the seeded loop buys "close, not bit for bit" (docs/reproducibility.md) for rollout time not measured here;
the CPU presets keep their bit-for-bit runs. Real Hydra composition of the recipe (``stapo.check.compose_run``) and
the driver's own pinning (``pin_reproducibility``).
"""

from __future__ import annotations

import pytest

from stapo.algorithm.validation import STAPOConfigError
from stapo.check import compose_run
from stapo.preset_fit import gpu_presets
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME, pin_reproducibility

CPU_PRESETS = ("tiny", "testbed", "tailbed", "smollm2")
AGENT = "actor_rollout_ref.rollout.agent.default_agent_loop"


def test_every_gpu_preset_keeps_verl_s_agent_loop_and_every_cpu_preset_seeds():
    assert {"qwen3_0p6b_smoke", "qwen3_1p7b", "qwen3_8b", "qwen3_14b"} <= set(gpu_presets())
    for preset in gpu_presets():
        config = compose_run([f"model_preset={preset}"])
        assert config.stapo.seeded_rollouts is False, preset
        assert pin_reproducibility(config) == [], preset
        assert config.actor_rollout_ref.rollout.agent.default_agent_loop in (None, "single_turn_agent"), preset
    for preset in CPU_PRESETS:
        config = compose_run([f"model_preset={preset}"])
        assert config.stapo.seeded_rollouts is True, preset
        assert len(pin_reproducibility(config)) == 2, preset
        assert config.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_LOOP_NAME, preset


def test_a_gpu_run_opts_in():
    config = compose_run(["model_preset=qwen3_8b", "stapo.seeded_rollouts=true"])
    assert len(pin_reproducibility(config)) == 2
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_LOOP_NAME


def test_validation_at_a_further_decoding_needs_the_seeded_loop_on_a_gpu_preset():
    """The seeded loop sets each validation request's decoding; verl's own would validate at the first decoding
    twice, under the second one's name. Refused before Ray; either switch accepts it."""
    with pytest.raises(STAPOConfigError, match=r"^stapo.val_decodings needs the stapo_seeded agent loop, which "
                                               r"stapo.seeded_rollouts=false"):
        validate_run_config(compose_run(["model_preset=qwen3_8b", "stapo.val_decodings=[T0.7]"]))
    validate_run_config(compose_run(["model_preset=qwen3_8b", "stapo.val_decodings=[T0.7]",
                                     "stapo.seeded_rollouts=true"]))
    validate_run_config(compose_run(["model_preset=qwen3_8b", "stapo.val_decodings=[T0.7]",
                                     f"{AGENT}={AGENT_LOOP_NAME}"]))
