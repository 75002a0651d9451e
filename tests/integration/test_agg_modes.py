"""Every rule that keeps a token in the count but out of the sum, under every ``loss_agg_mode``: exact or refused.

Lopti's phases (the other phase's tokens) and 20-Entropy's ``entropy_denominator: all`` (the low-entropy tokens)
leave ``loss_mask`` (the count) wider than ``response_mask`` (the sum). The authors' formulation zeroes the other
tokens' advantages and keeps the count whole, in every mode as that mode defines it (docs/algorithm.md section 3).
Each mode is checked through verl's own loss path (``STAPOLossFn`` -> ``ppo_loss`` -> the registered
``masked_clip`` or ``dcpo``, the losses that hand the count to verl's ``agg_loss``) against a float64 loop written
per mode from that definition (DCPO's per-token bounds from tests/unit/test_dcpo.py's loop), on fresh random inputs
with a response without a token of a phase, an empty response and micro-batches holding no token of a phase. The
pairs that cannot be exact are refused before Ray (``validate_run_config``), in one line.
"""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

from stapo.algorithm.lopti import PHASES, low_probability, phase_masks
from stapo.algorithm.loss import COUNT_MASK_LOSSES, LOSS_AGG_MODES, check_aggregation
from stapo.algorithm.masks import MaskSettings
from stapo.algorithm.validation import STAPOConfigError
from stapo.verl_plugin.preflight.run_checks import LOSS_AGG_MODES as CHECKED_MODES
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from stapo.verl_plugin.training.losses import DCPO_LOSS_NAME, LOSS_NAME, STAPOLossFn, folded_mask_update
from tests.integration.verl_batches import (
    compose_verl,
    fold_as_trainer,
    make_micro_batch,
    run_micro_batches,
    stapo_overrides,
)
from tests.recipe_config import recipe_config
from tests.reference import reference_clipped_token_grad, reference_clipped_token_loss
from tests.unit import test_dcpo

ACTOR = "actor_rollout_ref.actor"
PL = f"{ACTOR}.policy_loss"
ETA = 0.5
SCALE = 7.0  # loss_scale_factor of seq-mean-token-sum-norm (as Dr. GRPO pins it)
CLIP = (0.2, 0.28, 10.0)  # stapo_overrides' eps_low, eps_high, dual-clip c
# the losses whose exactness the loops below check under every mode: the ones check_aggregation lets through
# under seq-mean-token-mean with a rule (test_the_exact_losses_are_the_allowed_ones ties the two together)
EXACT_LOSSES = ("masked_clip", "dcpo")


def clipped_token(o: float, p: float, a: float) -> tuple[float, float]:
    """``masked_clip``'s token: PPO's clip-higher and dual clip (tests/reference.py), loss and d / d log_prob."""
    return reference_clipped_token_loss(o, p, a, *CLIP), reference_clipped_token_grad(o, p, a, *CLIP)


# one token's (loss, d loss / d log_prob) in float64 for each loss; DCPO's loop bounds each ratio from the old
# probability (docs/algorithm.md section 7), with the same constants as stapo_overrides'
TOKEN_LOOPS = {"masked_clip": clipped_token, "dcpo": test_dcpo.loop_token}
assert (test_dcpo.EPS_LOW, test_dcpo.EPS_HIGH, test_dcpo.C) == CLIP


@functools.cache
def _config(mode: str, policy_loss: tuple):
    overrides = stapo_overrides(**dict(policy_loss))
    overrides += [f"{ACTOR}.loss_agg_mode={mode}", f"{ACTOR}.loss_scale_factor={int(SCALE)}"]
    return omega_conf_to_dataclass(compose_verl(overrides).actor_rollout_ref.actor)


def loss_fn(mode: str, **policy_loss):
    return STAPOLossFn(copy.deepcopy(_config(mode, tuple(sorted(policy_loss.items())))))


def random_batch(seed: int, count: int = 10):
    """Padded float64 tensors of ragged responses; row 0 has only high-probability tokens, row 1 only
    low-probability ones, row 2 is an empty response (every token masked)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 18, (count,), generator=g)
    width = int(lengths.max())
    old = torch.empty(count, width, dtype=torch.float64).uniform_(math.log(0.05), 0.0, generator=g)
    old[0], old[1] = math.log(0.9), math.log(0.1)
    shift = torch.empty(count, width, dtype=torch.float64).uniform_(-0.6, 0.6, generator=g)
    shift[::4, ::5] = 2.5  # the dual-clip region for negative advantages
    sign = torch.tensor([-1.0 if i % 3 == 0 else 1.0 for i in range(count)], dtype=torch.float64)
    advantages = (sign * (0.1 + torch.rand(count, generator=g, dtype=torch.float64))).unsqueeze(-1).expand(-1, width)
    response_mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(-1)
    response_mask[2] = False
    tensors = {
        "old_log_prob": old,
        "log_prob": old + shift,
        "entropy": torch.rand(count, width, generator=g, dtype=torch.float64) * 4,
        "advantages": advantages.clone(),
        "response_mask": response_mask,
    }
    prompt_lens = torch.randint(2, 6, (count,), generator=g).tolist()
    return tensors, lengths.tolist(), prompt_lens


def rows_of(tensors, lengths, summed, counted):
    rows = {key: tensors[key] for key in ("old_log_prob", "log_prob", "advantages")}
    rows.update(response_mask=summed.long(), loss_mask=counted.long())
    return {key: [value[i, :n] for i, n in enumerate(lengths)] for key, value in rows.items()}


def reference(tensors, lengths, summed, counted, mode: str, loss_mode: str = "masked_clip"):
    """The authors' formulation by loops in float64: every counted token's loss (``loss_mode``'s, TOKEN_LOOPS), with
    the advantage of a token counted but not summed set to 0; then ``mode`` as written below, over the mini-batch's
    B responses.

    token-mean: sum / (tokens counted in the mini-batch); token-sum: sum; seq-mean-token-sum: sum over each
    response, mean over the B responses; -norm: that / SCALE; seq-mean-token-mean: each response's sum over its
    own counted tokens (0 without any), mean over the B responses. Returns (loss, d loss / d log_prob rows)."""
    token = TOKEN_LOOPS[loss_mode]
    batch = len(lengths)
    n_all = sum(bool(counted[i, t]) for i in range(batch) for t in range(lengths[i]))
    loss, grads = 0.0, []
    for i, n in enumerate(lengths):
        cells = [t for t in range(n) if counted[i, t] or summed[i, t]]
        row_sum, row_grad = 0.0, [0.0] * n
        for t in cells:
            o, p = float(tensors["old_log_prob"][i, t]), float(tensors["log_prob"][i, t])
            a = float(tensors["advantages"][i, t]) if summed[i, t] else 0.0
            value, row_grad[t] = token(o, p, a)
            row_sum += value
        if mode == "token-mean":
            factor = 1.0 / n_all
        elif mode == "token-sum":
            factor = 1.0
        elif mode == "seq-mean-token-sum":
            factor = 1.0 / batch
        elif mode == "seq-mean-token-sum-norm":
            factor = 1.0 / batch / SCALE
        elif mode == "seq-mean-token-mean":
            factor = 1.0 / len(cells) / batch if cells else 0.0
        else:
            raise AssertionError(mode)
        loss += row_sum * factor
        grads.append([g * factor for g in row_grad])
    return loss, grads


def through_verl(fn, tensors, lengths, prompt_lens, summed, counted, splits):
    rows = rows_of(tensors, lengths, summed, counted)
    return run_micro_batches(fn, rows, prompt_lens, splits, int(counted.sum()))


def assert_matches(got, want):
    (total, grads), (expected, expected_grads) = got, want
    assert total == pytest.approx(expected, rel=1e-10, abs=1e-15)
    for row, (g, w) in enumerate(zip(grads, expected_grads)):
        assert g == pytest.approx(w, rel=1e-9, abs=1e-15), row


def test_the_modes_are_verls():
    """The list the checks and the tests walk is verl 0.9.1's: each one is accepted by ``agg_loss``."""
    assert CHECKED_MODES == LOSS_AGG_MODES
    for mode in LOSS_AGG_MODES:
        agg_loss(torch.ones(2, 3), torch.ones(2, 3), mode)
    with pytest.raises(ValueError, match="Invalid loss_agg_mode"):
        agg_loss(torch.ones(2, 3), torch.ones(2, 3), "seq-sum")


def assert_the_loops_tell_the_losses_apart(tensors, lengths, summed, counted, mode: str, loss_mode: str):
    """The batch tells the losses apart: DCPO's bounds bind where PPO's do not, so a dcpo case checked against
    masked_clip's loop (or the reverse) would fail."""
    other = next(name for name in EXACT_LOSSES if name != loss_mode)
    own, _ = reference(tensors, lengths, summed, counted, mode, loss_mode)
    assert own != pytest.approx(reference(tensors, lengths, summed, counted, mode, other)[0], rel=1e-6)


# Lopti runs with masked_clip only (the pre-flight's Lopti check refuses dcpo): dcpo's count is checked by the
# folded masks' test below, where 20-Entropy's "all" keeps tokens in the count only as a Lopti phase does
@pytest.mark.parametrize("loss_mode", ["masked_clip"])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("splits", [[10], [3, 4, 3], [1] * 10])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_lopti_phases_are_the_authors_formulation_under_every_mode(mode, splits, seed, loss_mode):
    """Each phase's update (the other phase counted, not summed) through ``masked_clip``."""
    tensors, lengths, prompt_lens = random_batch(seed)
    mask = tensors["response_mask"]
    low = low_probability(tensors["old_log_prob"], ETA)
    phases = dict(zip(PHASES, phase_masks(mask, low)))
    assert not (phases["low"][0].any() or phases["high"][1].any())  # rows without a token of one phase
    fn = loss_fn(mode, lopti=True, loss_mode=loss_mode)
    totals = {}
    for phase, summed in phases.items():
        total, grads, _ = through_verl(fn, tensors, lengths, prompt_lens, summed, mask, splits)
        assert_matches((total, grads), reference(tensors, lengths, summed, mask, mode, loss_mode))
        totals[phase] = total
    assert_the_loops_tell_the_losses_apart(tensors, lengths, phases["low"], mask, mode, loss_mode)
    # at the same parameters the two phases add up to the loss over every token (docs/algorithm.md 7)
    whole, _ = reference(tensors, lengths, mask, mask, mode, loss_mode)
    assert totals["low"] + totals["high"] == pytest.approx(whole, rel=1e-10)
    assert totals["low"] != 0.0 and totals["high"] != 0.0


@pytest.mark.parametrize("loss_mode", EXACT_LOSSES)
@pytest.mark.parametrize("splits", [[10], [4, 6]])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name, extra", [("entropy20", {}), ("entropy20", {"entropy_denominator": "kept"}),
                                         ("stapo", {"tau_p": 0.2})])
def test_folded_masks_are_their_objective_under_every_mode(name, extra, mode, splits, loss_mode):
    """20-Entropy's ``all`` counts every response token in each sequence's count; ``kept`` and STAPO count
    the tokens they sum; through ``masked_clip`` and ``dcpo`` alike."""
    tensors, lengths, prompt_lens = random_batch(3)
    summed, counted, built = fold_as_trainer(tensors, MaskSettings(token_mask=name, **extra))
    summed, counted = summed.bool(), counted.bool()
    assert built.drop_response.any()
    assert (not torch.equal(summed, counted)) == (extra == {} and name == "entropy20")
    fn = loss_fn(mode, token_mask=name, loss_mode=loss_mode, **extra)
    total, grads, _ = through_verl(fn, tensors, lengths, prompt_lens, summed, counted, splits)
    assert_matches((total, grads), reference(tensors, lengths, summed, counted, mode, loss_mode))
    assert_the_loops_tell_the_losses_apart(tensors, lengths, summed, counted, mode, loss_mode)


def test_the_phase_count_alone_is_another_objective():
    """The issue's finding, on verl's own ``agg_loss``: the phase's mask handed over as the count agrees with the
    authors' formulation under token-mean (the count comes from loss_mask) but not under seq-mean-token-mean."""
    loss_mat = torch.tensor([[0.5, -1.0, 0.3, 0.0], [0.2, 0.4, -0.7, 0.9]], dtype=torch.float64)
    whole = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    phase = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 0]], dtype=torch.bool)
    zeroed = torch.where(phase, loss_mat, torch.zeros_like(loss_mat))
    info = {"batch_num_tokens": int(whole.sum()), "global_batch_size": 2, "dp_size": 1}
    token_mean = [agg_loss(zeroed, mask, "token-mean", **info) for mask in (phase, whole)]
    assert float(token_mean[0]) == pytest.approx(float(token_mean[1]), rel=1e-15)
    seq_phase, seq_whole = (float(agg_loss(zeroed, mask, "seq-mean-token-mean", **info)) for mask in (phase, whole))
    assert seq_whole == pytest.approx((0.5 / 3 + (0.4 - 0.7) / 4) / 2, rel=1e-12)
    assert seq_phase == pytest.approx((0.5 / 1 + (0.4 - 0.7) / 2) / 2, rel=1e-12)


def test_the_loss_refuses_a_per_sequence_count_it_was_not_handed():
    """verl's stock ``ppo_loss`` (no STAPO loss wrapper) cannot hand the count to the loss: refused, not wrong."""
    tensors, lengths, prompt_lens = random_batch(0, count=4)
    mask = tensors["response_mask"]
    summed = phase_masks(mask, low_probability(tensors["old_log_prob"], ETA))[0]
    rows = rows_of(tensors, lengths, summed, mask)
    for mode in LOSS_AGG_MODES:
        config = _config(mode, (("lopti", True),))
        model_output, data, _ = make_micro_batch(rows, prompt_lens, int(mask.sum()), len(lengths))
        with folded_mask_update():
            if mode == "seq-mean-token-mean":
                with pytest.raises(RuntimeError, match="loss_agg_mode=seq-mean-token-mean divides each sequence"):
                    ppo_loss(config, model_output, data)
            else:  # the count is not read per sequence: the stock path is exact
                loss, _ = ppo_loss(config, model_output, data)
                expected, _ = reference(tensors, lengths, summed, mask, mode)
                assert float(loss.detach()) == pytest.approx(expected, rel=1e-10)


# (rule settings, loss_mode, loss_agg_mode, KL or entropy bonus) -> refused?
RULES = {
    "lopti": MaskSettings(lopti=True).count_only_rule,
    "entropy20-all": MaskSettings(token_mask="entropy20").count_only_rule,
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_which_pairs_are_refused(mode):
    per_sequence = mode == "seq-mean-token-mean"
    for rule in (None, *RULES.values()):
        for loss_mode in EXACT_LOSSES:
            check_aggregation(rule, loss_mode, mode, regularised=False)  # exact: the loss is handed the count
        for loss_mode in ("vanilla", "cispo"):
            if rule is not None and per_sequence:
                with pytest.raises(STAPOConfigError, match=r"^actor_rollout_ref\.actor\.loss_agg_mode=") as error:
                    check_aggregation(rule, loss_mode, mode, regularised=False)
                assert str(error.value).endswith(f"loss_mode to one of {list(EXACT_LOSSES)}, which hand verl the count")
            else:
                check_aggregation(rule, loss_mode, mode, regularised=False)
        if rule is None:
            check_aggregation(rule, "gspo", mode, regularised=True)
            continue
        with pytest.raises(STAPOConfigError, match=r"policy_loss\.loss_mode=gspo with "):
            check_aggregation(rule, "gspo", mode, regularised=False)
        for loss_mode in EXACT_LOSSES:
            if per_sequence:
                with pytest.raises(STAPOConfigError, match=r"KL loss and entropy bonus \(on here\) would divide"):
                    check_aggregation(rule, loss_mode, mode, regularised=True)
            else:
                check_aggregation(rule, loss_mode, mode, regularised=True)
    assert MaskSettings(token_mask="entropy20", entropy_denominator="kept").count_only_rule is None
    assert MaskSettings(token_mask="stapo").count_only_rule is None


def test_the_exact_losses_are_the_allowed_ones():
    """The losses let through under seq-mean-token-mean with a rule are exactly those whose loops above run
    (EXACT_LOSSES): dropping ``dcpo`` from the loops, or allowing a loss no loop checks, fails here. Every loss in
    verl's registry (the project's registered too) is tried."""
    assert COUNT_MASK_LOSSES == EXACT_LOSSES == (LOSS_NAME, DCPO_LOSS_NAME)
    assert set(EXACT_LOSSES) <= set(POLICY_LOSS_REGISTRY) and set(TOKEN_LOOPS) == set(EXACT_LOSSES)
    for rule in RULES.values():
        allowed = set()
        for loss_mode in POLICY_LOSS_REGISTRY:
            try:
                check_aggregation(rule, loss_mode, "seq-mean-token-mean", regularised=False)
            except STAPOConfigError:
                continue
            allowed.add(loss_mode)
        assert allowed == set(EXACT_LOSSES), rule


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (["algo=lopti", f"{ACTOR}.loss_agg_mode=seq-mean-token-mean"], False),
        (["algo=entropy20", f"{PL}.loss_mode=dcpo", f"{ACTOR}.loss_agg_mode=seq-mean-token-mean"], False),
        (["algo=dcpo", f"{PL}.token_mask=entropy20", f"{ACTOR}.loss_agg_mode=seq-mean-token-mean"], False),
        (["algo=dcpo", f"{PL}.token_mask=entropy20", f"{ACTOR}.loss_agg_mode=seq-mean-token-mean",
          f"{ACTOR}.use_kl_loss=true"], True),
        (["algo=lopti", f"{ACTOR}.loss_agg_mode=seq-mean-token-mean", f"{ACTOR}.use_kl_loss=true"], True),
        (["algo=entropy20", f"{ACTOR}.loss_agg_mode=seq-mean-token-mean", f"{ACTOR}.entropy_coeff=0.001"], True),
        (["algo=entropy20", f"{PL}.loss_mode=vanilla", f"{ACTOR}.loss_agg_mode=seq-mean-token-mean"], True),
        (["algo=entropy20", f"{PL}.loss_mode=vanilla", f"{ACTOR}.loss_agg_mode=seq-mean-token-sum"], False),
        (["algo=entropy20", f"{PL}.loss_mode=gspo"], True),
        (["algo=entropy20", f"{PL}.entropy_denominator=kept", f"{PL}.loss_mode=gspo"], False),
    ],
)
def test_the_refusal_runs_with_the_pre_flight_checks(overrides, refused):
    config = recipe_config("model_preset=tiny", *overrides)
    if not refused:
        validate_run_config(config)
        return
    with pytest.raises(STAPOConfigError) as error:
        validate_run_config(config)
    message = str(error.value)
    assert "\n" not in message and ("loss_agg_mode=" in message or "loss_mode=gspo" in message)
    if "loss_agg_mode=" in message:
        assert f"must be one of {[m for m in LOSS_AGG_MODES if m != 'seq-mean-token-mean']}" in message
