"""Checks of a whole composed run config, run on the driver before Ray or any worker starts.

A bad setting found here costs a second; found inside a worker it costs a cluster start-up and
possibly hours of GPU time. Every message names the key and the allowed values. verl's own
``validate_config`` runs after these (it covers what it covers, with its own wording); the checks
here are the ones verl leaves to the workers: the policy-loss fields, the registries, the clip
constants, the mini/micro-batch divisibility, the device against the rollout engine, credentials.
"""

from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from stapo.secrets import find_secrets
from stapo.validation import STAPOConfigError, check_batch_sizes, check_clip_ratios, check_positive_int, validate_actor

# No verl import at module level: importing verl loads this package's plugin, whose trainer imports
# this module; a module-level verl import here would make that a circular import when this module
# is the first one imported (the trainer would then silently not register).

PL = "actor_rollout_ref.actor.policy_loss"
GPU_ONLY_ROLLOUTS = ("vllm", "sglang", "trtllm")
FSDP_STRATEGIES = ("fsdp", "fsdp2")


def validate_run_config(config) -> None:
    """Checks of a whole run config that must fail before any worker starts."""
    from stapo.verl_plugin.config import TARGET

    actor = config.actor_rollout_ref.actor
    _check_registered(config)
    _check_policy_loss_keys(actor.policy_loss)
    validate_actor(actor)
    check_clip_ratios(actor)
    loss_mode = actor.policy_loss.get("loss_mode", "vanilla")
    target = actor.policy_loss.get("_target_", None)
    if loss_mode in ("stapo", "entropy20") and target != TARGET:
        raise STAPOConfigError(
            f"{PL}.loss_mode={loss_mode} needs {PL}._target_={TARGET} (got {target}): it types tau_p, "
            "entropy_quantile, source, ... and makes every worker import the plugin; algo=stapo sets it"
        )
    needs_old_pass = loss_mode == "entropy20" or (
        loss_mode == "stapo" and actor.policy_loss.get("source", "old") == "old"
    )
    rollout_correction = config.algorithm.get("rollout_correction", None) or {}
    if needs_old_pass and rollout_correction.get("bypass_mode", False):
        raise STAPOConfigError(
            "algorithm.rollout_correction.bypass_mode=true skips the old-policy pass whose entropy "
            f"policy_loss.loss_mode={loss_mode} (source=old) needs; turn bypass_mode off or use source=current"
        )
    _check_batches(config)
    _check_device(config)
    _check_recipe_keys(config)
    _check_no_secrets(config)


def _check_registered(config) -> None:
    """A misspelt loss_mode or trainer_mode is otherwise found by the first worker that looks it up."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    loss_mode = config.actor_rollout_ref.actor.policy_loss.get("loss_mode", "vanilla")
    if loss_mode not in POLICY_LOSS_REGISTRY:
        raise STAPOConfigError(f"{PL}.loss_mode must be one of {sorted(POLICY_LOSS_REGISTRY)}, got {loss_mode!r}")
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
        )


def _check_batches(config) -> None:
    data, trainer = config.data, config.trainer
    actor, rollout, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, config.actor_rollout_ref.ref
    world = check_positive_int("trainer.nnodes", trainer.nnodes) * check_positive_int(
        "trainer.n_gpus_per_node", trainer.n_gpus_per_node
    )
    train = check_positive_int("data.train_batch_size", data.train_batch_size)
    n = check_positive_int("actor_rollout_ref.rollout.n", rollout.n)
    mini = check_positive_int("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size)
    dynamic = bool(actor.get("use_dynamic_bsz", False))
    log_prob_dynamic = bool(rollout.get("log_prob_use_dynamic_bsz", False))
    if dynamic != log_prob_dynamic:  # asserted by verl's actor worker at start-up, without the key names
        raise STAPOConfigError(
            f"actor_rollout_ref.rollout.log_prob_use_dynamic_bsz ({log_prob_dynamic}) must equal "
            f"actor_rollout_ref.actor.use_dynamic_bsz ({dynamic}): the actor computes the old log-probs with its "
            "own batching"
        )
    if actor.get("strategy", None) not in FSDP_STRATEGIES:
        return  # megatron's DP size depends on TP x PP x CP; verl checks that layout itself
    micros = {}
    if not dynamic:
        micros["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] = actor.get("ppo_micro_batch_size_per_gpu")
    if not log_prob_dynamic:
        micros["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] = rollout.get(
            "log_prob_micro_batch_size_per_gpu"
        )
    from verl.trainer.ppo.utils import need_reference_policy

    if need_reference_policy(config) and not ref.get("log_prob_use_dynamic_bsz", False):
        micros["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] = ref.get("log_prob_micro_batch_size_per_gpu")
    for key, value in micros.items():
        if value is not None:
            check_positive_int(key, value)
    update_micro = micros.pop("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", None)
    check_batch_sizes(
        train, n, mini, world, actor.get("ulysses_sequence_parallel_size", 1) or 1, update_micro, micros
    )


def _check_device(config) -> None:
    device = OmegaConf.select(config, "trainer.device", default="cuda")
    name = OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None)  # None: ??? in verl's yaml
    if device == "cpu" and name in GPU_ONLY_ROLLOUTS:
        raise STAPOConfigError(
            f"actor_rollout_ref.rollout.name={name} needs GPUs but trainer.device=cpu (the qwen3_* presets are GPU "
            "recipes); on a CPU use model_preset=tiny or model_preset=smollm2 (rollout stapo_hf), on GPUs "
            "trainer.device=cuda"
        )


def _check_recipe_keys(config) -> None:
    """This recipe's own ``stapo.*`` keys (read by the trainer inside Ray, or by prepare() after the checks)."""
    stapo = config.get("stapo", None) or {}
    for key in ("every", "max_tokens", "context"):
        value = OmegaConf.select(config, f"stapo.spurious_log.{key}", default=0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise STAPOConfigError(f"stapo.spurious_log.{key} must be an integer >= 0, got {value!r}")
    if stapo.get("synthetic_data_dir", None):
        for key in ("synthetic_train_rows", "synthetic_val_rows"):
            check_positive_int(f"stapo.{key}", stapo.get(key, 1))
        seed = stapo.get("synthetic_seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise STAPOConfigError(f"stapo.synthetic_seed must be an integer, got {seed!r}")


def _check_no_secrets(config) -> None:
    found = find_secrets(OmegaConf.to_container(config, resolve=False))
    if found:
        raise STAPOConfigError(
            "the run config holds credentials, which verl prints, writes to the run folder and sends to "
            f"wandb/tensorboard: {found}. Remove them from the config: Ray workers inherit the environment "
            "(of the driver for a local Ray, of `ray start` on a cluster), so export the variable there instead"
        )
