"""verl's batch-size rules, checked on the driver (sizes in prompts, as in verl's config).

verl asserts the mini/micro-batch divisibility inside each worker's update, i.e. after a cluster
start-up and a whole rollout; here it costs a second.
"""

from __future__ import annotations

from collections.abc import Mapping

from stapo.algorithm.validation import STAPOConfigError, check_positive_int
from stapo.verl_plugin.preflight.sp_size import check_sp_model, data_parallel_size, data_parallel_text, role_sp_size

FSDP_STRATEGIES = ("fsdp", "fsdp2")
ACTOR, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
REF_MICRO = f"{REF}.log_prob_micro_batch_size_per_gpu"


def check_batch_sizes(
    train_batch_size: int,
    rollout_n: int,
    mini_batch_size: int,
    dp_size: int,
    micro_batch_size: int | None = None,
    log_prob_micro_batch_sizes: Mapping[str, int | None] | None = None,
    dp_text: str | None = None,
) -> None:
    """The divisibility verl's workers assert mid-step, checked up front (sizes in prompts, as in verl).

    One step holds ``train_batch_size * rollout_n`` responses, split evenly over the ``dp_size`` data-parallel
    ranks (world / the actor's sequence-parallel size, ``stapo.verl_plugin.preflight.sp_size``); each PPO mini-batch
    holds ``mini_batch_size * rollout_n``. ``micro_batch_size`` (the update) and ``log_prob_micro_batch_sizes`` (key ->
    size, the actor's log-prob passes) are per GPU, ``None`` when dynamic batching replaces them. ``dp_text`` says
    how ``dp_size`` was derived, in numbers (``sp_size.data_parallel_text``); the bare size when not given.
    """
    tb, mini = "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"
    dp = dp_size
    if mini_batch_size > train_batch_size or train_batch_size % mini_batch_size:
        raise STAPOConfigError(
            f"{tb} ({train_batch_size}) must be a multiple of {mini} ({mini_batch_size}): otherwise verl pads the "
            "last PPO mini-batch with empty synthetic samples"
        )
    responses, mini_responses = train_batch_size * rollout_n, mini_batch_size * rollout_n
    if mini_responses % dp:
        raise STAPOConfigError(
            f"{mini} * actor_rollout_ref.rollout.n ({mini_batch_size} * {rollout_n} = {mini_responses} responses) "
            f"must be divisible by the data-parallel size {dp_text or dp}"
        )
    if micro_batch_size is not None and (mini_responses // dp) % micro_batch_size:
        raise STAPOConfigError(
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu ({micro_batch_size}) must divide the responses "
            f"of one mini-batch on one rank ({mini} * rollout.n / data-parallel size = {mini_responses // dp})"
        )
    for key, micro in (log_prob_micro_batch_sizes or {}).items():
        check_log_prob_micro_batch(key, micro, responses, dp)


def check_log_prob_micro_batch(key: str, micro: int | None, responses: int, dp_size: int) -> None:
    """A log-prob pass's micro-batch (per GPU) divides one step's responses on one rank of its role's mesh."""
    if micro is not None and (responses // dp_size) % micro:
        raise STAPOConfigError(
            f"{key} ({micro}) must divide the responses of one step on one rank "
            f"(data.train_batch_size * rollout.n / data-parallel size = {responses // dp_size})"
        )


def check_token_budget(key: str, budget, sp: int, longest: int) -> None:
    """A dynamic micro-batch holds whole sequences: verl's ``rearrange_micro_batches`` asserts ``budget x SP size``
    (``workers/engine/utils.py``) is at least the longest sequence of the batch, so a budget below
    ``max_prompt_length + max_response_length`` fails mid-run, at the first response that long."""
    if budget is None or isinstance(budget, bool) or not isinstance(budget, int):
        return  # verl's own default (or an interpolation verl resolves), not a user's number
    if budget * sp < longest:
        sp_text = f" x sequence-parallel size {sp}" if sp > 1 else ""
        raise STAPOConfigError(
            f"{key} ({budget}{sp_text}) must be at least data.max_prompt_length + data.max_response_length "
            f"({longest}): verl packs whole sequences into a micro-batch and stops the run at the first longer one"
        )


def check_run_batches(config) -> None:
    data, trainer = config.data, config.trainer
    actor, rollout, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, config.actor_rollout_ref.ref
    nnodes = check_positive_int("trainer.nnodes", trainer.nnodes)
    per_node = check_positive_int("trainer.n_gpus_per_node", trainer.n_gpus_per_node)
    world = nnodes * per_node
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

    for key, value in micros.items():
        if value is not None:
            check_positive_int(key, value)
    ref_micro = None
    if need_reference_policy(config) and not ref.get("log_prob_use_dynamic_bsz", False):
        ref_micro = ref.get("log_prob_micro_batch_size_per_gpu")
        if ref_micro is not None:
            check_positive_int(REF_MICRO, ref_micro)
    update_micro = micros.pop("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", None)
    dp = data_parallel_size(world, actor, ACTOR)
    check_batch_sizes(train, n, mini, dp, update_micro, micros, data_parallel_text(nnodes, per_node, actor, ACTOR))
    longest = int(data.get("max_prompt_length", 0) or 0) + int(data.get("max_response_length", 0) or 0)
    actor_sp = role_sp_size(actor, ACTOR)[0]
    if dynamic:
        check_token_budget(f"{ACTOR}.ppo_max_token_len_per_gpu", actor.get("ppo_max_token_len_per_gpu"), actor_sp,
                           longest)
    if log_prob_dynamic:
        check_token_budget("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                           rollout.get("log_prob_max_token_len_per_gpu"), actor_sp, longest)
    if need_reference_policy(config) and ref.get("log_prob_use_dynamic_bsz", False):
        check_token_budget(f"{REF}.log_prob_max_token_len_per_gpu", ref.get("log_prob_max_token_len_per_gpu"),
                           role_sp_size(ref, REF)[0], longest)
    model = config.actor_rollout_ref.model
    check_sp_model(actor, ACTOR, model)
    if need_reference_policy(config):  # the ref has a mesh of its own: its SP size follows the actor's deprecated
        ref_dp = data_parallel_size(world, ref, REF)  # key, not the actor's fsdp_config one (sp_size.py)
        check_sp_model(ref, REF, model)
        check_log_prob_micro_batch(REF_MICRO, ref_micro, train * n, ref_dp)
