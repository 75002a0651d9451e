"""Independent references for the numerical tests: plain Python loops, float64, numpy.quantile.

Written from docs/algorithm.md, not from ``stapo/``: nothing here imports the code under test.
Inputs are nested lists (``tensor.tolist()``), rows may be ragged; advantages are per token or
one value per row.

``REFERENCES`` maps every token-mask registry entry to its loop reference; the registry test fails
for an entry that has none, so a new mask cannot land without one.
"""

from __future__ import annotations

import math

import numpy as np

NAN = math.nan


def _exp(x: float) -> float:
    """``math.exp`` with IEEE semantics (inf on overflow, NaN in, NaN out), as torch.exp."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _adv(advantages, i, t) -> float:
    row = advantages[i]
    return float(row[t]) if isinstance(row, (list, tuple, np.ndarray)) else float(row)


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(np.array(values, dtype=np.float64), q)) if values else NAN


def _tokens(response_mask):
    """Every response token's (row, position)."""
    return [(i, t) for i, row in enumerate(response_mask) for t, on in enumerate(row) if on]


def _falses(response_mask) -> list[list[bool]]:
    return [[False] * len(row) for row in response_mask]


def reference_candidates(log_prob, entropy, advantages, response_mask, tau_p):
    """S2T candidates as (row, position, entropy): A > 0, a finite log-prob with p < tau_p, a finite entropy
    to rank."""
    out = []
    for i, t in _tokens(response_mask):
        h, lp = float(entropy[i][t]), float(log_prob[i][t])
        if _adv(advantages, i, t) > 0 and math.isfinite(lp) and _exp(lp) < tau_p and math.isfinite(h):
            out.append((i, t, h))
    return out


def reference_spurious(log_prob, entropy, advantages, response_mask, tau_p, q):
    """Returns (spurious as nested lists of bools, tau_h): candidates strictly below the q-quantile of their entropy."""
    candidates = reference_candidates(log_prob, entropy, advantages, response_mask, tau_p)
    spurious = _falses(log_prob)
    tau_h = _quantile([h for _, _, h in candidates], q)
    for i, t, h in candidates:
        if h < tau_h:
            spurious[i][t] = True
    return spurious, tau_h


def reference_entropy_keep(entropy, response_mask, top_fraction):
    """20-Entropy: response tokens whose (finite) entropy is >= the (1 - top_fraction)-quantile; and that threshold."""
    values = [float(entropy[i][t]) for i, t in _tokens(response_mask) if math.isfinite(float(entropy[i][t]))]
    threshold = _quantile(values, 1.0 - top_fraction)
    keep = _falses(response_mask)
    for i, t in _tokens(response_mask):
        h = float(entropy[i][t])
        keep[i][t] = math.isfinite(h) and h >= threshold
    return keep, threshold


def reference_percentiles(entropy, response_mask) -> dict[str, float]:
    values = [float(entropy[i][t]) for i, t in _tokens(response_mask) if math.isfinite(float(entropy[i][t]))]
    return {f"entropy_p{p}": _quantile(values, p / 100) for p in (50, 80, 95)}


def reference_common_counts(inputs, drop_response, drop_count) -> dict[str, float]:
    """The token counts every entry reports (stapo.algorithm.masks docstring): over response tokens only."""
    mask, adv = inputs["response_mask"], inputs["advantages"]
    tokens = _tokens(mask)
    counts = {
        "num_response_tokens": float(len(tokens)),
        "num_dropped": float(sum(drop_response[i][t] for i, t in tokens)),
        "num_loss_tokens_expected": float(sum(not drop_count[i][t] for i, t in tokens)),
        "num_zero_advantage": float(sum(_adv(adv, i, t) == 0 for i, t in tokens)),
        "nonfinite_advantage": float(sum(not math.isfinite(_adv(adv, i, t)) for i, t in tokens)),
        "empty_responses": float(sum(not any(row) for row in mask)),
    }
    for key, name in (("entropy", "nonfinite_entropy"), ("log_prob", "nonfinite_log_prob")):
        if inputs.get(key) is not None:
            counts[name] = float(sum(not math.isfinite(float(inputs[key][i][t])) for i, t in tokens))
    return counts


def _result(inputs, drop_response, drop_count, counts=None, stats=None, weight=None) -> dict:
    return {
        "drop_response": drop_response,
        "drop_count": drop_count,
        "counts": {**reference_common_counts(inputs, drop_response, drop_count), **(counts or {})},
        "stats": dict(stats or {}),
        "weight": weight,  # None: every token's loss counts once
    }


def reference_none(inputs, settings) -> dict:
    nothing = _falses(inputs["response_mask"])
    return _result(inputs, nothing, nothing)


def reference_stapo(inputs, settings) -> dict:
    """S2T (docs/algorithm.md sections 2, 4, 5): the mask, its counts, quadrants and gradient-norm bound shares."""
    mask, adv, lp, ent = inputs["response_mask"], inputs["advantages"], inputs["log_prob"], inputs["entropy"]
    tau_p = settings["tau_p"]
    spurious, tau_h = reference_spurious(lp, ent, adv, mask, tau_p, settings["entropy_quantile"])
    num_candidates = len(reference_candidates(lp, ent, adv, mask, tau_p))
    positive = [(i, t) for i, t in _tokens(mask) if _adv(adv, i, t) > 0]
    split = tau_h
    if math.isnan(split):  # no candidate: split the quadrants at the median entropy of the positive tokens
        split = _quantile([float(ent[i][t]) for i, t in positive if math.isfinite(float(ent[i][t]))], 0.5)
    counts = {f"quadrant/{a}_{b}": 0.0 for a in ("lowp", "highp") for b in ("lowh", "highh")}
    bound_all = bound_spurious = 0.0
    low_prob_count = 0
    for i, t in positive:
        p, h, a = _exp(float(lp[i][t])), float(ent[i][t]), _adv(adv, i, t)
        # low p is the candidate's probability test: a non-finite log-prob (even -inf, p = 0) is not low p
        low_p, low_h = math.isfinite(float(lp[i][t])) and p < tau_p, h < split
        low_prob_count += low_p
        counts[f"quadrant/{'lowp' if low_p else 'highp'}_{'lowh' if low_h else 'highh'}"] += 1.0
        # squared logit-gradient norm lower bound at rho = 1: A^2 max(0, 1 - 2p + e^-H) (a NaN stays NaN);
        # undefined values count 0
        closed_form = 1.0 - 2.0 * p + _exp(-h)
        bound = a * a * (0.0 if closed_form < 0.0 else closed_form)
        if math.isfinite(bound):
            bound_all += bound
            bound_spurious += bound if spurious[i][t] else 0.0
    counts.update(
        num_spurious=float(sum(spurious[i][t] for i, t in _tokens(mask))),
        num_candidates=float(num_candidates),
        num_candidates_local=float(num_candidates),
        num_positive=float(len(positive)),
        num_positive_low_prob=float(low_prob_count),
        grad_bound_spurious=bound_spurious,
        grad_bound_positive=bound_all,
    )
    stats = {"tau_h": tau_h, "quadrant_entropy_split": split, **reference_percentiles(ent, mask)}
    return _result(inputs, spurious, spurious, counts, stats)


def reference_entropy20(inputs, settings) -> dict:
    """20-Entropy: drop every response token outside the top entropy fraction; count them or not."""
    mask, ent = inputs["response_mask"], inputs["entropy"]
    keep, threshold = reference_entropy_keep(ent, mask, settings["entropy_top_fraction"])
    drop = [[bool(on) and not k for on, k in zip(row_mask, row_keep)] for row_mask, row_keep in zip(mask, keep)]
    drop_count = drop if settings["entropy_denominator"] == "kept" else _falses(mask)
    counts = {"num_kept": float(sum(k for row in keep for k in row))}
    stats = {"entropy_threshold": threshold, **reference_percentiles(ent, mask)}
    return _result(inputs, drop, drop_count, counts, stats)


def reference_taco_weight(lp: float, h: float, a: float, alpha: float, lam: float) -> float:
    """TACO (docs/algorithm.md section 7) for one response token: positive advantage and a finite log-prob and
    entropy, else 1; the tail excess r = -log p - H + log alpha counts only above 0."""
    if not (a > 0 and math.isfinite(lp) and math.isfinite(h)):
        return 1.0
    r = max(-lp - h + math.log(alpha), 0.0)
    return 1.0 - lam * (1.0 - math.exp(-r))


def reference_advrew_weight(lp: float, alpha: float) -> float:
    """Advantage Reweighting for one response token: alpha p + 1 - alpha (p at most 1), 1 without a finite log-prob."""
    if not math.isfinite(lp):
        return 1.0
    return alpha * min(math.exp(lp), 1.0) + (1.0 - alpha)


def _weighted_result(inputs, weight_of) -> dict:
    """A weighting: nothing dropped, ``weight_of(i, t)`` on each response token (1 elsewhere), its counts and
    minimum."""
    mask, adv = inputs["response_mask"], inputs["advantages"]
    weight = [[1.0] * len(row) for row in mask]
    for i, t in _tokens(mask):
        weight[i][t] = weight_of(i, t)
    positive = [(i, t) for i, t in _tokens(mask) if _adv(adv, i, t) > 0]
    counts = {
        "num_positive": float(len(positive)),
        "num_positive_downweighted": float(sum(weight[i][t] < 1.0 for i, t in positive)),
        "num_downweighted": float(sum(weight[i][t] < 1.0 for i, t in _tokens(mask))),
        "weight_sum_positive": sum(weight[i][t] for i, t in positive),
        "weight_sum": sum(weight[i][t] for i, t in _tokens(mask)),
    }
    values = [weight[i][t] for i, t in _tokens(mask)]
    stats = {"min_weight": min(values) if values else NAN}
    nothing = _falses(mask)
    return _result(inputs, nothing, nothing, counts, stats, weight)


def reference_taco(inputs, settings) -> dict:
    lp, ent, adv = inputs["log_prob"], inputs["entropy"], inputs["advantages"]
    alpha, lam = settings["taco_alpha"], settings["taco_lambda"]
    return _weighted_result(
        inputs, lambda i, t: reference_taco_weight(float(lp[i][t]), float(ent[i][t]), _adv(adv, i, t), alpha, lam)
    )


def reference_advrew(inputs, settings) -> dict:
    lp, alpha = inputs["log_prob"], settings["advrew_alpha"]
    return _weighted_result(inputs, lambda i, t: reference_advrew_weight(float(lp[i][t]), alpha))


def reference_stare_weights(inputs, settings) -> tuple[list[list[float]], float, float]:
    """STARE (docs/algorithm.md section 7) over the whole input: the weights, the gate (1/0, NaN without a finite
    entropy) and the surprisal of L+'s k-th token (NaN when no token is selected). k = max(1, int(n P + 0.999999))
    of the n tokens of one advantage sign with a finite log-prob, every token at or above the k-th largest
    surprisal selected."""
    mask, adv, lp, ent = inputs["response_mask"], inputs["advantages"], inputs["log_prob"], inputs["entropy"]
    tokens = _tokens(mask)
    finite_h = [float(ent[i][t]) for i, t in tokens if math.isfinite(float(ent[i][t]))]
    gate = NAN if not finite_h else float(sum(finite_h) / len(finite_h) < settings["stare_target_entropy"])

    def top(sign):
        chosen = [(i, t) for i, t in tokens if math.isfinite(float(lp[i][t])) and sign * _adv(adv, i, t) > 0]
        n, ratio = len(chosen), settings["stare_top_ratio"]
        if n == 0 or ratio <= 0:
            return set(), NAN
        k = min(max(1, int(n * ratio + 0.999999)), n)
        cut = sorted((-float(lp[i][t]) for i, t in chosen), reverse=True)[k - 1]
        return {(i, t) for i, t in chosen if -float(lp[i][t]) >= cut}, cut

    plus, cut = top(1.0)
    minus = top(-1.0)[0] if settings["stare_variant"] == "C2" else set()
    weight = [[1.0] * len(row) for row in mask]
    if gate == 1.0:
        for i, t in minus:
            weight[i][t] = settings["stare_m"]
        for i, t in plus:
            weight[i][t] = settings["stare_w"]
    return weight, gate, cut


def reference_stare(inputs, settings) -> dict:
    weight, gate, cut = reference_stare_weights(inputs, settings)
    result = _weighted_result(inputs, lambda i, t: weight[i][t])
    tokens = _tokens(inputs["response_mask"])
    result["counts"]["num_upweighted"] = float(sum(weight[i][t] > 1.0 for i, t in tokens))
    result["stats"].update(stare_gate=gate, stare_cut=cut)
    return result


def reference_steer_m(lp: float, old: float, h: float, a: float) -> float:
    """STEER's |Omega| for one token, p clamped to [1e-8, 1 - 1e-8] and q to [1e-8, 1]; 0 where undefined."""
    if not all(math.isfinite(v) for v in (lp, old, h, a)):
        return 0.0
    p = min(max(math.exp(lp), 1e-8), 1.0 - 1e-8)
    q = min(max(math.exp(old), 1e-8), 1.0)
    omega = (a / q) * p * (1.0 - p) * (math.log(p) + h)
    return abs(omega) if math.isfinite(omega) else 0.0


def reference_steer_weights(lp_rows, old_rows, ent, adv, mask, lambda_min) -> list[list[float]]:
    """STEER's exponential weights: k = -log(lambda_min) / max(max m, 0.02), w = clip(exp(-k m), lambda_min, 1)."""
    m = {(i, t): reference_steer_m(float(lp_rows[i][t]), float(old_rows[i][t]), float(ent[i][t]), _adv(adv, i, t))
         for i, t in _tokens(mask)}
    k = -math.log(lambda_min) / max(max(m.values(), default=0.0), 0.02)
    weight = [[1.0] * len(row) for row in mask]
    for (i, t), value in m.items():
        weight[i][t] = min(max(math.exp(-k * value), lambda_min), 1.0)
    return weight


def reference_steer(inputs, settings) -> dict:
    lp = inputs["log_prob"]  # the preset's source: the old-policy pass for both p and q
    weight = reference_steer_weights(lp, lp, inputs["entropy"], inputs["advantages"], inputs["response_mask"],
                                     settings["steer_lambda_min"])
    return _weighted_result(inputs, lambda i, t: weight[i][t])


REFERENCES = {
    "stare": reference_stare,
    "steer": reference_steer,
    "none": reference_none,
    "stapo": reference_stapo,
    "entropy20": reference_entropy20,
    "taco": reference_taco,
    "advrew": reference_advrew,
}


# --- the objective ----------------------------------------------------------------------------


def reference_clipped_token_loss(old_lp, lp, adv, eps_low, eps_high, c):
    """One token's PPO loss with clip-higher and dual clip (verl semantics), in float64."""
    log_ratio = min(max(lp - old_lp, -20.0), 20.0)
    ratio = math.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * min(max(ratio, 1 - eps_low), 1 + eps_high)
    loss = max(unclipped, clipped)
    if adv < 0:
        loss = min(loss, -adv * c)
    return loss


def reference_clipped_token_grad(old_lp, lp, adv, eps_low, eps_high, c):
    """d loss / d lp of one token by hand: -A rho where the unclipped branch is active, else 0."""
    raw = lp - old_lp
    if abs(raw) > 20.0:
        return 0.0  # the log-ratio clamp stops the gradient
    ratio = math.exp(raw)
    unclipped, clipped = -adv * ratio, -adv * min(max(ratio, 1 - eps_low), 1 + eps_high)
    if clipped > unclipped:
        return 0.0  # the clipped branch is constant in lp
    if adv < 0 and unclipped > -adv * c:
        return 0.0  # dual clip: constant
    return -adv * ratio


def reference_masked_loss(old_lp, lp, adv, keep, denominator, eps_low=0.2, eps_high=0.28, c=10.0, weights=None):
    """Sum of the clipped loss over ``keep`` divided by ``denominator`` (token-mean), and d/d lp per token.

    ``denominator`` is the token count the mask leaves (verl's ``batch_num_tokens``); 0 kept tokens
    give an exact 0 and a zero gradient. ``weights`` (nested lists, None for all ones) multiply each kept
    token's loss and so its gradient.
    """
    grad = [[0.0] * len(row) for row in lp]
    cells = _tokens(keep)
    if not cells:
        return 0.0, grad
    total = 0.0
    for i, t in cells:
        o, p, a = float(old_lp[i][t]), float(lp[i][t]), _adv(adv, i, t)
        w = 1.0 if weights is None else float(weights[i][t])
        total += w * reference_clipped_token_loss(o, p, a, eps_low, eps_high, c)
        grad[i][t] = w * reference_clipped_token_grad(o, p, a, eps_low, eps_high, c) / denominator
    return total / denominator, grad


def reference_stapo_loss(old_lp, lp, adv, response_mask, entropy, tau_p, q, eps_low, eps_high, c):
    """The STAPO objective by loops, S2T on ``lp``: mean of the clipped loss over response tokens not spurious."""
    spurious, _ = reference_spurious(lp, entropy, adv, response_mask, tau_p, q)
    keep = [[bool(m) and not s for m, s in zip(rm, rs)] for rm, rs in zip(response_mask, spurious)]
    count = sum(sum(row) for row in keep)
    return reference_masked_loss(old_lp, lp, adv, keep, count or 1, eps_low, eps_high, c)[0]
