"""STAPO's entries in verl's policy-loss registry and the actor-side loss wrapper.

verl calls a registered loss with (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
config, rollout_is_weights) only: no entropy, no DP group, no batch fields. ``STAPOLossFn`` wraps
verl's own ``ppo_loss`` (installed in the actor workers with ``set_loss_fn`` by the STAPO trainer)
and hands those three things to the registered loss through a context variable, so verl's KL,
entropy-bonus and metric code keeps running unchanged.

- ``source: old``: the trainer already folded the S2T mask into ``response_mask`` and ``loss_mask``;
  the loss is the plain clipped objective and verl's token count is the valid-token count.
- ``source: current``: the loss detects on the current forward's log-probs and entropy, with the
  entropy threshold taken over the micro-batch's candidates of every DP rank, and rescales the
  micro-batch by its DP-global valid fraction (error of the overall normalisation bounded by the
  masked fraction, about 1e-4).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.utils import tensordict_utils as tu
from verl.utils.torch_functional import masked_mean
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from stapo.loss import clipped_pg_losses, nonfinite_report, outside_mask_zeroed
from stapo.quantile import all_reduce_sum
from stapo.s2t import detect_spurious, s2t_diagnostics

METRIC_PREFIX = "actor/stapo/"
# non-tensor key the STAPO trainer sets on the update batch once it has folded the mask
MASK_FOLDED_KEY = "stapo_mask_folded"


@dataclass(frozen=True)
class UpdateContext:
    """What the registered loss needs beyond verl's arguments, for the micro-batch in flight."""

    entropy: torch.Tensor | None
    dp_group: dist.ProcessGroup | None
    mask_folded: bool


_UPDATE_CONTEXT: contextvars.ContextVar[UpdateContext | None] = contextvars.ContextVar(
    "stapo_update_context", default=None
)


class STAPOLossFn:
    """Drop-in for ``partial(ppo_loss, config=actor_config)`` that exposes the update context."""

    def __init__(self, actor_config):
        self.config = actor_config

    def __call__(self, model_output, data, dp_group=None):
        raw_entropy = model_output.get("entropy", None)
        entropy = None if raw_entropy is None else no_padding_2_padding(raw_entropy, data)
        context = UpdateContext(
            entropy=entropy,
            dp_group=dp_group,
            mask_folded=bool(tu.get_non_tensor_data(data=data, key=MASK_FOLDED_KEY, default=False)),
        )
        if raw_entropy is not None and isinstance(model_output, dict):
            # the detection sees the raw entropy (non-finite values are excluded there and counted);
            # verl's entropy term gets it with those zeroed, else one NaN token (a metric when
            # entropy_coeff=0) would turn the whole micro-batch's loss into NaN
            model_output = {**model_output, "entropy": _finite_or_zero(raw_entropy)}
        token = _UPDATE_CONTEXT.set(context)
        try:
            loss, metrics = ppo_loss(self.config, model_output, data, dp_group)
        finally:
            _UPDATE_CONTEXT.reset(token)
        if not torch.isfinite(loss):  # e.g. a NaN reference log-prob in verl's KL term
            raise FloatingPointError(
                f"actor loss is {float(loss.detach())} on this micro-batch although the policy-gradient term is "
                f"finite: verl's KL / entropy terms are not (metrics: {_finite_floats(metrics)}); the update is refused"
            )
        return loss, metrics


def _finite_or_zero(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (dense or jagged nested) with non-finite values set to 0; the same object when all are finite."""
    if tensor.is_nested and tensor.layout != torch.jagged:
        return tensor  # verl hands jagged tensors over; anything else is left as verl made it
    values = tensor.values() if tensor.is_nested else tensor
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return tensor
    clean = torch.where(finite, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return torch.nested.nested_tensor_from_jagged(clean, tensor.offsets()) if tensor.is_nested else clean


def _finite_floats(metrics) -> dict:
    out = {}
    for key, value in metrics.items():
        value = getattr(value, "values", value)  # verl's Metric keeps a list
        value = value[0] if isinstance(value, list) and len(value) == 1 else value
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = float(value.detach())
        if isinstance(value, float):
            out[key] = value
    return out


def _require_context(loss_mode: str) -> UpdateContext:
    context = _UPDATE_CONTEXT.get()
    if context is None:
        raise RuntimeError(
            f"policy_loss.loss_mode={loss_mode} needs the STAPO trainer (trainer.v1.trainer_mode=stapo, set by "
            "conf/algo/*.yaml), which builds the token mask and installs the STAPO loss wrapper in the actor "
            "workers; with verl's stock trainer the mask would silently not be applied"
        )
    return context


def _clipped_loss(old_log_prob, log_prob, advantages, mask, loss_agg_mode, config, rollout_is_weights):
    """verl's vanilla objective (clip-higher, dual clip) over ``mask``, with its three metrics.

    Values outside ``mask`` are zeroed before use (a NaN at a padded or silenced position would
    otherwise reach the gradient through 0 * NaN); a micro-batch without any loss token contributes
    an exact zero (verl's token-mean would divide 0 by a global count of 0 when a whole mini-batch
    is empty); a non-finite loss on real tokens fails the step with the counts.
    """
    mask = mask.bool()
    inputs = (old_log_prob, log_prob, advantages, rollout_is_weights)
    old_in, log_in, adv_in, weights_in = outside_mask_zeroed(mask, *inputs)
    pg_losses, flags = clipped_pg_losses(
        old_in,
        log_in,
        adv_in,
        clip_ratio_low=config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio,
        clip_ratio_high=config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio,
        clip_ratio_c=config.get("clip_ratio_c", 3.0),
    )
    if weights_in is not None:
        pg_losses = pg_losses * weights_in
    if not mask.any():
        loss = pg_losses.sum() * 0.0  # nothing to learn from here; keeps the graph, exact zero gradient
    else:
        loss = agg_loss(loss_mat=pg_losses, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)
    if not torch.isfinite(loss):
        raise FloatingPointError(
            nonfinite_report(
                loss, mask, log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages,
                rollout_is_weights=rollout_is_weights,
            )
        )
    metrics = {
        "actor/pg_clipfrac": masked_mean(flags["clipped"].float(), mask).item(),
        "actor/ppo_kl": masked_mean(-flags["log_ratio"], mask).item(),
        "actor/pg_clipfrac_lower": masked_mean(flags["dual_clipped"].float(), mask).item(),
    }
    return loss, metrics


@register_policy_loss("stapo")
def compute_policy_loss_stapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The STAPO policy loss (spec section 3) for verl's actor."""
    assert config is not None, "verl passes the actor config to registered policy losses"
    policy_loss = config.policy_loss
    context = _require_context("stapo")
    if policy_loss.get("source", "old") == "old":
        if not context.mask_folded:
            raise RuntimeError(
                "policy_loss.source=old but the update batch carries no folded S2T mask: run with "
                "trainer.v1.trainer_mode=stapo (the STAPO trainer builds the mask after advantages)"
            )
        return _clipped_loss(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
        )
    if context.entropy is None:
        raise RuntimeError(
            "policy_loss.source=current needs the update forward's entropy: set "
            "actor_rollout_ref.actor.calculate_entropy=true"
        )
    tau_p = policy_loss.get("tau_p", 0.002)
    detection = detect_spurious(
        log_prob.detach(),
        context.entropy.detach(),
        advantages,
        response_mask,
        tau_p=tau_p,
        entropy_quantile=policy_loss.get("entropy_quantile", 0.75),
        group=context.dp_group,
    )
    valid = response_mask.bool() & ~detection.spurious
    counts = all_reduce_sum(
        torch.tensor([response_mask.sum(), valid.sum()], dtype=torch.float64, device=log_prob.device),
        context.dp_group,
    )
    loss, metrics = _clipped_loss(old_log_prob, log_prob, advantages, valid, loss_agg_mode, config, rollout_is_weights)
    # verl divides by the mini-batch's response-token count; scale this micro-batch to valid tokens
    if counts[1] > 0:
        loss = loss * (counts[0] / counts[1]).to(loss.dtype)
    diagnostics = s2t_diagnostics(
        detection, log_prob.detach(), context.entropy.detach(), advantages, response_mask, tau_p
    )
    metrics.update({METRIC_PREFIX + key: value for key, value in diagnostics.items()})
    return loss, metrics


@register_policy_loss("entropy20")
def compute_policy_loss_entropy20(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The 20-Entropy baseline: the clipped objective over the kept tokens the trainer folded in."""
    assert config is not None, "verl passes the actor config to registered policy losses"
    if not _require_context("entropy20").mask_folded:
        raise RuntimeError(
            "loss_mode=entropy20 but the update batch carries no folded entropy mask: run with "
            "trainer.v1.trainer_mode=stapo"
        )
    return _clipped_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
