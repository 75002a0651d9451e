"""Degenerate numbers, tried on purpose through the production path (the STAPO mask folded as the
trainer does, or built inside the loss, then ``STAPOLossFn`` -> verl's ``ppo_loss`` -> ``masked_clip``):
NaN/inf log-probs and entropies, zero advantages, empty responses, everything masked.

Outside the kept tokens a bad value must never reach the loss or its gradient: the loss equals the
float64 loop reference that leaves those positions out. A non-finite value ON a kept token makes
the loss NaN with a NaN gradient (verl then skips the step on every rank) and is counted in
``actor/stapo/refused_micro_batches``; never a finite-looking update, never a raise that leaves FSDP
peers waiting. Every degenerate input is counted in the ``actor/stapo/`` diagnostics.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest
import torch

from stapo.algorithm.masks import MaskSettings
from stapo.verl_plugin.training.losses import REFUSED_METRIC, STAPOLossFn, folded_mask_update
from tests.integration.verl_batches import (
    actor_config,
    compose_verl,
    fold_as_trainer,
    make_micro_batch,
    metric_values,
    padded_rows,
    stapo_overrides,
)
from tests.reference import REFERENCES, reference_masked_loss

TAU_P, Q = 0.002, 0.75
NAN, INF = float("nan"), float("inf")
PROMPT = 3  # prompt length of every row in these batches


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


def _poison_outside(old, new, entropy, advantages, mask):
    outside = ~mask
    old[outside], new[outside], entropy[outside], advantages[outside] = NAN, INF, NAN, NAN
    return old, new, entropy, advantages, mask


def _nonfinite_entropy(old, new, entropy, advantages, mask):
    entropy[0, :3], entropy[1, 0], entropy[2, 1] = NAN, INF, -INF
    return old, new, entropy, advantages, mask


def _nonfinite_log_prob(old, new, entropy, advantages, mask):
    new[1, 2], old[1, 2] = -INF, -INF  # p = 0 in both passes: a candidate; the log-ratio is NaN -> refused
    mask[1, 2] = False  # ... unless it is not a response token
    new[1, 3] = -INF  # p = 0 now, finite before: log-ratio clamped at -20, no gradient, finite loss
    old[2, 4] = -INF  # p = 0 before: log-ratio clamped at +20 (only a clipped or capped loss)
    new[2, 3] = NAN  # never a candidate; outside the mask here
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


def run_loss(config, tensors, response_mask, loss_mask, batch_num_tokens):
    """One micro-batch through ``STAPOLossFn``; returns (loss, padded gradient, metrics)."""
    rows = padded_rows(tensors, response_mask, loss_mask)
    for key in ("rollout_is_weights", "ref_log_prob"):
        if key in tensors:
            rows[key] = list(tensors[key])
    count = len(rows["log_prob"])
    model_output, data, leaf = make_micro_batch(rows, [PROMPT] * count, batch_num_tokens, count)
    with folded_mask_update():  # as the STAPO actor worker runs verl's update over its folded shard
        loss, metrics = STAPOLossFn(config)(model_output=model_output, data=data)
    loss.backward()
    width = tensors["log_prob"].shape[1]
    step = width + PROMPT
    grads = torch.stack([leaf.grad[i * step + PROMPT - 1 : i * step + PROMPT - 1 + width] for i in range(count)])
    return loss, grads, metrics


def through_the_loss(source: str, old, new, entropy, advantages, mask, config=None):
    """The production path for one source; returns (loss, grad, mask counts, settings, mask inputs)."""
    settings = MaskSettings(token_mask="stapo", source=source)
    config = config or actor_config(token_mask="stapo", source=source)
    if source == "old":
        tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages, "entropy": entropy}
        response_mask, loss_mask, built = fold_as_trainer({**tensors, "response_mask": mask}, settings)
        loss, grads, metrics = run_loss(config, tensors, response_mask, loss_mask, int(loss_mask.sum()))
        counts = {**built.counts, **built.stats}
        inputs = {"log_prob": old, "entropy": entropy}
    else:
        entropy32 = entropy.float()  # verl hands the model's entropy over in float32
        tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages, "model_entropy": entropy32}
        loss, grads, metrics = run_loss(config, tensors, mask, mask, int(mask.sum()))
        counts = {k[len("actor/stapo/_sum/") :]: v for k, v in metric_values(metrics, "actor/stapo/_sum/").items()}
        inputs = {"log_prob": new, "entropy": entropy32.double()}
    inputs.update(response_mask=mask, advantages=advantages)
    return loss, grads, counts, metrics, settings, inputs


DEGENERATE = [(case, source) for case in sorted(CASES) for source in ("old", "current")]


@pytest.mark.parametrize("case, source", DEGENERATE)
@pytest.mark.parametrize("seed", [0, 1])
def test_degenerate_batch_gives_finite_loss_equal_to_loop_reference(case, seed, source):
    old, new, entropy, advantages, mask = CASES[case](*batch(seed))
    loss, grads, counts, metrics, settings, inputs = through_the_loss(source, old, new, entropy, advantages, mask)
    lists = {key: value.tolist() for key, value in inputs.items()}
    expected = REFERENCES["stapo"](lists, dataclasses.asdict(settings))
    keep = [[m and not d for m, d in zip(rm, rd)] for rm, rd in zip(lists["response_mask"], expected["drop_response"])]
    kept = sum(map(sum, keep))
    want, want_grad = reference_masked_loss(old.tolist(), new.tolist(), advantages.tolist(), keep, kept)

    assert torch.isfinite(loss) and torch.isfinite(grads).all(), (loss, grads)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-10, abs=1e-15)
    torch.testing.assert_close(grads, torch.tensor(want_grad, dtype=grads.dtype), rtol=1e-9, atol=1e-15)
    assert metric_values(metrics)[REFUSED_METRIC] == 0.0
    # the counters say what happened, over response tokens only
    for key, value in expected["counts"].items():
        if source == "current" and key == "num_candidates_local":
            continue  # a rank's own count: reported SUM-aggregated over ranks only as num_candidates
        assert counts[key] == pytest.approx(value, rel=1e-12 if key.startswith("grad_bound") else 0.0), key
    tau_h = expected["stats"]["tau_h"]
    if source == "old":
        assert counts["tau_h"] == tau_h or (math.isnan(counts["tau_h"]) and math.isnan(tau_h))
    else:  # thresholds travel as value and "#defined" flag (a mean over the micro-batches where defined)
        assert counts["tau_h#defined"] == float(not math.isnan(tau_h))
        assert counts["tau_h"] == (0.0 if math.isnan(tau_h) else tau_h)
    if case == "zero_advantages":
        assert counts["num_zero_advantage"] == counts["num_response_tokens"] > 0 and float(loss.detach()) == 0.0
    if case == "all_tokens_masked":
        assert counts["num_response_tokens"] == 0 and float(loss.detach()) == 0.0 and (grads == 0).all()
    if case == "nonfinite_entropy":
        assert counts["nonfinite_entropy"] >= 4
    if case == "empty_responses":
        assert counts["empty_responses"] == 2


@pytest.mark.parametrize("source", ["old", "current"])
@pytest.mark.parametrize("where, name", [("old", "old_log_prob"), ("new", "log_prob"), ("adv", "advantages")])
def test_nonfinite_value_on_a_loss_token_gives_nan_loss_nan_gradient_and_is_counted(where, name, source, caplog):
    old, new, entropy, advantages, mask = batch(3)
    i, t = 0, 0  # a response token with a negative advantage: never a candidate, so always a loss token
    assert mask[i, t] and advantages[i, t] < 0
    {"old": old, "new": new, "adv": advantages}[where][i, t] = NAN
    with caplog.at_level(logging.WARNING, logger="stapo.verl_plugin.training.losses"):
        loss, grads, counts, metrics, _, _ = through_the_loss(source, old, new, entropy, advantages, mask)
    assert math.isnan(float(loss.detach()))
    kept = mask.clone()
    if source == "old":
        kept &= ~fold_as_trainer(
            {"old_log_prob": old, "advantages": advantages, "entropy": entropy, "response_mask": mask},
            MaskSettings(token_mask="stapo"),
        )[2].drop_response
    # NaN on every kept token: the DP-global grad norm is NaN on every rank, so verl skips the step
    assert torch.isnan(grads[kept]).all() and (grads[~mask] == 0).all()
    assert metric_values(metrics)[REFUSED_METRIC] == 1.0
    assert rf"'{name}': 1" in caplog.text and "skipped on every rank" in caplog.text
    if where == "adv":
        assert counts["nonfinite_advantage"] == 1.0


def test_nan_at_a_silenced_or_padded_token_never_reaches_the_gradient():
    """source=old: NaN/inf sit exactly where the folded mask is now 0 (silenced tokens and padding)."""
    old, new, entropy, advantages, mask = batch(5)
    tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages, "entropy": entropy}
    response_mask, loss_mask, built = fold_as_trainer({**tensors, "response_mask": mask}, MaskSettings("stapo"))
    assert built.drop_response.any()
    dropped = loss_mask == 0
    old, new, advantages = old.clone(), new.clone(), advantages.clone()
    old[dropped], new[dropped], advantages[dropped] = NAN, INF, NAN
    tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages}
    loss, grads, _ = run_loss(actor_config(token_mask="stapo"), tensors, response_mask, loss_mask, int(loss_mask.sum()))
    keep = loss_mask.bool().tolist()
    want, want_grad = reference_masked_loss(old.tolist(), new.tolist(), advantages.tolist(), keep, int(loss_mask.sum()))
    assert torch.isfinite(grads).all() and float(loss.detach()) == pytest.approx(want, rel=1e-10)
    torch.testing.assert_close(grads, torch.tensor(want_grad, dtype=grads.dtype), rtol=1e-9, atol=1e-15)
    assert (grads[dropped] == 0).all()


def test_micro_batch_without_loss_tokens_is_an_exact_zero():
    """A whole mini-batch with nothing to learn (verl's token count is 0): zero loss, zero gradient."""
    old, new, _, advantages, mask = batch(6, rows=2)
    empty = torch.zeros_like(mask)
    tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages}
    loss, grads, metrics = run_loss(actor_config(token_mask="stapo"), tensors, empty, empty, 0)
    assert float(loss.detach()) == 0.0 and (grads == 0).all()
    assert metric_values(metrics)[REFUSED_METRIC] == 0.0


@pytest.mark.parametrize("source", ["old", "current"])
def test_zero_token_mini_batch_with_update_entropy_is_an_exact_zero(source):
    """Every value finite, no loss token in the whole mini-batch (all responses empty), the update's forward
    returns entropy: nothing to learn, so a zero loss and zero gradient, not a refused step."""
    old, new, entropy, advantages, mask = batch(0)
    empty = torch.zeros_like(mask)
    tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages, "model_entropy": entropy}
    config = actor_config(token_mask="stapo", source=source)
    loss, grads, metrics = run_loss(config, tensors, empty, empty, 0)
    assert metric_values(metrics)[REFUSED_METRIC] == 0.0
    assert float(loss.detach()) == 0.0 and (grads == 0).all()


def test_nan_in_verls_kl_term_is_refused_with_a_nan_gradient():
    """The policy-gradient term is finite, verl's KL term (a NaN reference log-prob) is not: the wrapper
    refuses the total loss the same way."""
    from verl.utils.config import omega_conf_to_dataclass

    overrides = stapo_overrides(token_mask="stapo") + ["actor_rollout_ref.actor.use_kl_loss=true"]
    config = omega_conf_to_dataclass(compose_verl(overrides).actor_rollout_ref.actor)
    old, new, _, advantages, mask = batch(9, rows=3)
    ref = old.clone()
    ref[1, 0] = NAN
    tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages, "ref_log_prob": ref}
    loss, grads, metrics = run_loss(config, tensors, mask, mask, int(mask.sum()))
    assert math.isnan(float(loss.detach())) and torch.isnan(grads[mask]).all() and (grads[~mask] == 0).all()
    assert metric_values(metrics)[REFUSED_METRIC] == 1.0


def test_nan_rollout_weight_on_a_loss_token_is_refused_and_outside_is_ignored():
    old, new, _, advantages, mask = batch(10, rows=3)
    weights = torch.ones_like(old)
    weights[~mask] = NAN
    tensors = {"old_log_prob": old, "log_prob": new, "advantages": advantages, "rollout_is_weights": weights}
    loss, grads, metrics = run_loss(actor_config(token_mask="none"), tensors, mask, mask, int(mask.sum()))
    assert torch.isfinite(loss) and torch.isfinite(grads).all()
    weights[0, 0] = NAN
    loss, grads, metrics = run_loss(actor_config(token_mask="none"), tensors, mask, mask, int(mask.sum()))
    assert math.isnan(float(loss.detach())) and metric_values(metrics)[REFUSED_METRIC] == 1.0


def test_nan_entropy_with_entropy_coeff_zero_is_only_a_metric():
    """verl adds ``entropy_coeff * entropy_loss`` after aggregating; with coefficient 0 a NaN entropy
    would still make 0 * NaN = NaN. The wrapper hands verl a detached, finite copy instead."""
    old, new, entropy, advantages, mask = batch(11, rows=3)
    rows = padded_rows(
        {"old_log_prob": old, "log_prob": new, "advantages": advantages, "model_entropy": entropy}, mask, mask
    )
    rows["model_entropy"][1][2] = NAN
    model_output, data, _ = make_micro_batch(rows, [PROMPT] * 3, int(mask.sum()), 3)
    model_output["entropy"] = model_output["entropy"].requires_grad_(True)
    config = actor_config(token_mask="none")
    assert config.entropy_coeff == 0
    loss, metrics = STAPOLossFn(config)(model_output=model_output, data=data)
    assert torch.isfinite(loss) and metric_values(metrics)[REFUSED_METRIC] == 0.0
    assert not model_output["entropy"].requires_grad  # no vocabulary-sized graph kept alive for a 0 term
