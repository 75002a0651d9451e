"""The project's one policy loss in verl's registry, and the actor-side wrapper around verl's ``ppo_loss``.

``masked_clip`` is the objective of every masking algorithm (grpo, justrl, stapo, entropy20, dapo,
drgrpo, and the weightings taco and advrew): verl's vanilla clipped objective (clip-higher, dual clip,
rollout IS weights, any ``loss_agg_mode``) over the tokens the token mask keeps, made robust
(docs/algorithm.md section 6): values outside the mask never reach the loss or its gradient, an empty
micro-batch is an exact 0, a non-finite loss is refused by giving it a NaN gradient so that verl skips
the update on every rank (never a raise that leaves FSDP peers waiting in a collective). Why not verl's own
``vanilla`` over the folded mask: it has none of that robustness (a NaN at a silenced position
poisons the gradient through 0 * NaN), and the comparison needs one code path for all.

The mask reaches the loss in one of two ways, both known from the config alone:
- ``source: old``: the STAPO trainer folded it into ``response_mask`` (the sum) and ``loss_mask``
  (verl's token count, DP all-reduced before the micro-batches run); the loss sees the folded mask, and
  ``STAPOLossFn`` hands it the micro-batch's ``loss_mask`` too: ``agg_loss`` counts each sequence over it, so a
  rule that keeps tokens in the count but out of the sum (Lopti's phases, 20-Entropy's ``all``) is exact under
  every ``loss_agg_mode`` (docs/algorithm.md section 3).
- ``source: current``: the loss builds it from the update forward (``STAPOLossFn`` hands over the
  current entropy and the DP group, which verl does not pass) and rescales the micro-batch to its
  DP-global kept-token count.

A weighted entry's per-token weights (TACO, Advantage Reweighting) multiply the per-token losses, with
verl's rollout importance weights: folded into the shard as a field of their own (``source: old``), which
``STAPOLossFn`` reads from each micro-batch and hands over, or built here (``source: current``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.utils.metric import AggregationType, Metric
from verl.utils.torch_functional import masked_mean
from verl.workers.utils.padding import no_padding_2_padding

from stapo.algorithm.dcpo import dcpo_pg_losses
from stapo.algorithm.loss import (
    PER_SEQUENCE_COUNT_MODES,
    geo_mean_seq_losses,
    masked_pg_losses,
    nan_gradient_loss,
    nonfinite_report,
    outside_mask_zeroed,
)
from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask, get_token_mask, group_totals
from stapo.algorithm.quantile import dp_ranks
from stapo.verl_plugin.training.jagged import TOKEN_WEIGHT, padded_token_weight

logger = logging.getLogger(__name__)

LOSS_NAME = "masked_clip"
# GMPO normalised over the whole mini-batch (verl's own `geo_mean` averages each micro-batch on its own)
GMPO_LOSS_NAME = "gmpo"
# DCPO's per-token clip bounds (stapo.algorithm.dcpo), with the folded mask and masked_clip's robustness
DCPO_LOSS_NAME = "dcpo"
DCPO_METRIC_PREFIX = "actor/dcpo/"
METRIC_PREFIX = "actor/stapo/"
# per micro-batch: verl's DP-global token count of the mini-batch (the loss's denominator), MAX-aggregated
LOSS_TOKENS_METRIC = METRIC_PREFIX + "loss_tokens"
REFUSED_METRIC = METRIC_PREFIX + "refused_micro_batches"
# in-loss (source: current) mask statistics travel as SUM metrics under this prefix; the trainer turns
# them into step totals, ratios of sums and means of the defined thresholds
IN_LOSS_PREFIX = METRIC_PREFIX + "_sum/"
DEFINED_SUFFIX = "#defined"


@dataclass
class UpdateContext:
    """What the loss needs beyond verl's arguments, for the micro-batch in flight, and what it reports back."""

    entropy: torch.Tensor | None
    dp_group: dist.ProcessGroup | None
    report: dict[str, float] = field(default_factory=dict)
    token_weight: torch.Tensor | None = None  # a folded weighted entry's weights, padded as response_mask
    count_mask: torch.Tensor | None = None  # the micro-batch's loss_mask (the count), padded as response_mask


_UPDATE_CONTEXT: contextvars.ContextVar[UpdateContext | None] = contextvars.ContextVar(
    "stapo_update_context", default=None
)
# set by the STAPO actor worker around verl's update once it has folded the mask into the shard
_MASK_FOLDED: contextvars.ContextVar[bool] = contextvars.ContextVar("stapo_mask_folded", default=False)

NOT_FOLDED = (
    "actor_rollout_ref.actor.policy_loss.token_mask={mask} (source=old) reached the loss unfolded: only the STAPO "
    "trainer's actor worker builds and folds it, so this update would train without the mask (JustRL, not "
    "{mask}). Set trainer.v1.trainer_mode=stapo (and trainer.use_v1=true), or run python -m recipe.stapo.main_stapo"
)

NOT_SPLIT = (
    "actor_rollout_ref.actor.policy_loss.lopti=true reached the loss outside the STAPO trainer's actor worker, which "
    "runs Lopti's two updates: this one would update every token at once. Set trainer.v1.trainer_mode=stapo"
)


@contextlib.contextmanager
def folded_mask_update():
    """The span of one actor update whose shard already carries the folded token mask."""
    token = _MASK_FOLDED.set(True)
    try:
        yield
    finally:
        _MASK_FOLDED.reset(token)


def refuse_unfolded_mask(settings: MaskSettings) -> None:
    """A folded mask configured but never folded (verl's own trainers, ``main_ppo`` with trainer_mode=sync or
    the legacy trainer): every rank raises here, at the same point of the first micro-batch, before any
    gradient exists, instead of silently training over the unmasked tokens. Lopti's split is made by the same
    worker, so the same holds for it."""
    if settings.folded and not _MASK_FOLDED.get():
        raise RuntimeError(NOT_FOLDED.format(mask=settings.token_mask))
    if settings.lopti and not _MASK_FOLDED.get():
        raise RuntimeError(NOT_SPLIT)


def mask_settings(actor_config) -> MaskSettings:
    return MaskSettings.from_mapping(actor_config.policy_loss)


class STAPOLossFn:
    """Drop-in for ``partial(ppo_loss, config=actor_config)``, installed by the STAPO trainer.

    Around verl's own ``ppo_loss`` (its KL, entropy-bonus and metric code runs unchanged) it:
    hands the current entropy and DP group to an in-loss mask; gives verl's entropy term a detached
    entropy when ``entropy_coeff == 0`` (otherwise a vocabulary-sized softmax stays alive in the
    graph for a term multiplied by 0); reports verl's token count (``actor/stapo/loss_tokens``) so
    the trainer can prove the folded mask reached it; refuses a non-finite total loss on all ranks.
    """

    def __init__(self, actor_config):
        self.config = actor_config
        self.settings = mask_settings(actor_config)

    def __call__(self, model_output, data, dp_group=None):
        raw_entropy = model_output.get("entropy", None)
        entropy = None
        if raw_entropy is not None:
            entropy = no_padding_2_padding(raw_entropy, data).detach() if self.settings.in_loss else None
            # replaced in the engine's own dict, so the attached original (and its graph) is released now
            verl_entropy = raw_entropy.detach() if self.config.entropy_coeff == 0 else raw_entropy
            model_output["entropy"] = _finite_or_zero(verl_entropy)
        token_weight = padded_token_weight(data)
        count_mask = _padded_count_mask(data)
        loss_mode = self.config.policy_loss.get("loss_mode", "vanilla")
        if token_weight is not None and loss_mode != LOSS_NAME:
            raise RuntimeError(
                f"the shard carries {self.settings.token_mask}'s per-token weights ({TOKEN_WEIGHT}), which only "
                f"policy_loss.loss_mode={LOSS_NAME} applies (got {loss_mode!r}): the update would ignore them"
            )
        # imported here: its module imports core_algos, whose import registers this module (registration.py)
        from verl.workers.utils.losses import ppo_loss

        context = UpdateContext(entropy=entropy, dp_group=dp_group, token_weight=token_weight, count_mask=count_mask)
        token = _UPDATE_CONTEXT.set(context)
        try:
            loss, metrics = ppo_loss(self.config, model_output, data, dp_group)
        finally:
            _UPDATE_CONTEXT.reset(token)
        batch_tokens = float(data["batch_num_tokens"])
        metrics[LOSS_TOKENS_METRIC] = Metric(AggregationType.MAX, batch_tokens)
        # a mini-batch without any loss token (every rank): verl's token-mean KL/entropy terms are 0/0
        # there, but nothing is wrong and nothing is to be learnt: an exact zero, not a refusal
        empty = batch_tokens == 0
        refused = not empty and not bool(torch.isfinite(loss))
        # verl averages a SUM metric over the DP ranks: one refusing rank of N would read 1/N
        metrics[REFUSED_METRIC] = Metric(AggregationType.SUM, _any_rank(refused, dp_group, loss.device))
        if empty or refused:
            log_prob = no_padding_2_padding(model_output["log_probs"], data)
            response_mask = data.select("response_mask").to_padded_tensor()["response_mask"]
        if empty:
            (nothing,) = outside_mask_zeroed(torch.zeros_like(response_mask, dtype=torch.bool), log_prob)
            loss = nothing.sum()  # 0, still connected to the graph, zero gradient
        elif refused:
            logger.warning("actor loss is %s on this micro-batch; the update is skipped on every rank", loss.item())
            loss = nan_gradient_loss(log_prob, response_mask)
        for key, value in context.report.items():
            metrics[IN_LOSS_PREFIX + key] = Metric(AggregationType.SUM, value)
        return loss, metrics


def _any_rank(flag: bool, group: dist.ProcessGroup | None, device: torch.device) -> float:
    """1.0 if ``flag`` holds on any rank of ``group`` (the same value on every rank), else 0.0."""
    value = torch.tensor(float(flag), device=device)
    if dp_ranks(group) > 1:
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value)


def _padded_count_mask(data) -> torch.Tensor | None:
    """The micro-batch's ``loss_mask`` (verl's token count) padded as verl pads ``response_mask``; None without
    one. Padded together with ``response_mask`` so both have the width the loss's tensors have."""
    if "loss_mask" not in data.keys():
        return None
    return data.select("response_mask", "loss_mask").to_padded_tensor()["loss_mask"].bool()


def _finite_or_zero(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (dense or jagged nested) with non-finite values set to 0; the same object when all are finite.

    verl's entropy term multiplies by the coefficient after aggregation, so one NaN entropy (only a
    metric when entropy_coeff=0) would otherwise turn the whole micro-batch's loss into NaN.
    """
    if tensor.is_nested and tensor.layout != torch.jagged:
        return tensor  # verl hands jagged tensors over; anything else is left as verl made it
    values = tensor.values() if tensor.is_nested else tensor
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return tensor
    clean = torch.where(finite, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return torch.nested.nested_tensor_from_jagged(clean, tensor.offsets()) if tensor.is_nested else clean


def _folded_weight(settings: MaskSettings) -> torch.Tensor | None:
    """``source: old``: the micro-batch's weights of a weighted entry, from the field the fold stored; the
    update refuses to run without them rather than train the unweighted objective under the entry's name."""
    context = _UPDATE_CONTEXT.get()
    weight = None if context is None else context.token_weight
    if weight is None and settings.folded and get_token_mask(settings.token_mask).weighted:
        raise RuntimeError(
            f"policy_loss.token_mask={settings.token_mask} weights each token's loss, but this micro-batch carries "
            f"no {TOKEN_WEIGHT}: the weights reach the loss only through the STAPO trainer's fold and its loss "
            "wrapper (trainer.v1.trainer_mode=stapo, set by conf/algo/*.yaml)"
        )
    return weight


def _count_mask(settings: MaskSettings, mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """The tokens each sequence is counted over by ``agg_loss`` (docs/algorithm.md section 3, "aggregation modes").

    ``response_mask`` holds the tokens summed; ``loss_mask`` the tokens counted, a superset where a rule keeps a
    token in the count but not in the sum (Lopti's other phase, 20-Entropy's ``entropy_denominator: all``). verl's
    engine reads the batch's count from ``loss_mask``, but ``agg_loss`` takes each sequence's count
    (``seq-mean-token-mean``) from the mask it is handed: handing it the count, with the per-token losses already 0
    outside the sum, gives every mode the authors' formulation (the other tokens' advantages zeroed)."""
    context = _UPDATE_CONTEXT.get()
    count = None if context is None else context.count_mask
    if count is None or settings.in_loss:  # an in-loss mask: token-mean only, its count rescaled by _in_loss_mask
        if count is None and settings.count_only_rule and loss_agg_mode in PER_SEQUENCE_COUNT_MODES:
            raise RuntimeError(
                f"loss_agg_mode={loss_agg_mode} divides each sequence by its token count, which this micro-batch's "
                "loss_mask holds but no loss wrapper handed over: the STAPO trainer's (trainer.v1.trainer_mode=stapo)"
            )
        return mask
    if count.shape != mask.shape:
        raise RuntimeError(f"loss_mask padded to {tuple(count.shape)}, response_mask to {tuple(mask.shape)}")
    return mask | count  # a summed token is always counted


def _in_loss_mask(
    settings: MaskSettings, log_prob, advantages, response_mask
) -> tuple[torch.Tensor, float, torch.Tensor | None]:
    """``source: current``: the kept tokens of this micro-batch, the factor to its kept-token mean and a weighted
    entry's weights."""
    context = _UPDATE_CONTEXT.get()
    if context is None:
        raise RuntimeError(
            f"policy_loss.token_mask={settings.token_mask} with source=current needs the STAPO trainer "
            "(trainer.v1.trainer_mode=stapo, set by conf/algo/*.yaml), which installs the loss wrapper that "
            "hands the update's entropy to the loss"
        )
    if context.entropy is None:
        raise RuntimeError(
            "policy_loss.source=current needs the update forward's entropy: set "
            "actor_rollout_ref.actor.calculate_entropy=true"
        )
    built = build_token_mask(
        MaskInputs(response_mask, advantages, log_prob.detach(), context.entropy, context.dp_group), settings
    )
    # one collective for every count: DP-global totals of this micro-batch
    totals = group_totals(get_token_mask(settings.token_mask), built.counts, context.dp_group, log_prob.device)
    context.report.update(totals)
    for name, value in built.stats.items():  # thresholds are DP-global already; a mean over micro-batches
        defined = value == value
        context.report[name] = value if defined else 0.0
        context.report[name + DEFINED_SUFFIX] = float(defined)
    keep = response_mask & ~built.drop_response
    # verl divides by the mini-batch's response-token count; scale this micro-batch to its kept count
    kept = totals["num_loss_tokens_expected"]
    scale = totals["num_response_tokens"] / kept if kept > 0 else 1.0
    return keep, scale, built.weight


def clip_bounds(config) -> tuple[float, float]:
    """``(clip_ratio_low, clip_ratio_high)``, each falling back to ``clip_ratio`` when unset (verl's rule)."""
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return low, high


def _loss_settings(config) -> MaskSettings:
    """The mask settings of a registered loss's config, after refusing a mask configured but never folded."""
    assert config is not None, "verl passes the actor config to registered policy losses"
    settings = mask_settings(config)
    refuse_unfolded_mask(settings)
    return settings


def _kept_loss(
    pg_losses: torch.Tensor,
    mask: torch.Tensor,
    settings: MaskSettings,
    loss_agg_mode: str,
    config,
    scale: float | None,
    **inputs: torch.Tensor | None,
) -> torch.Tensor:
    """The micro-batch's loss from per-token losses already 0 outside ``mask``, made robust as every masked
    objective (``masked_clip``, ``dcpo``) is (docs/algorithm.md section 6): an exact zero without a kept token;
    otherwise verl's ``agg_loss`` over the tokens counted (section 3), times ``scale`` (an in-loss mask's rescale
    to its kept count; None: none); a non-finite loss is logged with the non-finite counts of ``inputs``
    (``log_prob`` among them) and replaced by a NaN-gradient one, which refuses the update on every rank."""
    if not mask.any():
        loss = pg_losses.sum() * 0.0  # nothing to learn here: keeps the graph, exact zero gradient
    else:
        count = _count_mask(settings, mask, loss_agg_mode)
        loss = agg_loss(loss_mat=pg_losses, loss_mask=count, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
        if scale is not None:
            loss = loss * scale
    if not torch.isfinite(loss):
        logger.warning(nonfinite_report(loss, mask, **inputs))
        loss = nan_gradient_loss(inputs["log_prob"], mask)
    return loss


def _clip_metrics(flags: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """verl's three clipped-objective metrics over the kept tokens, from the flags of
    ``stapo.algorithm.loss.ratio_clipped_pg_losses`` (``masked_clip``'s and ``dcpo``'s)."""
    return {
        "actor/pg_clipfrac": masked_mean(flags["clipped"].float(), mask).item(),
        "actor/ppo_kl": masked_mean(-flags["log_ratio"], mask).item(),
        "actor/pg_clipfrac_lower": masked_mean(flags["dual_clipped"].float(), mask).item(),
    }


@register_policy_loss(LOSS_NAME)
def compute_policy_loss_masked_clip(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The clipped objective over the kept tokens (docs/algorithm.md section 3), verl's three metrics."""
    settings = _loss_settings(config)
    mask, scale, token_weight = response_mask.bool(), 1.0, _folded_weight(settings)
    if settings.in_loss:
        mask, scale, token_weight = _in_loss_mask(settings, log_prob, advantages, mask)
    weights = rollout_is_weights
    if token_weight is not None:  # both factors multiply the per-token loss (docs/algorithm.md section 7)
        token_weight = token_weight.to(log_prob.dtype)
        weights = token_weight if weights is None else weights * token_weight
    clip_low, clip_high = clip_bounds(config)
    clip_c = config.clip_ratio_c  # verl's ActorConfig always has it (its own default: 3.0)
    pg_losses, flags = masked_pg_losses(old_log_prob, log_prob, advantages, mask, clip_low, clip_high, clip_c, weights)
    loss = _kept_loss(
        pg_losses, mask, settings, loss_agg_mode, config, scale,
        log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, rollout_is_weights=rollout_is_weights,
    )
    return loss, _clip_metrics(flags, mask)


@register_policy_loss(GMPO_LOSS_NAME)
def compute_policy_loss_gmpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GMPO (``stapo.algorithm.loss.geo_mean_seq_losses``) averaged over the responses of the whole mini-batch.

    verl 0.9.1's ``geo_mean`` takes a plain mean over each micro-batch's responses and ignores
    ``global_batch_info``; its FSDP engine backpropagates every micro-batch's loss unscaled, so the
    mini-batch gradient grows with the number of micro-batches and, with dynamic batch size, each
    response weighs 1 / the size of its micro-batch. Here each response's loss is divided by the
    mini-batch's response count (DP-global, times ``dp_size`` for FSDP's gradient average), the
    convention of verl's ``seq-mean-*`` modes: the same gradient however the mini-batch is split.
    ``loss_agg_mode`` is not read (GMPO's objective is a mean over responses); a token mask folded
    into ``response_mask`` applies as for any loss.
    """
    _loss_settings(config)
    mask = response_mask.bool()
    clip_low, clip_high = clip_bounds(config)
    seq_losses, flags = geo_mean_seq_losses(
        old_log_prob, log_prob, advantages, mask, clip_low, clip_high, rollout_is_weights
    )
    info = config.global_batch_info
    dp_size = info.get("dp_size", 1) or 1
    responses = info.get("global_batch_size", None)
    if responses is None:  # called outside verl's engine (one process, the micro-batch is the batch)
        responses = mask.shape[0]
    loss = seq_losses.sum() / responses * dp_size
    clipped = flags["clipped"]
    metrics = {
        "actor/pg_clipfrac": masked_mean((clipped & flags["positive"]).float(), mask).item(),
        "actor/ppo_kl": masked_mean(-flags["log_ratio"], mask).item(),
        "actor/pg_clipfrac_lower": masked_mean((clipped & ~flags["positive"]).float(), mask).item(),
    }
    return loss, metrics


@register_policy_loss(DCPO_LOSS_NAME)
def compute_policy_loss_dcpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DCPO (arXiv 2509.02333; ``stapo.algorithm.dcpo.dcpo_pg_losses``): PPO with per-token clip bounds from the old
    probability, ``clip_ratio_low`` / ``clip_ratio_high`` as its eps, verl's dual clip, aggregated by ``agg_loss``
    over the mini-batch as ``masked_clip`` (the folded mask, its count, the exact zero of an empty micro-batch and
    the refusal of a non-finite loss are the same). Reports the mean bounds over the kept tokens and the share
    of kept tokens whose ratio left them (``actor/dcpo/*``). A weighted token mask is refused before Ray
    (``stapo/verl_plugin/preflight/run_checks.py``): its weights reach ``masked_clip`` only."""
    settings = _loss_settings(config)
    if settings.in_loss:  # refused before Ray too (run_checks): only masked_clip builds a mask in the loss
        raise RuntimeError(f"policy_loss.source=current builds the mask inside {LOSS_NAME} only, not {DCPO_LOSS_NAME}")
    mask = response_mask.bool()
    eps_low, eps_high = clip_bounds(config)
    pg_losses, flags = dcpo_pg_losses(
        old_log_prob, log_prob, advantages, mask, eps_low, eps_high, config.clip_ratio_c, rollout_is_weights
    )
    loss = _kept_loss(
        pg_losses, mask, settings, loss_agg_mode, config, None,
        log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, rollout_is_weights=rollout_is_weights,
    )
    ratio = torch.exp(flags["log_ratio"].detach())
    outside = (ratio < flags["low"]) | (ratio > flags["high"])
    metrics = {
        **_clip_metrics(flags, mask),
        DCPO_METRIC_PREFIX + "low_bound_mean": masked_mean(flags["low"], mask).item(),
        DCPO_METRIC_PREFIX + "high_bound_mean": masked_mean(flags["high"], mask).item(),
        DCPO_METRIC_PREFIX + "outside_bounds_frac": masked_mean(outside.float(), mask).item(),
    }
    return loss, metrics
