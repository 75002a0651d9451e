"""Every bench preset (conf/algo/*.yaml beyond the lead's four) composes for every model preset and
carries its paper's values.

One table: for each preset, the keys its paper fixes and the value the paper (or, where the yaml
header says so, the authors' script) uses. A preset that loses a value, or whose base (stapo.yaml)
changes one underneath it, fails here. Fast: Hydra composition only, no Ray, no model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from recipe.stapo.main_stapo import CONF_DIR
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from tests.e2e.test_compose import compose_recipe, resolved_recipe

A = "actor_rollout_ref.actor."
PL = A + "policy_loss."
NO_KL = {A + "use_kl_loss": False}

# preset -> {dotted key: the paper's value}
PAPER_VALUES: dict[str, dict[str, object]] = {
    "drgrpo": {
        PL + "loss_mode": "masked_clip",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "seq-mean-token-sum-norm",
        "algorithm.norm_adv_by_std_in_grpo": False,
        A + "clip_ratio_low": 0.2,
        A + "clip_ratio_high": 0.2,
        A + "clip_ratio_c": 1e4,
        **NO_KL,
    },
    "dapo": {
        PL + "loss_mode": "masked_clip",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "token-mean",
        A + "clip_ratio_low": 0.2,
        A + "clip_ratio_high": 0.28,
        A + "clip_ratio_c": 1e4,
        **NO_KL,
        "algorithm.norm_adv_by_std_in_grpo": True,
    },
    "gspo": {
        PL + "loss_mode": "gspo",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "seq-mean-token-mean",
        A + "clip_ratio_low": 3e-4,
        A + "clip_ratio_high": 4e-4,
        **NO_KL,
    },
    "gmpo": {
        PL + "loss_mode": "gmpo",
        PL + "token_mask": "none",
        A + "clip_ratio_low": 0.4,
        A + "clip_ratio_high": 0.4,
        **NO_KL,
    },
    "sapo": {
        PL + "loss_mode": "sapo",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "seq-mean-token-mean",
        A + "tau_pos": 1.0,
        A + "tau_neg": 1.05,
        **NO_KL,
    },
    "cispo": {
        PL + "loss_mode": "cispo",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "token-mean",
        A + "clip_ratio_low": 10.0,
        A + "clip_ratio_high": 0.2,
        **NO_KL,
    },
    "clip_cov": {
        PL + "loss_mode": "clip_cov",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "token-mean",
        PL + "clip_cov_ratio": 2e-4,
        PL + "clip_cov_lb": 1.0,
        PL + "clip_cov_ub": 5.0,
        A + "clip_ratio_low": 1.0,
        A + "clip_ratio_high": 1.0,
        A + "clip_ratio_c": 10.0,
        **NO_KL,
    },
    "kl_cov": {
        PL + "loss_mode": "kl_cov",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "token-mean",
        PL + "kl_cov_ratio": 2e-3,
        PL + "ppo_kl_coef": 1.0,
        A + "clip_ratio_low": 0.2,
        A + "clip_ratio_high": 0.2,
        **NO_KL,
    },
    "dppo_tv": {
        PL + "loss_mode": "dppo_tv",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "seq-mean-token-sum-norm",
        "algorithm.norm_adv_by_std_in_grpo": False,
        A + "clip_ratio_low": 0.15,
        A + "clip_ratio_high": 0.15,
        A + "clip_ratio_c": 1e4,
        **NO_KL,
    },
    "dppo_kl": {
        PL + "loss_mode": "dppo_kl",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "seq-mean-token-sum-norm",
        "algorithm.norm_adv_by_std_in_grpo": False,
        A + "clip_ratio_low": 0.05,
        A + "clip_ratio_high": 0.05,
        A + "clip_ratio_c": 1e4,
        **NO_KL,
    },
    "taco": {
        PL + "loss_mode": "masked_clip",
        PL + "token_mask": "taco",
        PL + "taco_alpha": 0.01,
        PL + "taco_lambda": 0.9,
        A + "loss_agg_mode": "token-mean",
        **NO_KL,
    },
    "advrew": {
        PL + "loss_mode": "masked_clip",
        PL + "token_mask": "advrew",
        PL + "advrew_alpha": 0.3,
        A + "loss_agg_mode": "token-mean",
        **NO_KL,
    },
    "lopti": {
        PL + "loss_mode": "masked_clip",
        PL + "token_mask": "none",
        PL + "lopti": True,
        PL + "lopti_eta": 0.5,
        A + "loss_agg_mode": "token-mean",
        **NO_KL,
    },
    "stare": {
        PL + "loss_mode": "masked_clip",
        PL + "token_mask": "stare",
        PL + "threshold_scope": "step",
        PL + "stare_variant": "O1",
        PL + "stare_top_ratio": 0.1,
        PL + "stare_w": 1.1,
        PL + "stare_m": 0.9,
        PL + "stare_target_entropy": 0.3,
        A + "loss_agg_mode": "token-mean",
        A + "clip_ratio_low": 0.2,
        A + "clip_ratio_high": 0.28,
        A + "clip_ratio_c": 10.0,
        **NO_KL,
    },
    "steer": {
        PL + "loss_mode": "masked_clip",
        PL + "token_mask": "steer",
        PL + "steer_lambda_min": 0.8,
        A + "loss_agg_mode": "token-mean",
        A + "clip_ratio_low": 0.2,
        A + "clip_ratio_high": 0.28,
        A + "clip_ratio_c": 10.0,
        **NO_KL,
    },
    "dcpo": {
        PL + "loss_mode": "dcpo",
        PL + "token_mask": "none",
        A + "loss_agg_mode": "token-mean",
        A + "clip_ratio_low": 0.2,
        A + "clip_ratio_high": 0.28,
        A + "clip_ratio_c": 10.0,
        "algorithm.norm_adv_by_std_in_grpo": True,
        **NO_KL,
    },
}
BENCH_ALGOS = sorted(PAPER_VALUES)
LEAD_ALGOS = {"stapo", "grpo", "justrl", "entropy20"}


def test_the_table_covers_every_algo_preset():
    """A new conf/algo/*.yaml without a row of paper values fails the suite."""
    on_disk = {path.stem for path in Path(CONF_DIR, "algo").glob("*.yaml")}
    assert on_disk - LEAD_ALGOS == set(BENCH_ALGOS)


@pytest.mark.parametrize("algo", BENCH_ALGOS)
def test_every_preset_names_its_paper(algo):
    head = Path(CONF_DIR, "algo", f"{algo}.yaml").read_text(encoding="utf-8").split("defaults:")[0]
    header = " ".join(line.lstrip("# ") for line in head.splitlines())
    assert re.search(r'\("[^"]+", arXiv \d{4}\.\d{5}\)', header), f"{algo}.yaml: name the paper (title, arXiv id)"
    for key in PAPER_VALUES[algo]:  # every value the table pins is explained in the header
        leaf = key.rsplit(".", 1)[1]
        if leaf not in {"loss_mode", "token_mask", "use_kl_loss", "loss_agg_mode"}:
            assert leaf in header or (leaf.startswith("clip_ratio_") and "clip" in header), (algo, leaf)


# every bench algorithm on the paper's GPU layouts and on the CPU preset the tests train; the other CPU presets
# (smollm2, testbed, tailbed) only change the model and its sizes, composed with the lead algorithms in
# tests/e2e/test_compose.py
ALGO_PRESETS = ("tiny", "qwen3_1p7b", "qwen3_8b", "qwen3_14b")


@pytest.mark.parametrize("preset", ALGO_PRESETS)
@pytest.mark.parametrize("algo", BENCH_ALGOS)
def test_preset_composes_validates_and_carries_its_papers_values(preset, algo):
    cfg = compose_recipe(f"model_preset={preset}", f"algo={algo}")
    for key, expected in PAPER_VALUES[algo].items():
        got = OmegaConf.select(cfg, key)
        assert got == pytest.approx(expected) if isinstance(expected, float) else got == expected, (key, got)
    assert cfg.trainer.v1.trainer_mode == "stapo"  # one trainer for every algorithm
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode in POLICY_LOSS_REGISTRY
    assert cfg.actor_rollout_ref.actor.entropy_coeff == 0.0
    typed = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert typed.policy_loss.loss_mode == PAPER_VALUES[algo][PL + "loss_mode"]
    # verl's driver-side checks (batch divisibility, token limits, KL settings) on the resolved config
    resolved = resolved_recipe(f"model_preset={preset}", f"algo={algo}")
    validate_config(
        config=resolved, use_reference_policy=need_reference_policy(resolved), use_critic=need_critic(resolved)
    )
    assert need_critic(resolved) is False
    if algo in ("drgrpo", "dppo_tv", "dppo_kl"):  # a constant divisor (the generation budget), not the batch's width
        assert OmegaConf.select(resolved, A + "loss_scale_factor") == cfg.data.max_response_length
    # the project's own driver-side checks
    validate_run_config(cfg)
