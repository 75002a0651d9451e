"""DCPO's loss (stapo/algorithm/dcpo.py, the registered ``dcpo`` loss) against an independent float64 loop.

The bounds per token (q = 1, tiny q where the lower bound bottoms out at 1/2 and the upper one hits the cap
max(c, 10), q = 0, NaN); then the loss through verl's real path (``STAPOLossFn`` -> verl's ``ppo_loss`` ->
``dcpo`` -> ``agg_loss``) with the preset as Hydra composes it, on fresh random ratios across both bounds and the
dual clip, split in 1, 3 and 10 micro-batches: the summed loss, every token's gradient and the ``actor/dcpo/*``
metrics equal the loop's; the same with S2T's mask folded in (the kept tokens only, their count); an empty
micro-batch is an exact 0; all-negative advantages; a NaN old log-prob at a response token refuses the update
(NaN gradient, ``refused_micro_batches`` 1) while NaNs at padded positions never reach it.
"""

from __future__ import annotations

import math

import pytest
import torch

from stapo.algorithm.dcpo import dcpo_pg_losses, dcpo_ratio_bounds

NAN = float("nan")
EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 10.0


def loop_bounds(old_lp: float, eps_low: float = EPS_LOW, eps_high: float = EPS_HIGH, c: float = C):
    q = math.exp(old_lp)
    cap = max(c, 10.0)
    if q == 0.0:
        return 1.0, cap
    low = 0.5 + 0.5 * math.sqrt(max(1.0 - 4.0 * eps_low / q, 0.0))
    high = min(0.5 + 0.5 * math.sqrt(1.0 + 4.0 * eps_high / q), cap)
    return low, high


def loop_token(old_lp: float, lp: float, a: float) -> tuple[float, float]:
    """One token's DCPO loss and d loss / d lp: -A r where the unclipped branch is active (and not dual-clipped)."""
    low, high = loop_bounds(old_lp)
    raw = lp - old_lp
    r = math.exp(min(max(raw, -20.0), 20.0))
    unclipped, clipped = -a * r, -a * min(max(r, low), high)
    loss, grad = max(unclipped, clipped), (0.0 if clipped > unclipped else -a * r)
    if a < 0 and loss > -a * C:
        loss, grad = -a * C, 0.0
    return loss, (0.0 if abs(raw) > 20.0 else grad)


def test_bounds_equal_the_loop_and_keep_one_inside():
    old = torch.tensor([0.0, -0.1, math.log(0.8), math.log(0.5), math.log(0.2), math.log(0.05), -10.0, -60.0, -800.0,
                        NAN], dtype=torch.float64)
    low, high = dcpo_ratio_bounds(old, EPS_LOW, EPS_HIGH, C)
    for value, lo, hi in zip(old.tolist()[:-1], low.tolist(), high.tolist()):
        want_lo, want_hi = loop_bounds(value)
        assert lo == pytest.approx(want_lo, rel=1e-14) and hi == pytest.approx(want_hi, rel=1e-14), value
        assert 0.5 <= lo <= 1.0 <= hi <= 10.0
    assert low[0].item() == pytest.approx(0.5 + 0.5 * math.sqrt(0.2)) and high[0].item() == pytest.approx(
        0.5 + 0.5 * math.sqrt(2.12))  # q = 1: about PPO's 0.72 / 1.23
    assert low[5].item() == 0.5 and high[6].item() == 10.0  # q < 4 eps_low: the floor; tiny q: the cap
    assert (low[8].item(), high[8].item()) == (1.0, 10.0)  # q underflows to 0: the authors' code gives 1 and the cap
    assert math.isnan(low[-1].item()) and math.isnan(high[-1].item())
    _, capped = dcpo_ratio_bounds(torch.tensor([-60.0], dtype=torch.float64), EPS_LOW, EPS_HIGH, 30.0)
    assert capped.item() == 30.0  # the cap is max(c, 10)


def test_per_token_losses_and_gradient_equal_the_loop_in_float64():
    g = torch.Generator().manual_seed(7)
    old = torch.empty(6, 40, dtype=torch.float64).uniform_(-12.0, 0.0, generator=g)
    shift = torch.empty(6, 40, dtype=torch.float64).uniform_(-1.5, 1.5, generator=g)
    shift[:, ::7] = 3.0  # far past the upper bounds, and the dual clip for A < 0
    shift[0, 0] = 25.0  # the log-ratio clamp
    adv = torch.randn(6, 40, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 40, generator=g) < 0.8
    new = (old + shift).requires_grad_(True)
    losses, flags = dcpo_pg_losses(old, new, adv, mask, EPS_LOW, EPS_HIGH, C)
    losses.sum().backward()
    for i in range(6):
        for t in range(40):
            want, grad = loop_token(old[i, t].item(), new[i, t].item(), adv[i, t].item()) if mask[i, t] else (0.0, 0.0)
            assert losses[i, t].item() == pytest.approx(want, rel=1e-12, abs=1e-300), (i, t)
            assert new.grad[i, t].item() == pytest.approx(grad, rel=1e-12, abs=1e-300), (i, t)
    assert bool(flags["clipped"][mask].any()) and bool(flags["dual_clipped"][mask].any())


# --- through verl's real loss path ----------------------------------------------------------------------------------


def dcpo_batch(seed: int, case: str = "random"):
    from tests.integration.test_verl_loss_path import random_batch

    tensors, lengths, prompt_lens = random_batch(seed)
    if case == "all_negative":
        tensors["advantages"] = -tensors["advantages"].abs()
    elif case == "extreme":
        pick = torch.rand(tensors["old_log_prob"].shape, generator=torch.Generator().manual_seed(seed)) < 0.3
        tensors["old_log_prob"][pick] = 0.0  # p = 1
        tensors["old_log_prob"][~pick & (tensors["old_log_prob"] < -10)] = -60.0
        tensors["log_prob"] = tensors["old_log_prob"] + 0.5
    # padded positions hold NaN: they must never reach the loss
    tensors["old_log_prob"][~tensors["response_mask"]] = NAN
    return tensors, lengths, prompt_lens


def run_dcpo(tensors, lengths, prompt_lens, splits, *overrides):
    from stapo.algorithm.masks import MaskSettings
    from stapo.verl_plugin.training.losses import STAPOLossFn
    from tests.integration.test_preset_losses import preset_actor
    from tests.integration.test_verl_loss_path import ragged_rows
    from tests.integration.verl_batches import fold_as_trainer, run_micro_batches

    config = preset_actor("dcpo", *overrides)
    assert config.policy_loss.loss_mode == "dcpo"
    response_mask, loss_mask, _ = fold_as_trainer(tensors, MaskSettings.from_mapping(config.policy_loss))
    rows = ragged_rows(tensors, lengths, response_mask, loss_mask)
    rows.pop("model_entropy")
    result = run_micro_batches(STAPOLossFn(config), rows, prompt_lens, splits, int(loss_mask.sum()))
    return result, response_mask.bool()


def loop_objective(tensors, keep):
    count = int(keep.sum())
    total, grads, lows, highs = 0.0, [], [], []
    for i in range(keep.shape[0]):
        row = []
        for t in range(keep.shape[1]):
            if not keep[i, t]:
                row.append(0.0)
                continue
            o, n, a = (float(tensors[k][i, t]) for k in ("old_log_prob", "log_prob", "advantages"))
            loss, grad = loop_token(o, n, a)
            total += loss
            row.append(grad / count)
            lows.append(loop_bounds(o)[0])
            highs.append(loop_bounds(o)[1])
        grads.append(row)
    return total / count, grads, sum(lows) / len(lows), sum(highs) / len(highs)


@pytest.mark.parametrize("case", ["random", "all_negative", "extreme"])
@pytest.mark.parametrize("splits", [[10], [3, 4, 3], [1] * 10])
def test_the_preset_loss_through_verl_equals_the_loop(splits, case):
    tensors, lengths, prompt_lens = dcpo_batch(3, case)
    (total, grads, metrics), keep = run_dcpo(tensors, lengths, prompt_lens, splits)
    want, want_grads, low_mean, high_mean = loop_objective(tensors, keep)
    assert math.isfinite(total) and total == pytest.approx(want, rel=1e-10)
    for row, (got, expected) in enumerate(zip(grads, want_grads)):
        assert got == pytest.approx(expected[: lengths[row]], rel=1e-9, abs=1e-15), row
    assert any(abs(g) > 0 for row in grads for g in row)
    if splits == [10]:  # one micro-batch: verl's metric is the micro-batch's own mean
        assert float(metrics[0]["actor/dcpo/low_bound_mean"].values[0]) == pytest.approx(low_mean, rel=1e-12)
        assert float(metrics[0]["actor/dcpo/high_bound_mean"].values[0]) == pytest.approx(high_mean, rel=1e-12)
        assert 0.0 < float(metrics[0]["actor/dcpo/outside_bounds_frac"].values[0]) < 1.0
        assert float(metrics[0]["actor/stapo/refused_micro_batches"].values[0]) == 0.0


def test_a_folded_s2t_mask_trains_dcpo_over_the_kept_tokens():
    tensors, lengths, prompt_lens = dcpo_batch(4)
    (total, grads, _), keep = run_dcpo(tensors, lengths, prompt_lens, [3, 4, 3],
                                       "actor_rollout_ref.actor.policy_loss.token_mask=stapo")
    assert int(keep.sum()) < int(tensors["response_mask"].sum())  # S2T silenced some tokens
    want, want_grads, _, _ = loop_objective(tensors, keep)
    assert total == pytest.approx(want, rel=1e-10)
    for row, (got, expected) in enumerate(zip(grads, want_grads)):
        assert got == pytest.approx(expected[: lengths[row]], rel=1e-9, abs=1e-15), row


def test_an_empty_micro_batch_is_an_exact_zero_and_a_nan_old_log_prob_refuses():
    tensors, lengths, prompt_lens = dcpo_batch(5)
    tensors["response_mask"][:3] = False  # the first micro-batch [3, ...] holds no response token
    (_, grads, metrics), _ = run_dcpo(tensors, lengths, prompt_lens, [3, 7])
    assert all(g == 0.0 for row in grads[:3] for g in row)
    assert float(metrics[0]["actor/stapo/refused_micro_batches"].values[0]) == 0.0
    tensors, lengths, prompt_lens = dcpo_batch(5)
    tensors["old_log_prob"][1, 0] = NAN  # at a response token
    (total, grads, metrics), _ = run_dcpo(tensors, lengths, prompt_lens, [10])
    assert math.isnan(total) and all(math.isnan(g) for g in grads[0][: lengths[0]])
    assert float(metrics[0]["actor/stapo/refused_micro_batches"].values[0]) == 1.0


@pytest.mark.parametrize(("override", "message"), [
    ("actor_rollout_ref.actor.policy_loss.token_mask=taco",
     "only actor_rollout_ref.actor.policy_loss.loss_mode=masked_clip"),
    ("actor_rollout_ref.actor.policy_loss.source=current", "source=current builds the mask inside the loss"),
])
def test_what_dcpo_cannot_apply_is_refused_before_ray(override, message):
    """A weighted entry's weights and an in-loss mask reach masked_clip only: refused on the driver."""
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.verl_plugin.preflight.run_checks import validate_run_config
    from tests.e2e.test_compose import compose_recipe

    validate_run_config(compose_recipe("model_preset=tiny", "algo=dcpo"))
    extra = ["actor_rollout_ref.actor.policy_loss.token_mask=stapo"] if "source" in override else []
    with pytest.raises(STAPOConfigError, match=message):
        validate_run_config(compose_recipe("model_preset=tiny", "algo=dcpo", *extra, override))
