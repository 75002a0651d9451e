"""The one policy-gradient objective every masking algorithm trains with, as pure functions.

docs/algorithm.md section 3:  per token, ``min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)`` with
verl's dual clip (for A < 0 the per-token loss is capped at ``-A * clip_ratio_c``), summed over the
tokens a mask keeps and divided by the token count the mask leaves (the aggregation itself is
verl's ``agg_loss``, applied by the glue in ``stapo/verl_plugin/training/losses.py``).

GRPO, JustRL, STAPO, 20-Entropy, DAPO and Dr.GRPO all run these functions; they differ only in the
token mask (``stapo.algorithm.masks``), the clip constants and the aggregation mode. Shapes are
``(batch, response_len)``; ``old_log_prob`` and ``advantages`` are data, only ``log_prob`` carries
gradient.
"""

from __future__ import annotations

import torch

from stapo.algorithm.validation import STAPOConfigError

LOG_RATIO_LIMIT = 20.0  # same clamp as verl, so exp() cannot overflow on a stale old_log_prob

# verl 0.9.1's aggregation modes (``agg_loss``, ``ActorConfig``'s list)
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# the modes that divide each sequence by its own token count, which ``agg_loss`` takes from the mask it is handed
PER_SEQUENCE_COUNT_MODES = ("seq-mean-token-mean",)
# losses that average over each response's summed tokens whatever ``loss_agg_mode`` says (sapo hard-codes
# seq-mean-token-mean; gspo, geo_mean and gmpo take a per-response mean of the token log-ratios)
SEQUENCE_LEVEL_LOSSES = ("gspo", "sapo", "geo_mean", "gmpo")
MASKED_CLIP = "masked_clip"  # stapo.verl_plugin.training.losses.LOSS_NAME, without importing verl here
DCPO = "dcpo"  # stapo.verl_plugin.training.losses.DCPO_LOSS_NAME, likewise
# the losses that hand ``agg_loss`` the count (``_kept_loss`` in stapo/verl_plugin/training/losses.py): exact with a
# rule under every mode, seq-mean-token-mean included (tests/integration/test_agg_modes.py)
COUNT_MASK_LOSSES = (MASKED_CLIP, DCPO)


def check_aggregation(
    rule: str | None, loss_mode: str, loss_agg_mode: str, regularised: bool, prefix: str = "actor_rollout_ref.actor."
) -> None:
    """Refuse the (rule, loss, mode) pairs that would not train the rule's objective (docs/algorithm.md section 3).

    ``rule`` names the setting that keeps some tokens in the count but out of the sum (Lopti's phases,
    20-Entropy's ``entropy_denominator: all``), None when the sum and the count are one mask (every mode is
    exact then). ``masked_clip`` and ``dcpo`` (COUNT_MASK_LOSSES) hand ``agg_loss`` the count: exact under every
    mode. Refused: a sequence-level loss (its per-response mean runs over the summed tokens only); under
    ``seq-mean-token-mean``, another loss (verl's losses count each sequence over ``response_mask``) and, with
    ``regularised`` (a KL loss or an entropy bonus), ``masked_clip`` and ``dcpo`` too: verl adds those terms
    averaged over each sequence's summed tokens."""
    if rule is None:
        return
    rule = prefix + rule
    if loss_mode in SEQUENCE_LEVEL_LOSSES:
        raise STAPOConfigError(
            f"{prefix}policy_loss.loss_mode={loss_mode} with {rule} must be {MASKED_CLIP} or a token-level loss: "
            f"{loss_mode} averages each response over the tokens it sums, so the tokens counted but not summed "
            "would not be counted"
        )
    hands_count = loss_mode in COUNT_MASK_LOSSES
    if loss_agg_mode in PER_SEQUENCE_COUNT_MODES and (not hands_count or regularised):
        allowed = [mode for mode in LOSS_AGG_MODES if mode not in PER_SEQUENCE_COUNT_MODES]
        why = "verl's KL loss and entropy bonus (on here)" if hands_count else f"verl's {loss_mode} loss"
        other = "" if hands_count else (
            f"; or set {prefix}policy_loss.loss_mode to one of {list(COUNT_MASK_LOSSES)}, which hand verl the count"
        )
        raise STAPOConfigError(
            f"{prefix}loss_agg_mode={loss_agg_mode} with {rule} must be one of {allowed}: {why} would divide "
            f"each sequence by the tokens it sums, not by those it counts (another objective){other}"
        )


def clipped_pg_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 10.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO losses with clip-higher and dual clip, plus the boolean masks of which clip bit.

    Returns ``(pg_losses, flags)`` where flags hold ``clipped`` (the clipped branch is the larger
    loss), ``dual_clipped`` (A < 0 and the dual-clip cap is active) and ``log_ratio``.
    """
    low, high = 1.0 - clip_ratio_low, 1.0 + clip_ratio_high
    return ratio_clipped_pg_losses(old_log_prob, log_prob, advantages, low, high, clip_ratio_c)


def ratio_clipped_pg_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    low: float | torch.Tensor,
    high: float | torch.Tensor,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token ``max(-A r, -A clip(r, low, high))`` with verl's dual clip (capped at ``-A c`` for A < 0), and
    the flags of :func:`clipped_pg_losses`.

    ``low`` and ``high`` bound the ratio itself: PPO's ``1 - eps_low`` and ``1 + eps_high`` (floats, section 3
    of docs/algorithm.md) or DCPO's per-token bounds (tensors, section 7). One piece of arithmetic for both, so
    the two objectives differ only in their bounds.
    """
    if clip_ratio_c <= 1.0:
        raise STAPOConfigError(
            f"clip_ratio_c must be > 1 (dual-clip constant, paper and DCPO's script: 10), got {clip_ratio_c}"
        )
    old_log_prob, advantages = old_log_prob.detach(), advantages.detach()
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, low, high)
    ppo = torch.maximum(unclipped, clipped)
    cap = -advantages * clip_ratio_c
    pg_losses = torch.where(advantages < 0, torch.minimum(ppo, cap), ppo)
    flags = {
        "clipped": clipped > unclipped,
        "dual_clipped": (advantages < 0) & (ppo > cap),
        "log_ratio": log_ratio,
    }
    return pg_losses, flags


def outside_mask_zeroed(mask: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """``tensors`` with every position outside ``mask`` set to 0 (``None`` passes through).

    Why: a loss that multiplies by the mask afterwards still has NaN * 0 = NaN in its value and, in
    the backward pass, 0 * NaN = NaN in the gradient of the policy, so a non-finite value at a
    padded or silenced position (a stale old log-prob, an empty response) would poison the update
    without any token of the loss being non-finite. ``torch.where`` cuts both paths.
    """
    mask = mask.bool()
    zero = torch.zeros((), dtype=torch.float64)
    return [None if t is None else torch.where(mask, t, zero.to(dtype=t.dtype, device=t.device)) for t in tensors]


def masked_pg_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped losses over ``mask`` (0 elsewhere, with no path for a NaN outside it),
    times the optional per-token ``weights`` (verl's rollout importance-sampling weights)."""
    old_in, log_in, adv_in, weights_in = outside_mask_zeroed(mask, old_log_prob, log_prob, advantages, weights)
    pg_losses, flags = clipped_pg_losses(old_in, log_in, adv_in, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    return weighted_in_mask(pg_losses, weights_in, mask), flags


def weighted_in_mask(pg_losses: torch.Tensor, weights: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Per-token losses times the optional ``weights`` (already zeroed outside ``mask``), then 0 outside ``mask``:
    the last step of every masked per-token objective (``masked_clip``'s and DCPO's), in one order for both."""
    if weights is not None:
        pg_losses = pg_losses * weights
    return pg_losses * mask.to(pg_losses.dtype)


def nan_gradient_loss(log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A NaN loss whose gradient is NaN on every kept token: the update is refused, not desynchronised.

    Why not raise: under FSDP the other ranks are already inside the backward's collectives, so a
    rank that raises leaves them hanging. A NaN gradient instead makes the DP-global gradient norm
    NaN on every rank, and verl's optimizer step then skips the update on all of them (its stock
    handling of a non-finite gradient norm); the caller counts the refusal in a metric.
    """
    (log_in,) = outside_mask_zeroed(mask, log_prob)
    return log_in.sum() * float("nan")


def nonfinite_report(loss: torch.Tensor, mask: torch.Tensor, **tensors: torch.Tensor | None) -> str:
    """What a refused micro-batch held: how many loss tokens of each input are not finite."""
    mask = mask.bool()
    counts = {name: int((mask & ~torch.isfinite(t)).sum()) for name, t in tensors.items() if t is not None}
    return (
        f"policy loss is {float(loss.detach())} on this micro-batch: non-finite values among its {int(mask.sum())} "
        f"loss tokens: {counts}; the update of this mini-batch is skipped on every rank (check the reward, the "
        "advantage estimator and the rollout/actor log-probs of this batch)"
    )


def geo_mean_seq_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO's per-response losses (docs/algorithm.md section 7): ``-A_i * exp(mean_t clip(log rho_t))``.

    Token log-ratios are clipped in log space to ``[-clip_ratio_low, clip_ratio_high]``, sign-aware
    (for ``A > 0`` only the upper bound binds, for ``A < 0`` only the lower, as PPO's min), and their
    mean over the response's kept tokens gives the geometric mean of the ratios. The advantage is the
    response's mean token advantage; the optional rollout weights enter as their geometric mean.
    Returns ``(seq_losses (batch,), flags)``; a response without kept tokens has loss 0. How the
    responses are averaged (over the whole mini-batch, not the micro-batch) is the caller's.
    """
    mask = mask.bool()
    old_in, log_in, adv_in, weights_in = outside_mask_zeroed(mask, old_log_prob, log_prob, advantages, weights)
    log_ratio = torch.clamp(log_in - old_in.detach(), -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    clamped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    sign = torch.sign(adv_in.detach())
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clamped)
    maskf = mask.to(log_ratio.dtype)
    tokens = maskf.sum(dim=-1)
    per_token = 1.0 / tokens.clamp(min=1.0)  # a response without kept tokens sums zeros: its loss is 0 either way
    seq_ratio = torch.exp((clipped_log_ratio * maskf).sum(dim=-1) * per_token)
    seq_advantage = (adv_in.detach() * maskf).sum(dim=-1) * per_token
    seq_losses = -seq_advantage * seq_ratio
    if weights_in is not None:
        log_weights = torch.log(torch.where(mask, weights_in, torch.ones_like(weights_in)))
        seq_losses = seq_losses * torch.exp((log_weights * maskf).sum(dim=-1) * per_token)
    flags = {"clipped": mask & (log_ratio != clamped), "log_ratio": log_ratio, "positive": adv_in > 0}
    return seq_losses, flags
