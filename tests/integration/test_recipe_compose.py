"""Every model preset x algorithm composes through Hydra, types through verl, and carries the spec's values."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass

from recipe.stapo.main_stapo import CONF_DIR
from stapo.verl_plugin.config import STAPOPolicyLossConfig
from stapo.verl_plugin.trainer import validate_run_config

PRESETS = ["tiny", "smollm2", "qwen3_1p7b", "qwen3_8b", "qwen3_14b"]
ALGOS = ["stapo", "justrl", "grpo", "entropy20"]
LOSS_MODE = {"stapo": "stapo", "justrl": "vanilla", "grpo": "vanilla", "entropy20": "entropy20"}


def compose_recipe(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="stapo_trainer", overrides=list(overrides))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("algo", ALGOS)
def test_every_preset_and_algo_composes_and_validates(preset, algo):
    cfg = compose_recipe(f"model_preset={preset}", f"algo={algo}")
    actor = cfg.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == LOSS_MODE[algo]
    assert cfg.trainer.v1.trainer_mode == "stapo"  # one trainer for every algorithm
    validate_run_config(cfg)
    typed = omega_conf_to_dataclass(actor)
    assert isinstance(typed.policy_loss, STAPOPolicyLossConfig)


@pytest.mark.parametrize("preset", ["qwen3_1p7b", "qwen3_8b", "qwen3_14b"])
def test_qwen3_presets_hold_the_paper_recipe(preset):
    cfg = compose_recipe(f"model_preset={preset}", "algo=stapo")
    actor, rollout, data = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.data
    assert cfg.actor_rollout_ref.model.path == {
        "qwen3_1p7b": "Qwen/Qwen3-1.7B-Base",
        "qwen3_8b": "Qwen/Qwen3-8B-Base",
        "qwen3_14b": "Qwen/Qwen3-14B-Base",
    }[preset]
    assert actor.optim.lr == 1e-6 and actor.optim.lr_warmup_steps == 10
    assert actor.optim.lr_scheduler_type == "constant" and actor.optim.weight_decay == 0.1
    assert actor.optim.clip_grad == 1.0
    assert (data.train_batch_size, rollout.n, actor.ppo_mini_batch_size) == (256, 8, 64)
    assert (data.max_prompt_length, data.max_response_length) == (1024, 15360)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert actor.use_kl_loss is False and actor.entropy_coeff == 0.0 and actor.loss_agg_mode == "token-mean"
    assert (rollout.temperature, rollout.top_p, rollout.name) == (1.0, 1.0, "vllm")
    assert (actor.policy_loss.tau_p, actor.policy_loss.entropy_quantile, actor.policy_loss.source) == (0.002, 0.75, "old")
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (8, 8)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.use_kl_in_reward is False
    assert cfg.trainer.test_freq == 20


def test_grpo_baseline_is_symmetric_with_kl():
    actor = compose_recipe("model_preset=qwen3_8b", "algo=grpo").actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.2)
    assert actor.use_kl_loss is True and actor.kl_loss_coef > 0


def test_cli_overrides_reach_the_config():
    cfg = compose_recipe("algo=stapo", "actor_rollout_ref.actor.policy_loss.tau_p=0.001", "trainer.nnodes=4")
    assert cfg.actor_rollout_ref.actor.policy_loss.tau_p == 0.001 and cfg.trainer.nnodes == 4


def test_cfg_job_prints_the_composed_config():
    out = subprocess.run(
        [sys.executable, "-m", "recipe.stapo.main_stapo", "model_preset=qwen3_14b", "algo=entropy20", "--cfg", "job"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "loss_mode: entropy20" in out.stdout and "path: Qwen/Qwen3-14B-Base" in out.stdout
