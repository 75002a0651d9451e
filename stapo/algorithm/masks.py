"""The token-mask registry: which response tokens an algorithm drops from the policy gradient.

Every algorithm of the bench trains with the same objective (``stapo.algorithm.loss``); they differ only in
the entry of this registry they name (``policy_loss.token_mask``) and its settings. An entry maps
the tensors of the whole batch (old-policy pass, or the current micro-batch for ``source:
current``) to a :class:`TokenMask`:

- ``drop_response``: tokens removed from the policy-gradient sum (the numerator);
- ``drop_count``: tokens removed from the token count the loss divides by (the denominator). STAPO
  drops both (renormalisation over the remaining tokens, docs/algorithm.md section 3); the original
  20-Entropy drops only the former (its denominator counts every response token);
- ``counts``: additive statistics (token counts) that can be summed over micro-batches and ranks;
- ``stats``: non-additive statistics (thresholds, percentiles), NaN where undefined;
- ``weight``: an optional float per token (``None``: all ones), multiplying the per-token policy-gradient
  loss of the tokens kept. A 0/1 mask is the special case; TACO and Advantage Reweighting
  (``stapo.algorithm.token_weights``) drop nothing and weight every token instead, each weighted token staying in the
  count (docs/algorithm.md section 7).

Ratios (``mask_ratio`` ...) are derived from the counts by :func:`finalize_metrics`, so a ratio over
several micro-batches is always a ratio of sums. Pure torch, no verl.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist

from stapo.algorithm.gradnorm import grad_norm_sq_lower_bound
from stapo.algorithm.quantile import (
    all_reduce_sum,
    dp_ranks,
    global_quantile,
    group_masked_quantiles,
    less_than,
    masked_quantiles,
)
from stapo.algorithm.s2t import broadcast_advantages, detect_spurious
from stapo.algorithm.stare import (
    STARE_M,
    STARE_TARGET_ENTROPY,
    STARE_TOP_RATIO,
    STARE_VARIANT,
    STARE_VARIANTS,
    STARE_W,
    stare_weight,
)
from stapo.algorithm.steer import STEER_LAMBDA_MIN, steer_weight
from stapo.algorithm.token_weights import advrew_weight, taco_weight, weight_metrics
from stapo.algorithm.validation import (
    ADVREW_ALPHA,
    ENTROPY20_TOP_FRACTION,
    LOPTI_ETA,
    PAPER_ENTROPY_QUANTILE,
    PAPER_TAU_P,
    TACO_ALPHA,
    TACO_LAMBDA,
    STAPOConfigError,
    check_choice,
    check_entropy_quantile,
    check_interval,
    check_tau_p,
    check_top_fraction,
)

SOURCES = ("old", "current")
ENTROPY_DENOMINATORS = ("all", "kept")
ENTROPY_PERCENTILES = (0.5, 0.8, 0.95)
# where a batch threshold (S2T's tau_h, 20-Entropy's cut) is taken: over the whole step's batch, or over
# each PPO mini-batch on its own (the paper's scope, docs/algorithm.md section 4)
THRESHOLD_SCOPES = ("step", "mini_batch")


@dataclass(frozen=True)
class MaskSettings:
    """The settings of every registered mask, with their defaults (the one place they are written).

    Args:
        token_mask: registry entry (``none``, ``stapo``, ``entropy20``, ...).
        source: ``old`` (built once per step from the old-policy pass, folded into the loss mask)
            or ``current`` (built inside the loss from the update forward; only entries that allow it).
        tau_p: S2T probability threshold, strict ``p < tau_p``, in (0, 1); the paper's value.
        entropy_quantile: S2T's q, the quantile of the candidates' entropies that gives tau_h, in (0, 1].
        entropy_top_fraction: share of highest-entropy tokens 20-Entropy keeps, in (0, 1].
        entropy_denominator: 20-Entropy's denominator, ``all`` response tokens (the original) or ``kept``.
        threshold_scope: the tokens a batch threshold is taken over, ``step`` (the step's whole batch) or
            ``mini_batch`` (each PPO mini-batch over every DP rank, as the paper). Read with ``source: old``;
            with ``source: current`` the mask is built per micro-batch inside the loss, whatever this says.
        taco_alpha: TACO's alpha, in (0, 1): a token is in the tail when ``-log p - H > log(1/alpha)``.
        taco_lambda: TACO's lambda, in [0, 1]: the largest share of a tail token's loss taken away.
        advrew_alpha: Advantage Reweighting's alpha, in [0, 1]: ``w = alpha p + 1 - alpha``.
        lopti: Lopti (low-probability token isolation, ``stapo.algorithm.lopti``): the update runs twice per step, first
            over the tokens with old-policy ``p < lopti_eta``, then over the others; combines with any entry.
        lopti_eta: Lopti's probability threshold, in (0, 1).
        stare_variant, stare_top_ratio, stare_w, stare_m, stare_target_entropy: STARE's variant (``O1``: only
            ``L+`` weighted; ``C2``: ``L-`` too), share ``P`` in [0, 1] of each advantage sign's tokens by
            surprisal, weight ``W`` >= 1 of ``L+``, weight ``M`` in [0, 1] of ``L-``, and the entropy below
            which the weights apply (``stapo.algorithm.stare``).
        steer_lambda_min: STEER's smallest weight, in (0, 1] (``stapo.algorithm.steer``).
    """

    token_mask: str = "none"
    source: str = "old"
    tau_p: float = PAPER_TAU_P
    entropy_quantile: float = PAPER_ENTROPY_QUANTILE
    entropy_top_fraction: float = ENTROPY20_TOP_FRACTION
    entropy_denominator: str = "all"
    threshold_scope: str = "step"
    taco_alpha: float = TACO_ALPHA
    taco_lambda: float = TACO_LAMBDA
    advrew_alpha: float = ADVREW_ALPHA
    lopti: bool = False
    lopti_eta: float = LOPTI_ETA
    stare_variant: str = STARE_VARIANT
    stare_top_ratio: float = STARE_TOP_RATIO
    stare_w: float = STARE_W
    stare_m: float = STARE_M
    stare_target_entropy: float = STARE_TARGET_ENTROPY
    steer_lambda_min: float = STEER_LAMBDA_MIN

    def validate(self, prefix: str = "") -> None:
        """Range checks naming the key (``prefix`` is the Hydra path of the section)."""
        spec = get_token_mask(self.token_mask, prefix)
        check_choice("source", self.source, SOURCES, prefix)
        if self.source not in spec.sources:
            raise STAPOConfigError(
                f"{prefix}source={self.source!r} is not available for {prefix}token_mask={self.token_mask!r}, "
                f"which can be built from: {list(spec.sources)}"
            )
        check_tau_p(self.tau_p, prefix)
        check_entropy_quantile(self.entropy_quantile, prefix)
        check_top_fraction(self.entropy_top_fraction, prefix)
        check_choice("entropy_denominator", self.entropy_denominator, ENTROPY_DENOMINATORS, prefix)
        check_choice("threshold_scope", self.threshold_scope, THRESHOLD_SCOPES, prefix)
        check_interval("taco_alpha", self.taco_alpha, 0.0, 1.0, "", f"TACO: {TACO_ALPHA}", prefix)
        check_interval("taco_lambda", self.taco_lambda, 0.0, 1.0, "both", f"TACO: {TACO_LAMBDA}", prefix)
        check_interval("advrew_alpha", self.advrew_alpha, 0.0, 1.0, "both", f"arXiv 2505.12929: {ADVREW_ALPHA}",
                       prefix)
        if not isinstance(self.lopti, bool):
            raise STAPOConfigError(f"{prefix}lopti must be true or false, got {self.lopti!r}")
        check_interval("lopti_eta", self.lopti_eta, 0.0, 1.0, "", f"arXiv 2505.12929: {LOPTI_ETA}", prefix)
        check_choice("stare_variant", self.stare_variant, STARE_VARIANTS, prefix)
        stare = "STARE, arXiv 2606.19236"
        check_interval("stare_top_ratio", self.stare_top_ratio, 0.0, 1.0, "both", f"{stare}: {STARE_TOP_RATIO}",
                       prefix)
        check_interval("stare_w", self.stare_w, 1.0, math.inf, "low", f"{stare}: {STARE_W}", prefix)
        check_interval("stare_m", self.stare_m, 0.0, 1.0, "both", f"{stare}: {STARE_M}", prefix)
        check_interval("stare_target_entropy", self.stare_target_entropy, 0.0, math.inf, "low",
                       f"{stare}: {STARE_TARGET_ENTROPY}", prefix)
        check_interval("steer_lambda_min", self.steer_lambda_min, 0.0, 1.0, "high",
                       f"STEER, arXiv 2510.10150: {STEER_LAMBDA_MIN}", prefix)
        if self.lopti and self.source != "old":
            raise STAPOConfigError(
                f"{prefix}lopti=true splits the tokens by the old-policy pass and updates each part against it, "
                f"which needs {prefix}source=old (got {self.source!r}): a mask built inside the loss rescales each "
                "micro-batch to its kept tokens, which the split would miscount"
            )

    @classmethod
    def from_mapping(cls, mapping) -> MaskSettings:
        """The settings found in a mapping (e.g. a ``policy_loss`` section); absent keys take the defaults."""
        return cls(**{f.name: mapping.get(f.name, f.default) for f in fields(cls)})

    @property
    def folded(self) -> bool:
        """Whether the actor workers fold this mask into the loss mask before the update (``source: old``)."""
        return self.token_mask != "none" and self.source == "old"

    @property
    def count_only_rule(self) -> str | None:
        """The setting that keeps some response tokens in the loss's count but out of its sum (Lopti's other
        phase, 20-Entropy's ``entropy_denominator: all``), None when the sum and the count are one mask;
        ``stapo.algorithm.loss.check_aggregation`` says under which aggregation modes that is exact."""
        if self.lopti:
            return "policy_loss.lopti=true"
        if self.token_mask == "entropy20" and self.entropy_denominator == "all":
            return "policy_loss.token_mask=entropy20 and entropy_denominator=all"
        return None

    @property
    def in_loss(self) -> bool:
        """Whether the loss builds this mask from the update forward (``source: current``)."""
        return self.token_mask != "none" and self.source == "current"


@dataclass(frozen=True)
class MaskInputs:
    """Tensors a mask may read, padded ``(batch, response_len)``; ``group`` widens thresholds to all ranks."""

    response_mask: torch.Tensor
    advantages: torch.Tensor
    log_prob: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    group: dist.ProcessGroup | None = None
    # flat tensors (one value per token of verl's jagged rows, row-major): the rows' token bounds, from 0, so a
    # rule that reads rows (a custom one, stapo.algorithm.custom_rule) sees ``(batch, response_len)``; None: padded
    offsets: torch.Tensor | None = None


@dataclass(frozen=True)
class TokenMask:
    drop_response: torch.Tensor  # bool, True = out of the policy-gradient sum
    drop_count: torch.Tensor  # bool, True = out of the token count the loss divides by
    counts: dict[str, float] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    weight: torch.Tensor | None = None  # float, the factor of each kept token's loss; None = all ones


MaskFn = Callable[[MaskInputs, MaskSettings], TokenMask]


@dataclass(frozen=True)
class MaskSpec:
    """A registry entry and what it needs: which inputs, which sources, which ratios it reports."""

    name: str
    fn: MaskFn
    needs_log_prob: bool
    needs_entropy: bool
    sources: tuple[str, ...]
    ratios: dict[str, tuple[str, str]]
    # counts the entry already totals over the detection scope (every rank of the group): a caller that
    # sums the other counts over ranks must take these as they are
    scope_counts: tuple[str, ...] = ()
    # returns a weight (stapo.algorithm.token_weights): the loss must receive it, not only the masks
    weighted: bool = False


TOKEN_MASK_REGISTRY: dict[str, MaskSpec] = {}

# ratios every entry reports, (numerator count, denominator count)
COMMON_RATIOS = {
    "drop_ratio": ("num_dropped", "num_response_tokens"),
    "zero_advantage_fraction": ("num_zero_advantage", "num_response_tokens"),
}


def register_token_mask(
    name: str,
    *,
    needs_log_prob: bool = False,
    needs_entropy: bool = False,
    sources: tuple[str, ...] = ("old",),
    ratios: dict[str, tuple[str, str]] | None = None,
    scope_counts: tuple[str, ...] = (),
    weighted: bool = False,
) -> Callable[[MaskFn], MaskFn]:
    """Decorator: register ``fn(inputs, settings) -> TokenMask`` under ``name`` (as verl's loss registry)."""

    def decorator(fn: MaskFn) -> MaskFn:
        if name in TOKEN_MASK_REGISTRY and TOKEN_MASK_REGISTRY[name].fn is not fn:
            raise ValueError(f"token mask {name!r} is already registered")
        TOKEN_MASK_REGISTRY[name] = MaskSpec(
            name, fn, needs_log_prob, needs_entropy, tuple(sources), {**COMMON_RATIOS, **(ratios or {})}, scope_counts,
            weighted,
        )
        return fn

    return decorator


def get_token_mask(name: str, prefix: str = "") -> MaskSpec:
    if name not in TOKEN_MASK_REGISTRY:
        raise STAPOConfigError(f"{prefix}token_mask must be one of {sorted(TOKEN_MASK_REGISTRY)}, got {name!r}")
    return TOKEN_MASK_REGISTRY[name]


def build_token_mask(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
    """Look the entry up, check it has its inputs, build it, and add the counts every entry reports."""
    spec = get_token_mask(settings.token_mask)
    needs = ((spec.needs_log_prob, inputs.log_prob, "log_prob"), (spec.needs_entropy, inputs.entropy, "entropy"))
    for needed, value, key in needs:
        if needed and value is None:
            raise ValueError(f"token_mask={spec.name!r} needs {key}, which the caller did not pass")
        if value is not None and value.shape != inputs.response_mask.shape:
            raise ValueError(
                f"{key} and response_mask must share one shape, got {tuple(value.shape)} and "
                f"{tuple(inputs.response_mask.shape)}"
            )
    advantages = broadcast_advantages(inputs.advantages, inputs.response_mask)
    inputs = MaskInputs(inputs.response_mask.bool(), advantages, inputs.log_prob, inputs.entropy, inputs.group,
                        inputs.offsets)
    with torch.no_grad():
        built = spec.fn(inputs, settings)
        counts = {**common_counts(inputs, built.drop_response, built.drop_count), **built.counts}
    return TokenMask(built.drop_response, built.drop_count, counts, dict(built.stats), built.weight)


def build_token_mask_in_parts(
    inputs: MaskInputs, settings: MaskSettings, part: torch.Tensor, num_parts: int
) -> TokenMask:
    """The mask built on each part of the tokens on its own: part ``k`` is where ``part == k`` (for the paper's
    scope, one PPO mini-batch), and its thresholds are taken over that part of every rank of ``inputs.group``.

    Every rank calls this with the same ``num_parts``; a part that holds none of a rank's tokens is still built
    there, so the rank joins that part's collectives. The entry's counts add up over the parts, the common counts
    are those of the whole input, and a statistic (a threshold, a percentile) is the mean over the parts where it
    is defined (NaN where none is); ``threshold_scopes`` says how many parts there were. A weighted entry's weights
    are stitched from the parts, and its ``min_weight`` is the whole input's.
    """
    if part.shape != inputs.response_mask.shape:
        raise ValueError(f"part and response_mask must share one shape, got {tuple(part.shape)} and "
                         f"{tuple(inputs.response_mask.shape)}")
    mask = inputs.response_mask.bool()
    whole = MaskInputs(mask, broadcast_advantages(inputs.advantages, mask), inputs.log_prob, inputs.entropy,
                       inputs.group)
    drop_response, drop_count = torch.zeros_like(mask), torch.zeros_like(mask)
    weight = None  # a weighted entry's (token-wise) weights, stitched from the parts
    counts: dict[str, float] = {}
    stats: dict[str, list[float]] = {}
    for k in range(num_parts):
        where = part == k
        tensors = (whole.response_mask, whole.advantages, whole.log_prob, whole.entropy)
        sub = MaskInputs(*(None if t is None else t[where] for t in tensors), inputs.group,
                         part_offsets(inputs.offsets, part, k))
        built = build_token_mask(sub, settings)
        drop_response[where], drop_count[where] = built.drop_response, built.drop_count
        if built.weight is not None:
            if weight is None:
                weight = torch.ones(mask.shape, dtype=built.weight.dtype, device=built.weight.device)
            weight[where] = built.weight
        for name, value in built.counts.items():
            counts[name] = counts.get(name, 0.0) + value
        for name, value in built.stats.items():
            stats.setdefault(name, []).append(value)
    counts.update(common_counts(whole, drop_response, drop_count))
    means = {name: _mean_of_defined(values) for name, values in stats.items()}
    if weight is not None:  # the minimum weight of the whole input, not a mean of the parts' minima
        means.update(weight_metrics(weight, mask, whole.advantages, inputs.group)[1])
    return TokenMask(drop_response, drop_count, counts, {**means, "threshold_scopes": float(num_parts)}, weight)


def part_offsets(offsets: torch.Tensor | None, part: torch.Tensor, k: int) -> torch.Tensor | None:
    """The row bounds of part ``k``'s tokens (its rows, whole and in order) in a flat layout with row bounds
    ``offsets``; None for a padded layout. A row without a token belongs to no part."""
    if offsets is None:
        return None
    offsets = offsets.to(part.device)
    lengths = offsets.diff()
    filled = lengths > 0
    lengths = lengths[filled][part[offsets[:-1][filled]] == k]
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def _mean_of_defined(values: list[float]) -> float:
    defined = [value for value in values if not math.isnan(value)]
    return sum(defined) / len(defined) if defined else math.nan

def finalize_metrics(spec: MaskSpec, counts: dict[str, float], stats: dict[str, float]) -> dict[str, float]:
    """Counts, stats and the entry's ratios of counts (0 when the denominator is 0)."""
    metrics = {**counts, **stats}
    for name, (numerator, denominator) in spec.ratios.items():
        total = counts.get(denominator, 0.0)
        metrics[name] = counts.get(numerator, 0.0) / total if total else 0.0
    return metrics


def group_totals(
    spec: MaskSpec, counts: dict[str, float], group: dist.ProcessGroup | None, device: torch.device | str = "cpu"
) -> dict[str, float]:
    """The counts summed over every rank of ``group`` in one collective; the entry's ``scope_counts``
    (already totals over the group, such as the candidates of the shared threshold) are taken as they
    are. ``device`` is where the collective runs (a NCCL group cannot reduce a CPU tensor)."""
    scope = set(spec.scope_counts)
    names = sorted(name for name in counts if name not in scope)
    local = torch.tensor([counts[name] for name in names], dtype=torch.float64, device=device)
    totals = dict(zip(names, all_reduce_sum(local, group).tolist()))
    totals.update({name: counts[name] for name in scope if name in counts})
    return totals


def count(mask: torch.Tensor) -> float:
    """Number of True values (``count_nonzero``: many times faster than ``sum`` on a CPU bool tensor)."""
    return float(torch.count_nonzero(mask))


def common_counts(inputs: MaskInputs, drop_response: torch.Tensor, drop_count: torch.Tensor) -> dict[str, float]:
    """Token counts every entry reports; degenerate inputs are counted, never silently absorbed.

    A non-finite entropy is never ranked nor masked, a non-finite log-prob is never a candidate, a
    non-finite advantage fails the loss; zero advantages (a group with one reward) and empty
    responses (verl's padding samples, instant EOS) are legal but carry no signal.
    """
    mask, advantages = inputs.response_mask, inputs.advantages
    num_tokens = count(mask)
    counts = {
        "num_response_tokens": num_tokens,
        "num_dropped": count(mask & drop_response),
        "num_loss_tokens_expected": count(mask & ~drop_count),
        "num_zero_advantage": count(mask & (advantages == 0)),
        "nonfinite_advantage": count_nonfinite(advantages, mask),
        # a 1-D mask is one response (or the driver's flat batch, whose caller counts its rows)
        "empty_responses": count(~mask.any(dim=-1)) if mask.dim() > 1 else float(num_tokens == 0),
    }
    if inputs.entropy is not None:
        counts["nonfinite_entropy"] = count_nonfinite(inputs.entropy, mask)
    if inputs.log_prob is not None:
        counts["nonfinite_log_prob"] = count_nonfinite(inputs.log_prob, mask)
    return counts


def count_nonfinite(values: torch.Tensor, mask: torch.Tensor) -> float:
    """``count(mask & ~isfinite(values))``. One NaN or infinity anywhere makes the sum of all values
    non-finite, so a finite sum proves the count is 0 in one cheap pass (``isfinite`` is several)."""
    if math.isfinite(float(values.sum())):
        return 0.0
    return count(mask & ~torch.isfinite(values))


def entropy_percentiles(
    entropy: torch.Tensor, mask: torch.Tensor, group: dist.ProcessGroup | None = None
) -> dict[str, float]:
    """p50/p80/p95 of the response tokens' finite entropies over every rank of ``group``, in one pass
    (``group_masked_quantiles``)."""
    values = group_masked_quantiles(entropy, mask & torch.isfinite(entropy), ENTROPY_PERCENTILES, group)
    return {f"entropy_p{round(p * 100)}": value for p, value in zip(ENTROPY_PERCENTILES, values)}


@register_token_mask("none", sources=("old", "current"))
def no_mask(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
    """GRPO, JustRL and every verl loss run as they are: nothing dropped."""
    nothing = torch.zeros_like(inputs.response_mask)
    return TokenMask(nothing, nothing)


@register_token_mask(
    "stapo",
    needs_log_prob=True,
    needs_entropy=True,
    sources=("old", "current"),
    ratios={
        "mask_ratio": ("num_spurious", "num_response_tokens"),
        "positive_low_prob_frac": ("num_positive_low_prob", "num_positive"),
        "grad_bound_share_spurious": ("grad_bound_spurious", "grad_bound_positive"),
    },
    scope_counts=("num_candidates",),
)
def stapo_mask(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
    """S2T (docs/algorithm.md section 2): drop spurious tokens from both the sum and the count."""
    mask, log_prob, entropy, advantages = inputs.response_mask, inputs.log_prob, inputs.entropy, inputs.advantages
    # full-batch elementwise ops in the batch's dtype, never a gather or a float64 copy of the batch:
    # at the paper's 31M response tokens those dominate the driver's time (benchmarks/mask_build.py)
    detection = detect_spurious(log_prob, entropy, advantages, mask, settings.tau_p, settings.entropy_quantile,
                                inputs.group)
    spurious, parts = detection.spurious, detection.parts  # the candidate rule once, for the mask and quadrants
    positive, prob, low_prob = parts.positive, parts.prob, parts.candidates
    # section 4: the quadrants split positive-advantage tokens at tau_p and tau_h; with no candidate
    # tau_h is undefined and the split falls back to the median entropy of those tokens
    split = detection.tau_h
    if math.isnan(split):
        (split,) = group_masked_quantiles(entropy, positive & torch.isfinite(entropy), (0.5,), inputs.group)
    low_entropy = less_than(entropy, split)
    # the lower bound of each token's squared logit-gradient norm at rho = 1 (docs/algorithm.md 5):
    # the share of it that the silenced tokens carry is what S2T removes from the update
    bound = _positive_grad_bound(prob, entropy, advantages, positive)
    num_positive = count(positive)
    num_low_prob = count(low_prob)
    num_lowp_lowh = count(low_prob & low_entropy)
    num_positive_lowh = count(positive & low_entropy)
    counts = {
        "num_spurious": count(spurious),
        "num_candidates": float(detection.num_candidates),
        "num_candidates_local": count(detection.candidates),
        "num_positive": num_positive,
        "num_positive_low_prob": num_low_prob,
        "grad_bound_spurious": float((bound * spurious).sum()),
        "grad_bound_positive": float(bound.sum()),
        "quadrant/lowp_lowh": num_lowp_lowh,
        "quadrant/lowp_highh": num_low_prob - num_lowp_lowh,
        "quadrant/highp_lowh": num_positive_lowh - num_lowp_lowh,
        "quadrant/highp_highh": num_positive - num_low_prob - num_positive_lowh + num_lowp_lowh,
    }
    stats = {
        "tau_h": detection.tau_h,
        "quadrant_entropy_split": split,
        **entropy_percentiles(entropy, mask, inputs.group),
    }
    return TokenMask(spurious, spurious, counts, stats)


def _positive_grad_bound(prob, entropy, advantages, positive) -> torch.Tensor:
    """``grad_norm_sq_lower_bound`` in the batch's dtype at the positive-advantage tokens (0 elsewhere
    and where not finite)."""
    bound = grad_norm_sq_lower_bound(prob, entropy, advantages, dtype=prob.dtype)
    return bound.masked_fill_(~(positive & torch.isfinite(bound)), 0.0)


def high_entropy_keep(
    entropy: torch.Tensor, response_mask: torch.Tensor, top_fraction: float, group: dist.ProcessGroup | None = None
) -> tuple[torch.Tensor, float]:
    """20-Entropy's kept tokens: entropy >= the (1 - top_fraction)-quantile of all response tokens' entropy
    over the scope (ties at the threshold kept); and that threshold (NaN when there is no token).

    Exact at every size and on every layout (one process or several DP ranks): the threshold decides
    which tokens train, so the driver's diagnostics and every rank's fold must agree bit for bit."""
    finite = response_mask & torch.isfinite(entropy)
    if dp_ranks(group) > 1:
        threshold = global_quantile(entropy[finite], 1.0 - top_fraction, group)
    else:  # one process holds the whole scope: one partition pass, no gather, no sampling
        (threshold,) = masked_quantiles(entropy, finite, (1.0 - top_fraction,), max_exact=None)
    if math.isnan(threshold):
        return torch.zeros_like(response_mask), threshold
    return finite & ~less_than(entropy, threshold), threshold


@register_token_mask("entropy20", needs_entropy=True, ratios={"keep_ratio": ("num_kept", "num_response_tokens")})
def entropy20_mask(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
    """20-Entropy ("Beyond the 80/20 rule"): the gradient only on the top-entropy tokens of the batch."""
    mask = inputs.response_mask
    keep, threshold = high_entropy_keep(inputs.entropy, mask, settings.entropy_top_fraction, inputs.group)
    drop = mask & ~keep
    drop_count = drop if settings.entropy_denominator == "kept" else torch.zeros_like(drop)
    stats = {"entropy_threshold": threshold, **entropy_percentiles(inputs.entropy, mask, inputs.group)}
    return TokenMask(drop, drop_count, {"num_kept": count(keep)}, stats)


# --- soft weights (stapo.algorithm.token_weights): nothing dropped, every kept token's loss weighted ---------------

WEIGHT_RATIOS = {
    "mean_weight": ("weight_sum", "num_response_tokens"),
    "mean_weight_positive": ("weight_sum_positive", "num_positive"),
    "positive_downweighted_frac": ("num_positive_downweighted", "num_positive"),
}


def weighted_mask(inputs: MaskInputs, weight: torch.Tensor) -> TokenMask:
    """A weighting as a registry entry: no token dropped (the weighted tokens stay in the count), the weight,
    and its counts and minimum (``stapo.algorithm.token_weights.weight_metrics``)."""
    nothing = torch.zeros_like(inputs.response_mask)
    counts, stats = weight_metrics(weight, inputs.response_mask, inputs.advantages, inputs.group)
    return TokenMask(nothing, nothing, counts, stats, weight)


@register_token_mask(
    "taco", needs_log_prob=True, needs_entropy=True, sources=SOURCES, ratios=WEIGHT_RATIOS, weighted=True
)
def taco_mask(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
    """TACO (arXiv 2607.07976): the loss of positive-advantage tail tokens scaled down (``taco_weight``)."""
    weight = taco_weight(
        inputs.log_prob, inputs.entropy, inputs.advantages, inputs.response_mask, settings.taco_alpha,
        settings.taco_lambda,
    )
    return weighted_mask(inputs, weight)


@register_token_mask("advrew", needs_log_prob=True, sources=SOURCES, ratios=WEIGHT_RATIOS, weighted=True)
def advrew_mask(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
    """Advantage Reweighting (arXiv 2505.12929): every token's advantage scaled by ``alpha p + 1 - alpha``."""
    return weighted_mask(inputs, advrew_weight(inputs.log_prob, inputs.response_mask, settings.advrew_alpha))


# --- the 2026 stabilisers' weights (stapo.algorithm.stare, stapo.algorithm.steer; docs/algorithm.md section 7) ---

UPWEIGHT_RATIOS = {**WEIGHT_RATIOS, "upweighted_frac": ("num_upweighted", "num_response_tokens")}


@register_token_mask(
    "stare", needs_log_prob=True, needs_entropy=True, sources=("old",), ratios=UPWEIGHT_RATIOS, weighted=True
)
def stare_mask(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
    """STARE (arXiv 2606.19236): the top surprisal share of each advantage sign weighted, while the scope's mean
    entropy is below the target. ``stare_gate`` is 1/0 (NaN: no finite entropy, weights 1), ``stare_cut`` the
    surprisal at which ``L+`` starts (NaN: no positive-advantage token)."""
    built = stare_weight(
        inputs.log_prob, inputs.entropy, inputs.advantages, inputs.response_mask, settings.stare_top_ratio,
        settings.stare_w, settings.stare_m, settings.stare_variant, settings.stare_target_entropy, inputs.group,
    )
    weighted = weighted_mask(inputs, built.weight)
    counts = {**weighted.counts, "num_upweighted": count(inputs.response_mask & (built.weight > 1.0))}
    stats = {**weighted.stats, "stare_gate": built.gate, "stare_cut": built.cut}
    return TokenMask(weighted.drop_response, weighted.drop_count, counts, stats, built.weight)


@register_token_mask("steer", needs_log_prob=True, needs_entropy=True, sources=("old",), ratios=WEIGHT_RATIOS,
                     weighted=True)
def steer_mask(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
    """STEER (arXiv 2510.10150): each token weighted by exp(-k |estimated entropy change|), from the old-policy
    pass (``p = q``: the ratio is 1, as on the first mini-batch of an on-policy step)."""
    weight = steer_weight(inputs.log_prob, inputs.log_prob, inputs.entropy, inputs.advantages, inputs.response_mask,
                          settings.steer_lambda_min, inputs.group)
    return weighted_mask(inputs, weight)
