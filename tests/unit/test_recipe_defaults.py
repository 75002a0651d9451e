"""The diagnostics' and the weight-sync deadline's defaults are written once, in the code that reads them;
the recipe's yaml spells them out for the reader and may not drift from them (as
tests/unit/test_mask_defaults.py for the masks)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from stapo.verl_plugin.training.diagnostic_outputs import GridAndSample, SpuriousTokenLog
from stapo.verl_plugin.training.weight_sync import DEFAULT_TIMEOUT_S

RECIPE = Path(__file__).resolve().parents[2] / "conf" / "stapo_trainer.yaml"


def test_recipe_yaml_spells_out_the_diagnostics_defaults():
    stapo = OmegaConf.load(RECIPE).stapo
    assert dict(stapo.spurious_log) == {
        "every": SpuriousTokenLog.every,
        "max_tokens": SpuriousTokenLog.max_tokens,
        "context": SpuriousTokenLog.context,
    }
    assert stapo.ablation.every == GridAndSample.ablation_every
    assert tuple(stapo.ablation.tau_p) == GridAndSample.tau_ps
    assert tuple(stapo.ablation.q) == GridAndSample.qs
    assert (stapo.token_sample.every, stapo.token_sample.size) == (GridAndSample.sample_every,
                                                                   GridAndSample.sample_size)
    assert stapo.weight_sync_timeout_s == DEFAULT_TIMEOUT_S


def test_absent_keys_take_the_same_defaults_as_the_yaml(tmp_path):
    from_yaml = OmegaConf.load(RECIPE).stapo
    from_yaml.run_dir = str(tmp_path)
    assert SpuriousTokenLog.from_config({"run_dir": str(tmp_path)}) == SpuriousTokenLog.from_config(from_yaml)
    assert GridAndSample.from_config({"run_dir": str(tmp_path)}) == GridAndSample.from_config(from_yaml)
