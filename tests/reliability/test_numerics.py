"""Degenerate numbers, tried on purpose: NaN/inf log-probs and entropies, zero advantages, empty
responses, everything masked. The loss must stay finite and equal a float64 loop reference that
leaves the bad positions out, or the step must fail loudly with the counts; never a NaN update.
Each case is counted in the ``actor/stapo/`` diagnostics.
"""

from __future__ import annotations

import math

import pytest
import torch
from verl.utils import tensordict_utils as tu

from stapo.loss import stapo_loss
from stapo.s2t import detect_spurious
from stapo.verl_plugin.losses import MASK_FOLDED_KEY, STAPOLossFn
from stapo.verl_plugin.trainer import fold_masks
from tests.integration.verl_batches import actor_config, make_micro_batch
from tests.reference import reference_clipped_token_loss, reference_spurious

TAU_P, Q = 0.002, 0.75
NAN, INF = float("nan"), float("inf")


def batch(seed: int, rows: int = 6, cols: int = 12):
    """(old_log_prob, log_prob, entropy, advantages, response_mask) in float64, ragged via the mask."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(rows, cols, generator=g) < 0.4
    old = torch.where(
        low,
        torch.empty(rows, cols, dtype=torch.float64).uniform_(math.log(1e-6), math.log(TAU_P), generator=g),
        torch.empty(rows, cols, dtype=torch.float64).uniform_(math.log(TAU_P), 0.0, generator=g),
    )
    new = old + torch.empty(rows, cols, dtype=torch.float64).uniform_(-0.5, 0.5, generator=g)
    entropy = torch.rand(rows, cols, generator=g, dtype=torch.float64) * 4
    sign = torch.tensor([1.0 if i % 3 else -1.0 for i in range(rows)], dtype=torch.float64)
    per_row = sign * (0.2 + torch.rand(rows, generator=g, dtype=torch.float64))
    advantages = per_row.unsqueeze(-1).expand(rows, cols).clone()
    lengths = torch.randint(cols // 2, cols + 1, (rows,), generator=g)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)
    return old, new, entropy, advantages, mask


def loop_reference(old, new, entropy, advantages, mask):
    """Mean clipped loss over response tokens that are not spurious, and d loss / d new, by loops."""
    as_list = lambda t: t.tolist()  # noqa: E731
    spurious, tau_h = reference_spurious(as_list(new), as_list(entropy), as_list(advantages), as_list(mask), TAU_P, Q)
    valid = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] and not spurious[i][t]]
    grad = torch.zeros_like(new)
    if not valid:
        return 0.0, grad, tau_h
    total = 0.0
    for i, t in valid:
        lp, op, a = float(new[i, t]), float(old[i, t]), float(advantages[i, t])
        total += reference_clipped_token_loss(op, lp, a, 0.2, 0.28, 10.0)
        ratio = math.exp(min(max(lp - op, -20.0), 20.0))
        unclipped, clipped = -a * ratio, -a * min(max(ratio, 0.8), 1.28)
        inside = -20.0 < lp - op < 20.0
        if inside and unclipped >= clipped and not (a < 0 and unclipped > -a * 10.0):
            grad[i, t] = -a * ratio / len(valid)
    return total / len(valid), grad, tau_h


def run_stapo_loss(old, new, entropy, advantages, mask):
    leaf = new.clone().requires_grad_(True)
    loss, metrics = stapo_loss(old, leaf, advantages, mask, entropy, TAU_P, Q)
    loss.backward()
    return loss, leaf.grad, metrics


def _poison_outside(old, new, entropy, advantages, mask):
    outside = ~mask
    old[outside], new[outside], entropy[outside], advantages[outside] = NAN, INF, NAN, NAN
    return old, new, entropy, advantages, mask


def _nonfinite_entropy(old, new, entropy, advantages, mask):
    entropy[0, :3], entropy[1, 0], entropy[2, 1] = NAN, INF, -INF
    return old, new, entropy, advantages, mask


def _nonfinite_log_prob(old, new, entropy, advantages, mask):
    new[1, 2], old[1, 2] = -INF, -1.0  # p = 0: a candidate, log-ratio clamped at -20
    new[2, 3] = NAN  # never a candidate; the loss must refuse it if it is a loss token (see below)
    mask[2, 3] = False
    return old, new, entropy, advantages, mask


def _zero_advantages(old, new, entropy, advantages, mask):
    return old, new, entropy, torch.zeros_like(advantages), mask


def _empty_responses(old, new, entropy, advantages, mask):
    mask[1] = False
    mask[4] = False
    return old, new, entropy, advantages, mask


def _all_masked(old, new, entropy, advantages, mask):
    return _poison_outside(old, new, entropy, advantages, torch.zeros_like(mask))


CASES = {
    "nan_inf_outside_the_mask": _poison_outside,
    "nonfinite_entropy": _nonfinite_entropy,
    "nonfinite_log_prob": _nonfinite_log_prob,
    "zero_advantages": _zero_advantages,
    "empty_responses": _empty_responses,
    "all_tokens_masked": _all_masked,
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_degenerate_batch_gives_finite_loss_equal_to_loop_reference(case, seed):
    old, new, entropy, advantages, mask = CASES[case](*batch(seed))
    loss, grad, metrics = run_stapo_loss(old, new, entropy, advantages, mask)
    expected, expected_grad, tau_h = loop_reference(old, new, entropy, advantages, mask)
    assert torch.isfinite(loss) and torch.isfinite(grad).all(), (loss, grad)
    assert float(loss) == pytest.approx(expected, rel=1e-10, abs=1e-15)
    assert torch.allclose(grad, expected_grad, rtol=1e-9, atol=1e-15)
    assert (metrics["tau_h"] == tau_h) or (math.isnan(metrics["tau_h"]) and math.isnan(tau_h))
    # the counters say what happened, over response tokens only
    m = mask
    assert metrics["nonfinite_entropy"] == float((m & ~torch.isfinite(entropy)).sum())
    assert metrics["nonfinite_log_prob"] == float((m & ~torch.isfinite(new)).sum())
    assert metrics["empty_responses"] == float(sum(1 for row in m if not row.any()))
    assert metrics["num_response_tokens"] == float(m.sum())
    zero = sum(1 for i in range(m.shape[0]) for t in range(m.shape[1]) if m[i, t] and advantages[i, t] == 0)
    assert metrics["zero_advantage_fraction"] == (zero / int(m.sum()) if m.any() else 0.0)
    if case == "zero_advantages":
        assert metrics["zero_advantage_fraction"] == 1.0 and metrics["num_candidates"] == 0 and float(loss) == 0.0
    if case == "all_tokens_masked":
        assert metrics["num_response_tokens"] == 0 and metrics["mask_ratio"] == 0.0 and float(loss) == 0.0
    if case == "nonfinite_entropy":
        assert metrics["nonfinite_entropy"] >= 4


@pytest.mark.parametrize("where, name", [("old", "old_log_prob"), ("new", "log_prob"), ("adv", "advantages")])
def test_nonfinite_value_on_a_loss_token_fails_loudly_with_counts(where, name):
    old, new, entropy, advantages, mask = batch(3)
    i, t = 0, 0  # a response token with a negative advantage: never a candidate, so always a loss token
    assert mask[i, t] and advantages[i, t] < 0
    target = {"old": old, "new": new, "adv": advantages}[where]
    target[i, t] = NAN
    with pytest.raises(FloatingPointError, match=rf"'{name}': 1\b.*the update is refused"):
        run_stapo_loss(old, new, entropy, advantages, mask)


# --- through verl's own ppo_loss and the registered loss ------------------------------------------


def _rows(old, new, entropy, advantages, mask, response_mask=None):
    lengths = [int(mask.shape[1])] * mask.shape[0]
    response_mask = mask if response_mask is None else response_mask
    return {
        "old_log_prob": [old[i] for i in range(len(lengths))],
        "log_prob": [new[i] for i in range(len(lengths))],
        "model_entropy": [entropy[i].float() for i in range(len(lengths))],
        "advantages": [advantages[i] for i in range(len(lengths))],
        "response_mask": [response_mask[i].long() for i in range(len(lengths))],
        "loss_mask": [mask[i].long() for i in range(len(lengths))],
    }


def _verl_loss(config, rows, batch_num_tokens, folded=True, with_entropy=False):
    rows = dict(rows)
    if not with_entropy:
        rows.pop("model_entropy")
    prompt_lens = [3] * len(rows["log_prob"])
    model_output, data, leaf = make_micro_batch(rows, prompt_lens, batch_num_tokens, len(prompt_lens))
    tu.assign_non_tensor(data, **{MASK_FOLDED_KEY: folded})
    loss, metrics = STAPOLossFn(config)(model_output=model_output, data=data)
    loss.backward()
    width = rows["log_prob"][0].numel()
    grads = torch.stack([leaf.grad[i * (width + 3) + 2 : i * (width + 3) + 2 + width] for i in range(len(prompt_lens))])
    return loss, grads, metrics


def test_verl_path_nan_at_a_silenced_or_padded_token_never_reaches_the_gradient():
    """source=old: the driver folded the S2T mask; NaN/inf sit exactly where the mask is now 0."""
    old, new, entropy, advantages, mask = batch(5)
    detection = detect_spurious(old, entropy, advantages, mask, TAU_P, Q)
    assert detection.spurious.any()
    _, loss_mask = fold_masks(mask.long(), mask.long(), detection.spurious, detection.spurious)
    dropped = loss_mask == 0
    old, new, advantages = old.clone(), new.clone(), advantages.clone()
    old[dropped], new[dropped], advantages[dropped] = NAN, INF, NAN
    rows = _rows(old, new, entropy, advantages, loss_mask.bool())
    loss, grads, _ = _verl_loss(actor_config(loss_mode="stapo", source="old"), rows, int(loss_mask.sum()))
    valid = loss_mask.bool()
    expected = sum(
        reference_clipped_token_loss(float(old[i, t]), float(new[i, t]), float(advantages[i, t]), 0.2, 0.28, 10.0)
        for i in range(valid.shape[0]) for t in range(valid.shape[1]) if valid[i, t]
    ) / int(valid.sum())
    assert torch.isfinite(grads).all() and float(loss) == pytest.approx(expected, rel=1e-10)
    assert (grads[dropped] == 0).all()


def test_verl_path_micro_batch_without_loss_tokens_is_an_exact_zero():
    """A whole mini-batch with nothing to learn (verl's token count is 0): zero loss, zero gradient."""
    old, new, entropy, advantages, mask = batch(6, rows=2)
    empty = torch.zeros_like(mask)
    config = actor_config(loss_mode="stapo", source="old")
    loss, grads, _ = _verl_loss(config, _rows(old, new, entropy, advantages, empty), 0)
    assert float(loss) == 0.0 and torch.isfinite(grads).all() and (grads == 0).all()


def test_verl_path_nan_log_prob_on_a_loss_token_refuses_the_update():
    old, new, entropy, advantages, mask = batch(7, rows=3)
    new[0, 1] = NAN
    with pytest.raises(FloatingPointError, match=r"'log_prob': 1\b"):
        config = actor_config(loss_mode="stapo", source="old")
        _verl_loss(config, _rows(old, new, entropy, advantages, mask), int(mask.sum()))


def test_verl_path_source_current_with_nonfinite_entropy_and_zero_advantages_counts_them():
    old, new, entropy, advantages, mask = batch(8)
    entropy[0, :2], entropy[3, 0] = NAN, INF
    advantages[5] = 0.0
    mask[2] = False  # an empty response
    entropy32 = entropy.float().double()  # the model's entropy is float32 in verl
    rows = _rows(old, new, entropy32, advantages, mask)
    config = actor_config(loss_mode="stapo", source="current")
    loss, grads, metrics = _verl_loss(config, rows, int(mask.sum()), folded=False, with_entropy=True)
    metrics = {key: float(value.values[0]) for key, value in metrics.items() if key.startswith("actor/stapo/")}
    expected, expected_grad, tau_h = loop_reference(old, new, entropy32, advantages, mask)
    assert torch.isfinite(grads).all()
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert metrics["actor/stapo/tau_h"] == pytest.approx(tau_h, rel=1e-6)
    assert metrics["actor/stapo/nonfinite_entropy"] == float((mask & ~torch.isfinite(entropy32)).sum()) == 3.0
    assert metrics["actor/stapo/empty_responses"] == 1.0
    zero = float((mask & (advantages == 0)).sum()) / float(mask.sum())
    assert metrics["actor/stapo/zero_advantage_fraction"] == pytest.approx(zero) and zero > 0


def test_verl_path_nan_in_verls_kl_term_refuses_the_update():
    """The policy-gradient term is finite, verl's KL term (a NaN reference log-prob) is not: loud failure."""
    from verl.utils.config import omega_conf_to_dataclass

    from tests.integration.verl_batches import compose_verl, jagged, stapo_overrides

    overrides = stapo_overrides(loss_mode="stapo", source="old") + ["actor_rollout_ref.actor.use_kl_loss=true"]
    config = omega_conf_to_dataclass(compose_verl(overrides).actor_rollout_ref.actor)
    old, new, entropy, advantages, mask = batch(9, rows=3)
    rows = _rows(old, new, entropy, advantages, mask)
    rows.pop("model_entropy")
    model_output, data, _ = make_micro_batch(rows, [3] * 3, int(mask.sum()), 3)
    ref = old.clone()
    ref[1, 0] = NAN
    data["ref_log_prob"] = jagged([ref[i] for i in range(3)])
    tu.assign_non_tensor(data, **{MASK_FOLDED_KEY: True})
    with pytest.raises(FloatingPointError, match="verl's KL / entropy terms are not"):
        STAPOLossFn(config)(model_output=model_output, data=data)
