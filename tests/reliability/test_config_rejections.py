"""Bad settings, tried on purpose through the real Hydra composition of conf/stapo_trainer.yaml.

Each one must be refused by the driver-side checks (``validate_run_config``, which the recipe's
``prepare()`` runs before Ray starts) with a message naming the key and what is allowed. Two of them
also go through the real ``python -m recipe.stapo.main_stapo`` process, which must exit non-zero in
seconds without starting Ray.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from recipe.stapo.main_stapo import CONF_DIR
from stapo.algorithm.masks import TOKEN_MASK_REGISTRY
from stapo.algorithm.validation import STAPOConfigError
from stapo.verl_plugin.preflight.run_checks import validate_run_config

PL = "actor_rollout_ref.actor.policy_loss"
ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
MINI = f"{ACTOR}.ppo_mini_batch_size"
REPO = Path(__file__).resolve().parents[2]


def compose_recipe(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name="stapo_trainer", overrides=list(overrides))


REJECTED = [
    # (overrides, text the message must contain)
    ([f"{PL}.tau_p=1.5"], f"{PL}.tau_p must be a probability in (0, 1)"),
    ([f"{PL}.tau_p=0"], f"{PL}.tau_p must be a probability in (0, 1)"),
    ([f"{PL}.tau_p=nan"], f"{PL}.tau_p must be a probability in (0, 1)"),
    ([f"{PL}.tau_p=abc"], f"{PL}.tau_p must be a probability in (0, 1)"),
    ([f"{PL}.entropy_quantile=0"], f"{PL}.entropy_quantile must be in (0, 1]"),
    ([f"{PL}.entropy_quantile=1.01"], f"{PL}.entropy_quantile must be in (0, 1]"),
    ([f"{PL}.source=fresh"], f"{PL}.source must be one of ['old', 'current']"),
    ([f"{PL}.threshold_scope=batch"], f"{PL}.threshold_scope must be one of ['step', 'mini_batch']"),
    ([f"{ACTOR}.ppo_epochs=2", f"{ACTOR}.shuffle=true"],
     f"{PL}.threshold_scope=mini_batch with actor.ppo_epochs > 1 needs {ACTOR}.shuffle=false"),
    (["algo=entropy20", f"{PL}.entropy_top_fraction=1.2"], f"{PL}.entropy_top_fraction must be in (0, 1]"),
    (["algo=entropy20", f"{PL}.entropy_denominator=some"], f"{PL}.entropy_denominator must be one of ['all', 'kept']"),
    (["algo=taco", f"{PL}.taco_alpha=0"], f"{PL}.taco_alpha must be in (0, 1) (TACO: 0.01), got 0"),
    (["algo=taco", f"{PL}.taco_alpha=1.0"], f"{PL}.taco_alpha must be in (0, 1) (TACO: 0.01), got 1.0"),
    (["algo=taco", f"{PL}.taco_lambda=1.5"], f"{PL}.taco_lambda must be in [0, 1] (TACO: 0.9), got 1.5"),
    (["algo=taco", f"{PL}.taco_lambda=nan"], f"{PL}.taco_lambda must be in [0, 1]"),
    (["algo=advrew", f"{PL}.advrew_alpha=-0.1"],
     f"{PL}.advrew_alpha must be in [0, 1] (arXiv 2505.12929: 0.3), got -0.1"),
    (["algo=advrew", f"{PL}.advrew_alpha=high"], f"{PL}.advrew_alpha must be in [0, 1]"),
    (["algo=lopti", f"{PL}.lopti_eta=0"], f"{PL}.lopti_eta must be in (0, 1) (arXiv 2505.12929: 0.5), got 0"),
    (["algo=lopti", f"{PL}.lopti_eta=1.0"], f"{PL}.lopti_eta must be in (0, 1)"),
    (["algo=lopti", f"{PL}.lopti=maybe"], f"{PL}.lopti must be true or false, got 'maybe'"),
    ([f"{PL}.loss_mode=stapoo"], f"{PL}.loss_mode must be one of ["),
    ([f"+{PL}.tau_pp=0.1"], f"unknown key(s) ['{PL}.tau_pp']"),
    ([f"{ACTOR}.clip_ratio_low=1.2"], f"{ACTOR}.clip_ratio_low must be in [0, 1]"),
    ([f"{ACTOR}.clip_ratio_low=-0.1"], f"{ACTOR}.clip_ratio_low must be in [0, 1]"),
    ([f"{ACTOR}.clip_ratio_high=-0.1"], f"{ACTOR}.clip_ratio_high must be a finite number >= 0"),
    ([f"{ACTOR}.clip_ratio_c=1.0"], f"{ACTOR}.clip_ratio_c must be a finite number > 1"),
    ([f"{ACTOR}.loss_agg_mode=token-avg"], f"{ACTOR}.loss_agg_mode must be one of ['token-mean'"),
    # contradictions
    ([f"{PL}.source=current"], f"set {ACTOR}.calculate_entropy=true"),
    ([f"{PL}.source=current", f"{ACTOR}.calculate_entropy=true", f"{ACTOR}.loss_agg_mode=token-sum"],
     f"{ACTOR}.loss_agg_mode='token-sum' is not supported with {PL}.source=current"),
    (["algo=entropy20", f"{PL}.source=current"],
     f"{PL}.source='current' is not available for {PL}.token_mask='entropy20', which can be built from: ['old']"),
    ([f"{PL}.token_mask=stapoo"], f"{PL}.token_mask must be one of {sorted(TOKEN_MASK_REGISTRY)}, got 'stapoo'"),
    (["trainer.v1.trainer_mode=sync"],
     f"{PL}.token_mask=stapo needs trainer.v1.trainer_mode=stapo (got 'sync'): the STAPO trainer builds and folds"),
    (["algo=entropy20", "trainer.v1.trainer_mode=sync"],
     f"{PL}.token_mask=entropy20 needs trainer.v1.trainer_mode=stapo"),
    (["algo=taco", f"{PL}.loss_mode=vanilla"],
     f"{PL}.token_mask=taco weights each token's policy-gradient loss, which only {PL}.loss_mode=masked_clip "
     "applies (got 'vanilla')"),
    (["algo=advrew", f"{PL}.loss_mode=gmpo"], f"{PL}.token_mask=advrew weights each token's policy-gradient loss"),
    ([f"{PL}.loss_mode=stapo"], f"({PL}.loss_mode=stapo became loss_mode=masked_clip with token_mask=stapo)"),
    ([f"{PL}.loss_mode=entropy20"],
     f"({PL}.loss_mode=entropy20 became loss_mode=masked_clip with token_mask=entropy20)"),
    ([f"{PL}.loss_mode=vanilla", f"{PL}.source=current", f"{ACTOR}.calculate_entropy=true"],
     f"{PL}.source=current builds the mask inside the loss, which only {PL}.loss_mode=masked_clip does"),
    (["algorithm.rollout_correction.bypass_mode=true"], "algorithm.rollout_correction.bypass_mode=true skips"),
    (["algo=lopti", "algorithm.rollout_correction.bypass_mode=true"],
     f"algorithm.rollout_correction.bypass_mode=true skips the old-policy pass whose log-probs {PL}.lopti=true splits"),
    (["algo=lopti", f"{PL}.source=current", f"{ACTOR}.calculate_entropy=true"],
     f"{PL}.lopti=true splits the tokens by the old-policy pass and updates each part against it, which needs "
     f"{PL}.source=old (got 'current')"),
    (["algo=lopti", f"{PL}.loss_mode=gspo"], f"{PL}.lopti=true needs {PL}.loss_mode=masked_clip (got 'gspo')"),
    (["algo=lopti", "trainer.v1.trainer_mode=sync"],
     f"{PL}.lopti=true needs trainer.v1.trainer_mode=stapo (got 'sync')"),
    (["trainer.v1.trainer_mode=stapoo"], "trainer.v1.trainer_mode must be one of ["),
    (["model_preset=qwen3_8b", "trainer.device=cpu"],
     f"{ROLLOUT}.enable_sleep_mode must be false with rollout.name=vllm on trainer.device=cpu"),
    (["model_preset=qwen3_1p7b", "trainer.device=cpu"], "the qwen3_* presets are GPU recipes"),
    ([f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.enable_sleep_mode=true"],
     f"{ROLLOUT}.enable_sleep_mode must be false with rollout.name=vllm on trainer.device=cpu"),
    ([f"{ROLLOUT}.name=sglang"], f"{ROLLOUT}.name=sglang needs GPUs but trainer.device=cpu"),
    (["stapo.weight_sync_timeout_s=0"], "stapo.weight_sync_timeout_s must be a number of seconds > 0, got 0"),
    (["stapo.hf_rollout_batch=all"], "stapo.hf_rollout_batch must be one of ['submission', 'group'], got 'all'"),
    (["stapo.val_decodings=[T0.5]"], "stapo.val_decodings must be distinct names from ['T1.0', 'T0.7'], got ['T0.5']"),
    (["stapo.val_decodings=[T0.7,T0.7]"], "stapo.val_decodings must be distinct names from ['T1.0', 'T0.7'], got"),
    (["stapo.val_decodings=T0.7"], "stapo.val_decodings must be a list of names from ['T1.0', 'T0.7'], got 'T0.7'"),
    (["stapo.val_decodings=[T0.7]", f"{ROLLOUT}.agent.default_agent_loop=tool_agent"],
     f"stapo.val_decodings needs {ROLLOUT}.agent.default_agent_loop=stapo_seeded (got 'tool_agent')"),
    # batch sizes (tiny: 4 prompts x 8 responses, mini-batch 4, micro 8, log-prob micro 16, one rank)
    (["data.train_batch_size=6"], f"data.train_batch_size (6) must be a multiple of {MINI} (4)"),
    ([f"{MINI}=8"], f"data.train_batch_size (4) must be a multiple of {MINI} (8)"),
    (["model_preset=qwen3_8b", "data.train_batch_size=100"], "data.train_batch_size (100) must be a multiple of"),
    (["trainer.n_gpus_per_node=3"], "(4 * 8 = 32 responses) must be divisible by the data-parallel size"),
    (["model_preset=qwen3_8b", "trainer.nnodes=3"], "(64 * 8 = 512 responses) must be divisible by the data-parallel"),
    ([f"{ACTOR}.ppo_micro_batch_size_per_gpu=5"], f"{ACTOR}.ppo_micro_batch_size_per_gpu (5) must divide"),
    (["trainer.n_gpus_per_node=2", f"{ACTOR}.ppo_micro_batch_size_per_gpu=32"],
     (f"ppo_micro_batch_size_per_gpu (32) must divide the responses of one mini-batch on one rank ({MINI} * "
      "rollout.n / data-parallel size = 16)")),
    ([f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu=12"],
     f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu (12) must divide"),
    (["algo=grpo", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=12"],
     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu (12) must divide"),
    ([f"{ACTOR}.ulysses_sequence_parallel_size=2"],
     f"trainer.nnodes * trainer.n_gpus_per_node (1) must be a multiple of {ACTOR}.ulysses_sequence_parallel_size (2)"),
    (["trainer.n_gpus_per_node=4"],
     (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu (16) must divide the responses of one step on one rank "
      "(data.train_batch_size * rollout.n / data-parallel size = 8)")),
    ([f"{ROLLOUT}.log_prob_use_dynamic_bsz=true"],
     f"{ROLLOUT}.log_prob_use_dynamic_bsz (True) must equal {ACTOR}.use_dynamic_bsz (False)"),
    (["stapo.spurious_log.every=-1"], "stapo.spurious_log.every must be an integer >= 0, got -1"),
    (["stapo.spurious_log.max_tokens=many"], "stapo.spurious_log.max_tokens must be an integer >= 0, got 'many'"),
    (["stapo.synthetic_train_rows=0"], "stapo.synthetic_train_rows must be a positive integer, got 0"),
    (["stapo.synthetic_seed=1.5"], "stapo.synthetic_seed must be an integer, got 1.5"),
    ([f"{ROLLOUT}.n=0"], f"{ROLLOUT}.n must be a positive integer, got 0"),
    (["data.train_batch_size=-4"], "data.train_batch_size must be a positive integer, got -4"),
    (["trainer.nnodes=0"], "trainer.nnodes must be a positive integer, got 0"),
    ([f"{ACTOR}.ppo_micro_batch_size_per_gpu=0"], f"{ACTOR}.ppo_micro_batch_size_per_gpu must be a positive integer"),
    # lengths, step counts, types and names that verl reads inside Ray
    (["trainer.total_training_steps=-1"], "trainer.total_training_steps must be a positive integer, got -1"),
    (["data.max_response_length=-5"], "data.max_response_length must be a positive integer, got -5"),
    (["data.max_prompt_length=0"], "data.max_prompt_length must be a positive integer, got 0"),
    (["trainer.total_epochs=0"], "trainer.total_epochs must be a positive integer, got 0"),
    # no update at all: verl would run every step without one and report success
    ([f"{ACTOR}.ppo_epochs=0"], f"{ACTOR}.ppo_epochs must be a positive integer, got 0"),
    # the testbed's optimizer: a scale that inverts or zeroes the gains' step, and FSDP1's 1-D flat parameters
    (["model_preset=testbed", f"{ACTOR}.optim.override_optimizer_config.gain_lr_scale=-1"],
     f"{ACTOR}.optim.override_optimizer_config.gain_lr_scale must be a finite number > 0"),
    (["model_preset=testbed", f"{ACTOR}.optim.override_optimizer_config.gain_lr_scale=0"],
     "(the norm gains' lr over the matrices'; the testbed preset: 100), got 0"),
    (["model_preset=testbed", f"{ACTOR}.strategy=fsdp"],
     f"{ACTOR}.optim.optimizer=GainAdamW needs {ACTOR}.strategy=fsdp2, got 'fsdp'"),
    ([f"{ACTOR}.optim.lr=fast"], f"{ACTOR}.optim.lr must be a finite number >= 0 (paper: 1e-6), got 'fast'"),
    ([f"{ACTOR}.optim.lr=-1e-6"], f"{ACTOR}.optim.lr must be a finite number >= 0"),
    (["trainer.logger=[consol]"], "trainer.logger='consol' is not one of verl's loggers ["),
    (["trainer.logger=[console,wandbb]"], "(did you mean 'wandb'?)"),
    ([f"{ROLLOUT}.name=vlm"], f"{ROLLOUT}.name must be one of ["),
    # combinations that would train something else than configured, silently
    (["distillation.enabled=true"], "distillation.enabled=true is not supported with trainer.v1.trainer_mode=stapo"),
    (["algo=gmpo", f"{PL}.loss_mode=geo_mean"], f"use {PL}.loss_mode=gmpo (algo=gmpo)"),  # 4 micro-batches
    (["algo=gmpo", f"{PL}.loss_mode=geo_mean", f"{ACTOR}.use_dynamic_bsz=true",
      f"{ROLLOUT}.log_prob_use_dynamic_bsz=true"], f"{PL}.loss_mode=geo_mean scales the gradient"),
]


@pytest.mark.parametrize("overrides, message", REJECTED, ids=[" ".join(o) for o, _ in REJECTED])
def test_bad_setting_is_refused_with_key_and_range(overrides, message):
    preset = [] if any(o.startswith("model_preset") for o in overrides) else ["model_preset=tiny"]
    cfg = compose_recipe(*preset, *overrides)
    with pytest.raises(STAPOConfigError) as error:
        validate_run_config(cfg)
    assert message in str(error.value)


ACCEPTED = [
    [f"{PL}.tau_p=0.999", f"{PL}.entropy_quantile=1.0"],
    [f"{ACTOR}.clip_ratio_low=0.0", f"{ACTOR}.clip_ratio_high=0.0", f"{ACTOR}.clip_ratio_c=1.001"],
    [f"{ACTOR}.clip_ratio_low=1.0"],  # a floor of 1 - 1 = 0: no lower clip, on purpose (docs/reliability.md)
    ["stapo.val_decodings=[T0.7,T1.0]", f"{ROLLOUT}.agent.default_agent_loop=stapo_seeded"],
    ["stapo.val_decodings=[T0.7]"],  # verl's single_turn_agent, which the driver swaps for the seeded loop
    ["trainer.total_training_steps=null", f"{ACTOR}.optim.lr=0", "trainer.logger=[console,file]"],
    [f"{PL}.source=current", f"{ACTOR}.calculate_entropy=true"],
    [f"{PL}.source=current", f"{ACTOR}.entropy_coeff=0.001"],  # a bonus also turns the update entropy on
    ["trainer.n_gpus_per_node=2"],
    ["trainer.nnodes=2"],
    ["trainer.n_gpus_per_node=4", f"{ACTOR}.ppo_micro_batch_size_per_gpu=4",
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"],
    ["data.train_batch_size=8", f"{ACTOR}.ppo_mini_batch_size=2"],
    # micro-batch sizes are unused with dynamic batches
    [f"{ACTOR}.use_dynamic_bsz=true", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
     f"{ACTOR}.ppo_micro_batch_size_per_gpu=5", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=7"],
    ["algo=entropy20", f"{PL}.entropy_denominator=kept", f"{PL}.entropy_top_fraction=1.0"],
    ["algo=taco", f"{PL}.taco_lambda=0", f"{PL}.taco_alpha=0.999"],
    ["algo=taco", f"{PL}.taco_lambda=1", f"{PL}.source=current", f"{ACTOR}.calculate_entropy=true"],
    ["algo=advrew", f"{PL}.advrew_alpha=0", f"{PL}.threshold_scope=step"],
    ["algo=advrew", f"{PL}.advrew_alpha=1", f"{PL}.source=current"],  # reads only log p: no entropy needed
    ["algo=lopti", f"{PL}.lopti_eta=0.999"],
    ["algo=advrew", f"{PL}.lopti=true"],  # the paper's AR+Lopti
    ["algo=stapo", f"{PL}.lopti=true", f"{PL}.threshold_scope=step"],  # Lopti combines with any folded mask
    # no mask: nothing to fold, so verl's own trainer may run the loss
    ["algo=justrl", "trainer.v1.trainer_mode=sync"],
    ["algo=grpo", "trainer.v1.trainer_mode=sync"],
    # any verl loss with a folded (source=old) mask
    [f"{PL}.loss_mode=vanilla"],
    ["algo=entropy20", f"{PL}.loss_mode=vanilla"],
    # verl's geo_mean is right when the mini-batch is one micro-batch (4 prompts x 8 responses on one rank)
    ["algo=gmpo", f"{PL}.loss_mode=geo_mean", f"{ACTOR}.ppo_micro_batch_size_per_gpu=32"],
    ["algo=gmpo", f"{ACTOR}.use_dynamic_bsz=true", f"{ROLLOUT}.log_prob_use_dynamic_bsz=true"],
    ["algo=justrl", "trainer.v1.trainer_mode=sync", "distillation.enabled=true"],  # verl's own trainer: its loss
]


@pytest.mark.parametrize("overrides", ACCEPTED, ids=[" ".join(o) for o in ACCEPTED])
def test_edge_of_range_settings_are_accepted(overrides):
    validate_run_config(compose_recipe("model_preset=tiny", *overrides))


def test_paper_recipe_on_64_gpus_and_other_layouts_pass():
    for nodes, per_node in ((8, 8), (1, 8), (2, 4), (4, 8), (16, 8)):
        layout = (f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={per_node}")
        validate_run_config(compose_recipe("model_preset=qwen3_8b", *layout))


@pytest.mark.parametrize(
    "override, key",
    [
        (f"{PL}.tau_pp=0.1", "tau_pp"),  # misspelt STAPO key, no "+": Hydra's struct mode refuses it
        (f"{ACTOR}.clip_ratio_hi=0.3", "clip_ratio_hi"),
        ("trainer.total_training_stepz=3", "total_training_stepz"),
        ("model_preset=qwen3_8", "qwen3_8"),
        ("algo=stapoo", "stapoo"),
    ],
)
def test_misspelt_key_or_preset_is_refused_by_hydra_naming_it(override, key):
    with pytest.raises(ConfigCompositionException) as error:
        compose_recipe(*([] if override.startswith("model_preset") else ["model_preset=tiny"]), override)
    text = str(error.value) + str(error.value.__cause__ or "")
    assert key in text


def _run_recipe(*overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, HYDRA_FULL_ERROR="1", PYTHONUNBUFFERED="1")
    env.pop("STAPO_HIDE_VLLM", None)  # the recipe decides, as for a user
    started = time.monotonic()
    out = subprocess.run(  # -X importtime: each module the process imported, one stderr line each
        [sys.executable, "-X", "importtime", "-m", "recipe.stapo.main_stapo", "model_preset=tiny", *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    return out, time.monotonic() - started


RAY_STARTED = re.compile(r"Started a local Ray instance|ray init kwargs|ray\.init", re.IGNORECASE)


@pytest.mark.parametrize(
    "override, expected, refused_by",
    [
        # one process a route (the messages of each route are tested in-process above; Hydra's refusal of a
        # misspelt key, exit 2 and nothing written, as a process: tests/reliability/test_check.py)
        ("data.train_batch_size=6", f"data.train_batch_size (6) must be a multiple of {MINI} (4)", "checks"),
        # the tiny preset asks for the CPU back-end in Ray's runtime env: a device other than cpu is refused
        # (the preset's own refusal of another device comes first: stapo/preset_fit.py; allowed here to reach it)
        ("trainer.device=cuda", "stapo: STAPO_CPU_BACKEND=1 runs verl on the CPU: it needs trainer.device=cpu",
         "prepare"),
    ],
)
@pytest.mark.slow  # starts processes: out of make test-fast
def test_recipe_process_exits_before_ray(override, expected, refused_by):
    out, seconds = _run_recipe("stapo.cpu_preset.allow_other_inputs=true", override)
    assert out.returncode != 0, out.stdout[-2000:]
    assert expected in out.stderr, out.stderr[-3000:]
    assert not RAY_STARTED.search(out.stdout + out.stderr), (out.stdout + out.stderr)[-3000:]
    # the whole process: interpreter, torch and verl imports, the check. About 15 s on an idle 2-core
    # machine, 50 s under a load of 10; a hang guard only; the absence of Ray's start-up lines is the proof
    assert seconds < 150, seconds
    print(f"[reliability] {override}: exit {out.returncode} after {seconds:.1f} s")
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", out.stderr, flags=re.MULTILINE))
    # the settings' checks load verl's trainer modules, whose checkpoint engines import vLLM when it is installed:
    # a run on the HF server never calls vLLM, and its driver imports it as if absent (as its workers do)
    assert "verl.trainer.ppo.v1.trainer_base" in imported, out.stderr[-3000:]
    assert "vllm" not in imported, sorted(name for name in imported if name.startswith("vllm"))
    if refused_by == "checks":  # before verl's entry point, whose imports a run pays once its settings passed
        assert "verl.trainer.main_ppo" not in imported
