"""Every model preset x algorithm composes through Hydra, passes verl's own checks, and carries the spec's values.

Fast (no Ray, no model): not marked e2e, runs in `make test-fast` too, except the two `--cfg job` runs of
the entry point (a fresh interpreter each, about 10 s apiece on 2 cores), which are marked slow.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from stapo.verl_plugin.preflight.run_checks import validate_run_config
from stapo.verl_plugin.training.config import STAPOPolicyLossConfig
from tests.recipe_config import config_for_verl, recipe_config

PRESETS = ["tiny", "smollm2", "qwen3_1p7b", "qwen3_8b", "qwen3_14b", "tailbed"]
ALGOS = ["stapo", "justrl", "grpo", "entropy20"]
# one objective for every algorithm; they differ in the token mask (and clip/KL constants)
TOKEN_MASK = {"stapo": "stapo", "justrl": "none", "grpo": "none", "entropy20": "entropy20"}


compose_recipe = recipe_config
resolved_recipe = config_for_verl  # ${hydra:...} resolved, hydra node dropped, as main_stapo hands it to verl


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("algo", ALGOS)
def test_every_preset_and_algo_composes_and_validates(preset, algo):
    cfg = compose_recipe(f"model_preset={preset}", f"algo={algo}")
    actor = cfg.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "masked_clip"
    assert actor.policy_loss.token_mask == TOKEN_MASK[algo]
    assert cfg.trainer.v1.trainer_mode == "stapo"  # one trainer for every algorithm
    validate_run_config(cfg)
    typed = omega_conf_to_dataclass(actor)
    assert isinstance(typed.policy_loss, STAPOPolicyLossConfig)
    assert (typed.policy_loss.loss_mode, typed.policy_loss.token_mask) == ("masked_clip", TOKEN_MASK[algo])


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("algo", ALGOS)
def test_every_preset_and_algo_passes_verls_validation(preset, algo):
    """verl's driver-side checks (batch divisibility, dynamic-bsz token limits, KL settings, ...)."""
    cfg = resolved_recipe(f"model_preset={preset}", f"algo={algo}")
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.trainer.experiment_name == f"{preset}-{algo}"
    assert need_critic(cfg) is False  # GRPO: no value network in any row of the paper


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
    loss = actor.policy_loss
    assert (loss.tau_p, loss.entropy_quantile, loss.source) == (0.002, 0.75, "old")
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (8, 8)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.use_kl_in_reward is False
    assert cfg.trainer.test_freq == 20
    # micro-batching: dynamic batches of 32k tokens per GPU for the update and both log-prob passes
    assert actor.use_dynamic_bsz is True and actor.ppo_max_token_len_per_gpu == 32768
    assert actor.ppo_epochs == 1 and actor.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert cfg.reward.custom_reward_function.path == "pkg://stapo.reward"
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert cfg.trainer.device == "cuda" and rollout.mode == "async"
    resolved = resolved_recipe(f"model_preset={preset}", "algo=stapo")
    for log_prob in (resolved.actor_rollout_ref.ref, resolved.actor_rollout_ref.rollout):
        assert log_prob.log_prob_use_dynamic_bsz is True and log_prob.log_prob_max_token_len_per_gpu == 32768


def test_tiny_preset_sets_everything_the_cpu_needs():
    cfg = compose_recipe("model_preset=tiny", "algo=stapo")
    model, actor, ray_init = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor, cfg.ray_kwargs.ray_init
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.rollout.name == "stapo_hf"
    assert actor.strategy == "fsdp2" and cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    assert model.override_config.attn_implementation == "sdpa"
    assert model.use_remove_padding is False and model.enable_gradient_checkpointing is False
    assert actor.use_torch_compile is False and actor.fsdp_config.model_dtype == "fp32"
    assert ray_init.num_cpus == 16 and ray_init.include_dashboard is False
    assert ray_init.runtime_env.env_vars.STAPO_CPU_BACKEND == "1"
    assert cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    assert list(cfg.trainer.logger) == ["console"]
    assert resolved_recipe("model_preset=tiny").ray_kwargs.ray_init.num_gpus == cfg.trainer.n_gpus_per_node


def test_grpo_baseline_is_symmetric_with_kl():
    actor = compose_recipe("model_preset=qwen3_8b", "algo=grpo").actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.2)
    assert actor.use_kl_loss is True and actor.kl_loss_coef > 0


def test_cli_overrides_reach_the_config():
    cfg = compose_recipe("algo=stapo", "actor_rollout_ref.actor.policy_loss.tau_p=0.001", "trainer.nnodes=4")
    assert cfg.actor_rollout_ref.actor.policy_loss.tau_p == 0.001 and cfg.trainer.nnodes == 4


@pytest.mark.parametrize(
    "preset, algo, expected",
    [
        ("qwen3_14b", "entropy20",
         ["loss_mode: masked_clip", "token_mask: entropy20", "path: Qwen/Qwen3-14B-Base", "name: vllm"]),
        # the defaults (tiny, stapo) as a process: tests/launch/test_entrypoint_modes.py, through the image's entry
    ],
)
@pytest.mark.slow
def test_cfg_job_prints_the_composed_config(preset, algo, expected):
    out = subprocess.run(
        [sys.executable, "-m", "recipe.stapo.main_stapo", f"model_preset={preset}", f"algo={algo}", "--cfg", "job"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for text in expected:
        assert text in out.stdout, text


@pytest.mark.parametrize(
    ("user_env", "user_override", "expected"),
    [
        ({}, None, "offline"),  # nobody chose: offline, even with an API key around
        ({"WANDB_MODE": "online"}, None, None),  # the user's environment decides
        ({}, "online", "online"),  # so does the runtime env the user set
    ],
)
def test_wandb_goes_to_the_workers_offline_unless_the_user_chose(monkeypatch, user_env, user_override, expected):
    from stapo.verl_plugin.training.loggers import keep_wandb_offline_unless_asked

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    for key, value in user_env.items():
        monkeypatch.setenv(key, value)
    overrides = ["model_preset=qwen3_8b", "algo=stapo"]
    if user_override:
        overrides.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE={user_override}")
    cfg = compose_recipe(*overrides)
    assert "wandb" in cfg.trainer.logger
    keep_wandb_offline_unless_asked(cfg)
    assert OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE") == expected
