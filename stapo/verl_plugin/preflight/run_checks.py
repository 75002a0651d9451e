"""Checks of a whole composed run config, run on the driver before Ray or any worker starts.

A bad setting found here costs a second; found inside a worker it costs a cluster start-up and
possibly hours of GPU time. Every message names the key and the allowed values. verl's own
``validate_config`` runs after these (it covers what it covers, with its own wording); the checks
here are the ones verl leaves to the workers: the token-mask settings (looked up in the mask
registry), the registries, the clip constants, the mini/micro-batch divisibility, the device
against the rollout engine, credentials.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from stapo.algorithm.loss import check_aggregation
from stapo.algorithm.masks import MaskSettings, get_token_mask
from stapo.algorithm.validation import (
    STAPOConfigError,
    check_choice,
    check_entropy_quantile,
    check_number,
    check_positive_int,
    check_tau_p,
    did_you_mean,
    is_finite_number,
)
from stapo.credentials import find_secrets
from stapo.verl_plugin.cpu import vllm_cpu
from stapo.verl_plugin.preflight.batch_checks import check_run_batches
from stapo.verl_plugin.preflight.custom_rule_check import check_custom_files, effective_token_mask
from stapo.verl_plugin.preflight.sp_size import data_parallel_size

# No verl import at module level: importing verl loads this package's plugin, whose trainer imports
# this module; a module-level verl import here would make that a circular import when this module
# is the first one imported (the trainer would then silently not register).

PL = "actor_rollout_ref.actor.policy_loss"
ACTOR = "actor_rollout_ref.actor."
GPU_ONLY_ROLLOUTS = ("sglang", "trtllm")
TOKEN_MEAN = "token-mean"
LOSS_NAME = "masked_clip"  # stapo.verl_plugin.training.losses.LOSS_NAME, without importing verl here
RENAMED_LOSS_MODES = ("stapo", "entropy20")  # loss modes of earlier versions, now token masks


def validate_run_config(config) -> None:
    """Checks of a whole run config that must fail before any worker starts.

    The checks that import none of verl's trainer modules come first, so that a bad setting among theirs is refused
    before those seconds of imports (``_check_registered``: verl's trainer_base with its engines; the policy-loss
    keys and the token mask: the plugin's loss config; the batches: verl's ppo utils; the device: verl's rollout
    registry). None of the checks they now precede refuses a key they read, so a config with one mistake gets the
    message it got before, but for a length that is not an integer: ``data.max_response_length=abc`` is now the
    length check's refusal (the batch check raised ValueError on it), as is ``1e9`` with dynamic batching (the batch
    check's token budget before). Three checks without verl keep their place: ``check_clip_ratios`` and
    ``_check_geo_mean`` read ``loss_mode`` (a misspelt one is ``_check_registered``'s message; a geo_mean with a
    weighting mask the token mask's), and ``_check_no_secrets`` is last (a credential under a key another check
    refuses gets that check's message). tests/unit/test_compose_without_verl.py holds one config for each.
    """
    actor = config.actor_rollout_ref.actor
    check_custom_files(config)  # first: the registries below must see what the user's files register
    _check_lengths_steps_lr(config)
    _check_actor_update(config)
    _check_loggers(config)
    _check_distillation(config)
    _check_recipe_keys(config)
    _check_val_decodings(config)
    _check_registered(config)  # verl's loss and trainer registries: imports verl's trainer modules
    _check_policy_loss_keys(actor.policy_loss)
    _check_token_mask(config)
    check_clip_ratios(actor)
    check_run_batches(config)
    _check_device(config)
    _check_geo_mean(config)
    _check_no_secrets(config)


def _check_token_mask(config) -> None:
    """The mask's settings, what its registry entry needs, and the trainer that folds it."""
    from stapo.verl_plugin.training.config import TARGET

    actor = config.actor_rollout_ref.actor
    policy_loss = actor.policy_loss
    loss_mode = policy_loss.get("loss_mode", "vanilla")
    target = policy_loss.get("_target_", None)
    if target != TARGET:
        if loss_mode == LOSS_NAME:
            raise STAPOConfigError(
                f"{PL}.loss_mode={LOSS_NAME} needs {PL}._target_={TARGET} (got {target}): it types token_mask, "
                "tau_p, ... and makes every worker import the plugin; the conf/algo presets set it"
            )
        return  # a plain verl run: none of this project's keys can be set
    settings = MaskSettings.from_mapping(policy_loss)
    settings = dataclasses.replace(settings, token_mask=effective_token_mask(config, settings.token_mask))
    settings.validate(prefix=f"{PL}.")
    spec = get_token_mask(settings.token_mask)
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    if settings.token_mask != "none" and mode != "stapo":
        raise STAPOConfigError(
            f"{PL}.token_mask={settings.token_mask} needs trainer.v1.trainer_mode=stapo (got {mode!r}): the STAPO "
            "trainer builds and folds the mask; with another trainer it would silently not be applied"
        )
    if spec.weighted and loss_mode != LOSS_NAME:
        raise STAPOConfigError(
            f"{PL}.token_mask={settings.token_mask} weights each token's policy-gradient loss, which only "
            f"{PL}.loss_mode={LOSS_NAME} applies (got {loss_mode!r}); the other losses would ignore the weights"
        )
    if settings.in_loss:
        if loss_mode != LOSS_NAME:
            raise STAPOConfigError(
                f"{PL}.source=current builds the mask inside the loss, which only {PL}.loss_mode={LOSS_NAME} does "
                f"(got {loss_mode!r}); use source=old to fold the mask for any verl loss"
            )
        entropy_on = bool(actor.get("calculate_entropy", False)) or float(actor.get("entropy_coeff", 0.0)) != 0.0
        if spec.needs_entropy and not entropy_on:
            raise STAPOConfigError(
                f"{PL}.source=current builds the {settings.token_mask} mask from the update forward's entropy; set "
                f"{ACTOR}calculate_entropy=true (or use source=old, the default, which reuses the old-policy pass)"
            )
        agg = actor.get("loss_agg_mode", TOKEN_MEAN)
        if agg != TOKEN_MEAN:
            raise STAPOConfigError(
                f"{ACTOR}loss_agg_mode={agg!r} is not supported with {PL}.source=current: the renormalisation over "
                "kept tokens is defined for token-mean only; use token-mean, or source=old, which works with every "
                "aggregation mode"
            )
    if settings.lopti:
        _check_lopti(config, loss_mode, mode)
    regularised = bool(actor.get("use_kl_loss", False)) or float(actor.get("entropy_coeff", 0.0)) != 0.0
    check_aggregation(settings.count_only_rule, loss_mode, actor.get("loss_agg_mode", TOKEN_MEAN), regularised, ACTOR)
    if settings.folded and settings.threshold_scope == "mini_batch":
        from stapo.verl_plugin.training.mini_batches import MiniBatchSplit

        MiniBatchSplit.from_config(actor, config.actor_rollout_ref.rollout.n).check()
    rollout_correction = config.algorithm.get("rollout_correction", None) or {}
    reads_old_pass = settings.folded and (spec.needs_entropy or spec.needs_log_prob)
    if reads_old_pass and rollout_correction.get("bypass_mode", False):
        raise STAPOConfigError(
            "algorithm.rollout_correction.bypass_mode=true skips the old-policy pass whose log-probs and entropy "
            f"{PL}.token_mask={settings.token_mask} (source=old) needs; turn bypass_mode off or use source=current"
        )


def _check_lopti(config, loss_mode: str, mode: str | None) -> None:
    """Lopti's two updates run in the STAPO actor worker, split by the old pass, for the token-level objective."""
    if mode != "stapo":
        raise STAPOConfigError(
            f"{PL}.lopti=true needs trainer.v1.trainer_mode=stapo (got {mode!r}): the STAPO actor worker runs the "
            "two updates; another trainer would update every token at once"
        )
    if loss_mode != LOSS_NAME:
        raise STAPOConfigError(
            f"{PL}.lopti=true needs {PL}.loss_mode={LOSS_NAME} (got {loss_mode!r}): Lopti splits a token-level "
            "objective; a sequence-level loss (gspo, gmpo, ...) over half of each response's tokens is another method"
        )
    rollout_correction = config.algorithm.get("rollout_correction", None) or {}
    if rollout_correction.get("bypass_mode", False):
        raise STAPOConfigError(
            f"algorithm.rollout_correction.bypass_mode=true skips the old-policy pass whose log-probs {PL}.lopti=true "
            "splits the tokens by; turn bypass_mode off"
        )


# --- clip ratios (docs/algorithm.md section 3) --------------------------------------------------
# The dual-clip constant is otherwise asserted inside the loss, after a cluster start-up and a rollout.

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# losses whose clip_ratio_low bounds an importance weight from below without a 1 - eps floor (CISPO:
# a large value switches the lower truncation off)
NO_RATIO_FLOOR_LOSSES = ("cispo",)


def check_clip_ratios(actor: Mapping[str, Any], prefix: str = "actor_rollout_ref.actor.") -> None:
    """``clip_ratio``/``clip_ratio_low`` in [0, 1] (1 - eps is the ratio's floor: 1 switches it off; any
    value >= 0 for CISPO), ``clip_ratio_high`` >= 0, ``clip_ratio_c`` > 1 (verl's dual clip), all finite;
    ``None`` low/high fall back to clip_ratio."""
    loss_mode = (actor.get("policy_loss", None) or {}).get("loss_mode", "vanilla")
    for name in ("clip_ratio", "clip_ratio_low"):
        value = actor.get(name, None)
        if value is None:
            continue
        if loss_mode in NO_RATIO_FLOOR_LOSSES:
            if not is_finite_number(value) or value < 0.0:
                raise STAPOConfigError(f"{prefix}{name} must be a finite number >= 0 for {loss_mode}, got {value!r}")
        elif not is_finite_number(value) or not 0.0 <= value <= 1.0:
            raise STAPOConfigError(
                f"{prefix}{name} must be in [0, 1] (paper: 0.2; 1 turns the lower clip off), got {value!r}"
            )
    value = actor.get("clip_ratio_high", None)
    if value is not None and (not is_finite_number(value) or value < 0.0):
        raise STAPOConfigError(f"{prefix}clip_ratio_high must be a finite number >= 0 (paper: 0.28), got {value!r}")
    value = actor.get("clip_ratio_c", 3.0)
    if not is_finite_number(value) or value <= 1.0:
        raise STAPOConfigError(
            f"{prefix}clip_ratio_c must be a finite number > 1 (dual clip, paper: 10), got {value!r}"
        )
    check_choice("loss_agg_mode", actor.get("loss_agg_mode", TOKEN_MEAN), LOSS_AGG_MODES, prefix)


def _check_registered(config) -> None:
    """A misspelt loss_mode or trainer_mode is otherwise found by the first worker that looks it up."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    loss_mode = config.actor_rollout_ref.actor.policy_loss.get("loss_mode", "vanilla")
    if loss_mode not in POLICY_LOSS_REGISTRY:
        hint = ""
        if loss_mode in RENAMED_LOSS_MODES:
            hint = f" ({PL}.loss_mode={loss_mode} became loss_mode={LOSS_NAME} with token_mask={loss_mode})"
        raise STAPOConfigError(
            f"{PL}.loss_mode must be one of {sorted(POLICY_LOSS_REGISTRY)}, got {loss_mode!r}{hint}"
        )
    v1 = config.trainer.get("v1", None) or {}
    mode = v1.get("trainer_mode", None)
    if mode is not None and mode not in TRAINER_REGISTRY:
        raise STAPOConfigError(f"trainer.v1.trainer_mode must be one of {sorted(TRAINER_REGISTRY)}, got {mode!r}")


def _check_policy_loss_keys(policy_loss) -> None:
    """``+...policy_loss.tau_pp=...`` gets past Hydra's struct mode (the ``+`` adds a key): name it here."""
    target = policy_loss.get("_target_", None)
    try:
        from hydra.utils import get_class

        fields = {field.name for field in dataclasses.fields(get_class(target))} if target else None
    except Exception:  # an unimportable _target_ is reported by verl's own instantiation, with its error
        return
    if fields is None:
        return
    unknown = sorted(set(policy_loss.keys()) - fields - {"_target_"})
    if unknown:
        raise STAPOConfigError(
            f"{PL} has unknown key(s) {[f'{PL}.{key}' for key in unknown]}; the keys of {target} are {sorted(fields)}"
            f"{did_you_mean(unknown[0], sorted(fields))}"
        )


def _check_lengths_steps_lr(config) -> None:
    """Read by verl's dataset, trainer and optimizer inside Ray: a string or a negative there fails late."""
    for key in ("data.max_prompt_length", "data.max_response_length", "trainer.total_epochs"):
        check_positive_int(key, OmegaConf.select(config, key, default=None))
    steps = OmegaConf.select(config, "trainer.total_training_steps", default=None)
    if steps is not None:  # null: trainer.total_epochs decides
        check_positive_int("trainer.total_training_steps", steps)
    check_number(f"{ACTOR}optim.lr", OmegaConf.select(config, f"{ACTOR}optim.lr", default=None), hint=" (paper: 1e-6)")


GAIN_ADAMW = ("stapo.models.testbed.optim", "GainAdamW")
FSDP2 = "fsdp2"


def _check_actor_update(config) -> None:
    """An update happens, and the testbed's optimizer gets the parameters it splits.

    verl runs ``ppo_epochs`` passes over each batch: 0 trains nothing and reports success. GainAdamW
    (stapo/models/testbed/optim.py) tells the norm gains from the matrices by ``ndim``: FSDP2's DTensors keep
    each parameter's shape, FSDP1 flattens every parameter to 1-D, which would give every weight the gains'
    learning rate (``gain_lr_scale`` times it); its scale must be positive (a negative one inverts the step).
    """
    epochs = OmegaConf.select(config, f"{ACTOR}ppo_epochs", default=1)
    check_positive_int(f"{ACTOR}ppo_epochs", epochs)
    optim = OmegaConf.select(config, f"{ACTOR}optim", default=None) or {}
    if (optim.get("optimizer_impl"), optim.get("optimizer")) != GAIN_ADAMW:
        return
    strategy = OmegaConf.select(config, f"{ACTOR}strategy", default=None)
    if strategy != FSDP2:
        raise STAPOConfigError(
            f"{ACTOR}optim.optimizer=GainAdamW needs {ACTOR}strategy={FSDP2}, got {strategy!r}: FSDP1 flattens every "
            "parameter to 1-D, so GainAdamW would take every weight for a norm gain"
        )
    scale = (optim.get("override_optimizer_config") or {}).get("gain_lr_scale", 1.0)
    if not is_finite_number(scale) or scale <= 0:
        raise STAPOConfigError(
            f"{ACTOR}optim.override_optimizer_config.gain_lr_scale must be a finite number > 0 (the norm gains' lr "
            f"over the matrices'; the testbed preset: 100), got {scale!r}"
        )


def _check_loggers(config) -> None:
    """verl's ``Tracking`` asserts its backend names inside the TaskRunner, after Ray started."""
    from verl.utils.tracking import Tracking

    loggers = OmegaConf.select(config, "trainer.logger", default="console")
    allowed = list(Tracking.supported_backend)
    for name in [loggers] if isinstance(loggers, str) else list(loggers or []):
        if name not in allowed:
            raise STAPOConfigError(
                f"trainer.logger={name!r} is not one of verl's loggers {allowed}{did_you_mean(name, allowed)}"
            )


def _check_device(config) -> None:
    """The rollout back-end exists (verl asserts it inside a worker) and runs on ``trainer.device``."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY  # the registry the workers look the name up in

    device = OmegaConf.select(config, "trainer.device", default="cuda")
    name = OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None)  # None: ??? in verl's yaml
    known = sorted({registered for registered, _ in _ROLLOUT_REGISTRY})
    if name is not None and name not in known:
        raise STAPOConfigError(
            f"actor_rollout_ref.rollout.name must be one of {known}, got {name!r}{did_you_mean(name, known)}"
        )
    if device == "cpu" and name in GPU_ONLY_ROLLOUTS:
        raise STAPOConfigError(
            f"actor_rollout_ref.rollout.name={name} needs GPUs but trainer.device=cpu (the qwen3_* presets are GPU "
            "recipes); on a CPU use model_preset=tiny, testbed or smollm2 (rollout stapo_hf or vllm), on GPUs "
            "trainer.device=cuda"
        )
    problem = vllm_cpu.config_problem(config)
    if problem:
        raise STAPOConfigError(problem)


def check_model_for_rollout(config) -> None:
    """Once ``actor_rollout_ref.model.path`` is a folder: the rollout engine can run that model."""
    problem = vllm_cpu.uses_vllm_on_cpu(config) and vllm_cpu.model_problem(config.actor_rollout_ref.model.path)
    if problem:
        raise STAPOConfigError(problem)


def _check_distillation(config) -> None:
    """The STAPO trainer installs its own actor loss function (``STAPOLossFn`` around verl's ``ppo_loss``),
    which would replace verl's distillation loss: the run would silently train without distillation."""
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None)
    if mode == "stapo" and bool(OmegaConf.select(config, "distillation.enabled", default=False)):
        raise STAPOConfigError(
            "distillation.enabled=true is not supported with trainer.v1.trainer_mode=stapo: the STAPO trainer's loss "
            "function would replace verl's distillation loss (set distillation.enabled=false, or run verl's own "
            "trainer without a token mask)"
        )


def _check_geo_mean(config) -> None:
    """verl's ``geo_mean`` averages each micro-batch on its own: split into several micro-batches (or with
    dynamic batch size) the mini-batch gradient is scaled by their number. ``gmpo`` is the same objective
    averaged over the whole mini-batch (``stapo.verl_plugin.training.losses``)."""
    actor = config.actor_rollout_ref.actor
    if actor.policy_loss.get("loss_mode", "vanilla") != "geo_mean":
        return
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    dp = data_parallel_size(world, actor, ACTOR.rstrip("."))
    per_rank = int(actor.ppo_mini_batch_size) * int(config.actor_rollout_ref.rollout.n) // dp
    micro = actor.get("ppo_micro_batch_size_per_gpu", None)
    if bool(actor.get("use_dynamic_bsz", False)) or (micro is not None and int(micro) < per_rank):
        raise STAPOConfigError(
            f"{PL}.loss_mode=geo_mean scales the gradient by the number of micro-batches (verl 0.9.1 averages each "
            "micro-batch on its own; with use_dynamic_bsz each response weighs 1 / its micro-batch's size): use "
            f"{PL}.loss_mode=gmpo (algo=gmpo), the same objective averaged over the mini-batch"
        )


def _check_recipe_keys(config) -> None:
    """This recipe's own ``stapo.*`` keys (read by the trainer inside Ray, or by prepare() after the checks)."""
    stapo = config.get("stapo", None) or {}
    for key in ("spurious_log.every", "spurious_log.max_tokens", "spurious_log.context", "ablation.every",
                "token_sample.every", "token_sample.size"):
        value = OmegaConf.select(config, f"stapo.{key}", default=0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise STAPOConfigError(f"stapo.{key} must be an integer >= 0, got {value!r}")
    from stapo.verl_plugin.training.weight_sync import DEFAULT_TIMEOUT_S

    timeout = OmegaConf.select(config, "stapo.weight_sync_timeout_s", default=DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not is_finite_number(timeout) or timeout <= 0:
        raise STAPOConfigError(f"stapo.weight_sync_timeout_s must be a number of seconds > 0, got {timeout!r}")
    from stapo.verl_plugin.cpu.rollout import BATCH_CHOICES

    batching = OmegaConf.select(config, "stapo.hf_rollout_batch", default=BATCH_CHOICES[0])
    if batching not in BATCH_CHOICES:
        raise STAPOConfigError(f"stapo.hf_rollout_batch must be one of {list(BATCH_CHOICES)}, got {batching!r}")
    switches = {key: OmegaConf.select(config, f"stapo.{key}", default=False)
                for key in ("reward_in_agent_loop", "one_server_direct", "tq_group_puts")}
    for key, value in switches.items():
        if not isinstance(value, bool):
            raise STAPOConfigError(f"stapo.{key} must be true or false, got {value!r}")
    if switches["reward_in_agent_loop"] and OmegaConf.select(config, "reward.reward_model.enable", default=False):
        raise STAPOConfigError(
            "stapo.reward_in_agent_loop=true scores a rule-based reward in the agent-loop worker; with "
            "reward.reward_model.enable=true the scores come from verl's reward-loop actors: set it to false"
        )
    _check_reward_workers(config, switches["reward_in_agent_loop"])
    for key, check in (("tau_p", check_tau_p), ("q", check_entropy_quantile)):
        values = OmegaConf.select(config, f"stapo.ablation.{key}", default=[]) or []
        if isinstance(values, str) or not hasattr(values, "__iter__"):
            raise STAPOConfigError(f"stapo.ablation.{key} must be a list, got {values!r}")
        for value in values:
            check(value, f"stapo.ablation.{key}: ")
    if stapo.get("synthetic_data_dir", None):
        for key in ("synthetic_train_rows", "synthetic_val_rows"):
            check_positive_int(f"stapo.{key}", stapo.get(key, 1))
        seed = stapo.get("synthetic_seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise STAPOConfigError(f"stapo.synthetic_seed must be an integer, got {seed!r}")


def _check_reward_workers(config, reward_in_agent_loop: bool) -> None:
    """``reward.num_workers``: verl's reward-loop actors. Zero only where nothing calls them: the recipe's agent-loop
    worker (``shared_agent_loops``) scores in its own process (``stapo.reward_in_agent_loop``) and no reward model
    asks for them (refused above). Otherwise verl's agent loop would pick a scorer from an empty list on the first
    sample, minutes after Ray started."""
    from stapo.verl_plugin.opt_in.local_reward import SCORING_MANAGER_PATH as MANAGER_PATH

    workers = OmegaConf.select(config, "reward.num_workers", default=1)
    manager = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class", default=None)
    scores_itself = reward_in_agent_loop and manager == MANAGER_PATH
    least = 0 if scores_itself else 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < least:
        why = "" if scores_itself else (
            " (0 only with stapo.reward_in_agent_loop=true and the recipe's agent-loop manager, "
            f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_PATH})")
        raise STAPOConfigError(f"reward.num_workers must be an integer >= {least}, got {workers!r}{why}")


def _check_val_decodings(config) -> None:
    """``stapo.val_decodings``: distinct names of the evaluation's decoding settings, sent by the seeded agent loop."""
    from stapo.eval.core import DECODING
    from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME, REPLACED_AGENT_LOOPS, seeded_rollouts

    names = OmegaConf.select(config, "stapo.val_decodings", default=None) or []
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise STAPOConfigError(f"stapo.val_decodings must be a list of names from {list(DECODING)}, got {names!r}")
    unknown = [name for name in names if name not in DECODING]
    if unknown or len(set(names)) != len(names):
        raise STAPOConfigError(
            f"stapo.val_decodings must be distinct names from {list(DECODING)}, got {list(names)!r}"
        )
    agent_loop = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.default_agent_loop", default=None)
    # verl's default loop is replaced by the seeded one before the run starts (seeding.pin_reproducibility)
    if names and agent_loop not in (*REPLACED_AGENT_LOOPS, AGENT_LOOP_NAME):
        raise STAPOConfigError(
            f"stapo.val_decodings needs actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME} "
            f"(got {agent_loop!r}): that agent loop sets each validation request's decoding"
        )
    if names and agent_loop in REPLACED_AGENT_LOOPS and not seeded_rollouts(config):  # verl's loop is then kept
        raise STAPOConfigError(
            f"stapo.val_decodings needs the {AGENT_LOOP_NAME} agent loop, which stapo.seeded_rollouts=false (the GPU "
            f"presets' default) leaves out: set stapo.seeded_rollouts=true or "
            f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}"
        )


def _check_no_secrets(config) -> None:
    found = find_secrets(OmegaConf.to_container(config, resolve=False))
    if found:
        raise STAPOConfigError(
            "the run config holds credentials, which verl prints, writes to the run folder and sends to "
            f"wandb/tensorboard: {found}. Remove them from the config: Ray workers inherit the environment "
            "(of the driver for a local Ray, of `ray start` on a cluster), so export the variable there instead"
        )
