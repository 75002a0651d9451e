"""The one objective through verl's own actor-loss code path (``STAPOLossFn`` -> ``ppo_loss`` -> the
registered ``masked_clip`` -> ``agg_loss``), against the float64 loop references.

The claim of ``source: old``: once an entry's mask is folded into ``response_mask`` (the sum) and
``loss_mask`` (verl's token count, read before the micro-batches run), verl's normalisation gives
exactly the kept-token mean of docs/algorithm.md section 3, for every registry entry, however the
mini-batch is split into micro-batches.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

from stapo.algorithm.masks import TOKEN_MASK_REGISTRY, MaskSettings
from stapo.verl_plugin.training.jagged import TOKEN_WEIGHT
from stapo.verl_plugin.training.losses import LOSS_TOKENS_METRIC, REFUSED_METRIC, STAPOLossFn, folded_mask_update
from stapo.verl_plugin.training.trainer import in_loss_step_metrics
from tests.integration.verl_batches import (
    actor_config,
    compose_verl,
    fold_as_trainer,
    make_micro_batch,
    metric_values,
    run_micro_batches,
    stapo_overrides,
)
from tests.reference import REFERENCES, reference_masked_loss, reference_spurious

TAU_P, Q = 0.002, 0.75


def random_batch(seed: int, count: int = 10):
    """Padded float64 tensors of ragged responses (lengths 3..25), and each response's prompt length."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 26, (count,), generator=g)
    width = int(lengths.max())
    low = torch.rand(count, width, generator=g) < 0.35
    old = torch.where(
        low,
        torch.empty(count, width, dtype=torch.float64).uniform_(math.log(1e-6), math.log(TAU_P), generator=g),
        torch.empty(count, width, dtype=torch.float64).uniform_(math.log(TAU_P), 0.0, generator=g),
    )
    # ratios across both clip edges and the dual-clip region (A < 0, ratio > 10)
    shift = torch.empty(count, width, dtype=torch.float64).uniform_(-0.6, 0.6, generator=g)
    shift[::4, ::5] = 2.5
    sign = torch.tensor([-1.0 if i % 3 == 0 else 1.0 for i in range(count)], dtype=torch.float64)
    advantages = (sign * (0.1 + torch.rand(count, generator=g, dtype=torch.float64))).unsqueeze(-1).expand(-1, width)
    tensors = {
        "old_log_prob": old,
        "log_prob": old + shift,
        "entropy": torch.rand(count, width, generator=g, dtype=torch.float64) * 4,
        "model_entropy": torch.rand(count, width, generator=g) * 4,
        "advantages": advantages.clone(),
        "response_mask": torch.arange(width).unsqueeze(0) < lengths.unsqueeze(-1),
    }
    prompt_lens = torch.randint(2, 7, (count,), generator=g).tolist()
    return tensors, lengths.tolist(), prompt_lens


def ragged_rows(tensors, lengths, response_mask, loss_mask, weight=None):
    """Rows cut to each response's length, as verl's jagged batches hold them (with a weighted entry's folded
    ``weight``, as the fold stores it)."""
    rows = {key: tensors[key] for key in ("old_log_prob", "log_prob", "advantages", "model_entropy")}
    rows.update(response_mask=response_mask.long(), loss_mask=loss_mask.long())
    if weight is not None:
        rows[TOKEN_WEIGHT] = weight
    return {key: [value[i, :n] for i, n in enumerate(lengths)] for key, value in rows.items()}


def as_lists(tensors) -> dict:
    return {key: value.tolist() for key, value in tensors.items()}


def reference_for_entry(tensors, settings: MaskSettings):
    """The loop reference of a folded entry: the entry's reference mask, then the kept-token objective."""
    if settings.token_mask not in REFERENCES:
        pytest.fail(f"token mask {settings.token_mask!r} has no loop reference in tests/reference.py")
    lists = as_lists(tensors)
    lists["log_prob"] = lists["old_log_prob"]  # source=old: the mask reads the old-policy pass
    expected = REFERENCES[settings.token_mask](lists, dataclasses.asdict(settings))
    mask = lists["response_mask"]
    keep = [[m and not d for m, d in zip(rm, rd)] for rm, rd in zip(mask, expected["drop_response"])]
    count = sum(m and not d for rm, rd in zip(mask, expected["drop_count"]) for m, d in zip(rm, rd))
    new = tensors["log_prob"].tolist()
    loss, grad = reference_masked_loss(
        lists["old_log_prob"], new, lists["advantages"], keep, count, weights=expected["weight"]
    )
    return loss, grad, keep, count


# entries whose defaults change nothing on these inputs: STARE's gate is off above its target entropy (0.3)
ACTIVE = {"stare": {"stare_target_entropy": 100.0, "stare_variant": "C2"}}
VARIANTS = [(name, ACTIVE.get(name, {})) for name in sorted(TOKEN_MASK_REGISTRY)] + [
    ("stapo", {"entropy_quantile": 0.5, "tau_p": 0.01}),
    ("entropy20", {"entropy_denominator": "kept", "entropy_top_fraction": 0.35}),
]


VARIANT_IDS = [f"{n}-{'-'.join(map(str, e.values())) or 'defaults'}" for n, e in VARIANTS]


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("splits", [[10], [3, 4, 3], [1] * 10])
@pytest.mark.parametrize("name, extra", VARIANTS, ids=VARIANT_IDS)
def test_every_folded_mask_gives_the_reference_loss_and_gradient(name, extra, splits, seed):
    tensors, lengths, prompt_lens = random_batch(seed)
    settings = MaskSettings(token_mask=name, **extra)
    response_mask, loss_mask, built = fold_as_trainer(tensors, settings)
    if name != "none":  # the mask (or the weight) really changes the objective
        assert built.drop_response.any() or bool((built.weight[tensors["response_mask"]] < 1).any())
    loss_fn = STAPOLossFn(actor_config(token_mask=name, **extra))
    batch_tokens = int(loss_mask.sum())
    rows = ragged_rows(tensors, lengths, response_mask, loss_mask, built.weight)
    total, grads, metrics = run_micro_batches(loss_fn, rows, prompt_lens, splits, batch_tokens)

    expected, expected_grad, _, count = reference_for_entry(tensors, settings)
    assert count == batch_tokens == built.counts["num_loss_tokens_expected"]
    assert total == pytest.approx(expected, rel=1e-10)
    for row, got, want in zip(range(len(lengths)), grads, expected_grad):
        assert got == pytest.approx(want[: lengths[row]], rel=1e-9, abs=1e-15), row
    for m in metrics:  # what the trainer compares with the count the mask left
        assert metric_values(m) == {LOSS_TOKENS_METRIC: float(batch_tokens), REFUSED_METRIC: 0.0}


@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm"])
def test_masked_clip_is_verls_vanilla_objective_over_the_folded_mask(agg):
    """Paired with verl's own ``vanilla`` loss (independent code): same value, gradient and clip metrics for
    every aggregation mode, with rollout importance weights, where no value is degenerate."""
    tensors, lengths, prompt_lens = random_batch(4)
    response_mask, loss_mask, _ = fold_as_trainer(tensors, MaskSettings(token_mask="stapo"))
    rows = ragged_rows(tensors, lengths, response_mask, loss_mask)
    weights = torch.rand(tensors["log_prob"].shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    rows["rollout_is_weights"] = [(0.5 + weights[i, :n]) for i, n in enumerate(lengths)]
    results = {}
    for mode in ("masked_clip", "vanilla"):
        overrides = stapo_overrides(loss_mode=mode, token_mask="stapo")
        overrides.append(f"actor_rollout_ref.actor.loss_agg_mode={agg}")
        config = omega_conf_to_dataclass(compose_verl(overrides).actor_rollout_ref.actor)
        total, grads, metrics = run_micro_batches(STAPOLossFn(config), rows, prompt_lens, [4, 6], int(loss_mask.sum()))
        clip_metrics = {k: m for k, m in metrics[0].items() if k.startswith(("actor/pg_", "actor/ppo_kl"))}
        clip = {k: [float(v) for v in m.values] for k, m in clip_metrics.items()}
        results[mode] = (total, grads, clip)
    (ours, our_grads, our_clip), (theirs, their_grads, their_clip) = results["masked_clip"], results["vanilla"]
    assert ours == pytest.approx(theirs, rel=1e-12) and ours != 0.0
    for got, want in zip(our_grads, their_grads):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-18)
    assert our_clip.keys() == their_clip.keys() and len(our_clip) == 4  # clipfrac, lower, ppo_kl, pg_loss
    for key in our_clip:
        assert our_clip[key] == pytest.approx(their_clip[key], rel=1e-12, abs=1e-15), key


def test_masking_inside_the_loss_alone_would_keep_the_wrong_denominator():
    """Why the trainer folds into loss_mask: zeroing only response_mask leaves silenced tokens counted."""
    tensors, lengths, prompt_lens = random_batch(0)
    response_mask, loss_mask, _ = fold_as_trainer(tensors, MaskSettings(token_mask="stapo"))
    mask = tensors["response_mask"]
    loss_fn = STAPOLossFn(actor_config(token_mask="stapo"))
    unfolded, _, _ = run_micro_batches(
        loss_fn, ragged_rows(tensors, lengths, response_mask, mask), prompt_lens, [10], int(mask.sum())
    )
    folded, _, _ = run_micro_batches(
        loss_fn, ragged_rows(tensors, lengths, response_mask, loss_mask), prompt_lens, [10], int(loss_mask.sum())
    )
    assert folded == pytest.approx(unfolded * int(mask.sum()) / int(loss_mask.sum()), rel=1e-10)
    assert folded != pytest.approx(unfolded, rel=1e-6)


@pytest.mark.parametrize("splits", [[10], [4, 6]])
def test_source_current_detects_on_the_update_forward_and_rescales(splits):
    tensors, lengths, prompt_lens = random_batch(7)
    mask = tensors["response_mask"]
    rows = ragged_rows(tensors, lengths, mask, mask)
    num_tokens = int(mask.sum())
    loss_fn = STAPOLossFn(actor_config(token_mask="stapo", source="current"))
    total, _, metrics = run_micro_batches(loss_fn, rows, prompt_lens, splits, num_tokens)

    # reference: per micro-batch, S2T on the current log-probs and the forward's (float32) entropy, tau_h
    # over that micro-batch, the micro-batch's share of the mini-batch scaled to its kept-token mean
    expected, start, spurious_total = 0.0, 0, 0
    for size, m in zip(splits, metrics):
        part = slice(start, start + size)
        new, ent = tensors["log_prob"][part].tolist(), tensors["model_entropy"][part].double().tolist()
        adv, part_mask = tensors["advantages"][part].tolist(), mask[part].tolist()
        spurious, tau_h = reference_spurious(new, ent, adv, part_mask, TAU_P, Q)
        keep = [[bool(a) and not s for a, s in zip(rm, rs)] for rm, rs in zip(part_mask, spurious)]
        kept = sum(map(sum, keep))
        mean, _ = reference_masked_loss(tensors["old_log_prob"][part].tolist(), new, adv, keep, kept)
        expected += mean * sum(map(sum, part_mask)) / num_tokens
        spurious_total += sum(map(sum, spurious))
        got = metric_values(m, "actor/stapo/_sum/")
        assert got["actor/stapo/_sum/tau_h"] == pytest.approx(tau_h, rel=1e-12)
        assert got["actor/stapo/_sum/num_loss_tokens_expected"] == kept
        start += size
    assert total == pytest.approx(expected, rel=1e-10)
    assert spurious_total > 0
    # verl sums SUM metrics over the micro-batches of a mini-batch; the trainer turns them into step totals
    reduced = {}
    for m in metrics:
        for key, metric in m.items():
            if key.startswith("actor/stapo/_sum/"):
                reduced[key] = reduced.get(key, 0.0) + float(metric.values[0])
    counts, stats = in_loss_step_metrics(reduced, updates_per_epoch=1)
    assert counts["num_spurious"] == spurious_total and counts["num_response_tokens"] == num_tokens
    assert math.isfinite(stats["tau_h"])


def test_in_loss_mask_refuses_to_run_without_the_stapo_trainer_or_entropy():
    tensors, lengths, prompt_lens = random_batch(1, count=2)
    mask = tensors["response_mask"]
    rows = ragged_rows(tensors, lengths, mask, mask)
    config = actor_config(token_mask="stapo", source="current")
    model_output, data, _ = make_micro_batch(rows, prompt_lens, int(mask.sum()), 2)
    with pytest.raises(RuntimeError, match="trainer_mode=stapo"):
        ppo_loss(config, model_output, data)  # verl's stock loss function: no wrapper, no entropy handed over
    rows.pop("model_entropy")
    with pytest.raises(RuntimeError, match="calculate_entropy=true"):
        run_micro_batches(STAPOLossFn(config), rows, prompt_lens, [2], int(mask.sum()))


def test_folded_masks_need_no_wrapper_context():
    """``source: old`` reaches the loss through the masks alone: verl's stock ``ppo_loss`` gives the same."""
    tensors, lengths, prompt_lens = random_batch(2)
    response_mask, loss_mask, _ = fold_as_trainer(tensors, MaskSettings(token_mask="entropy20"))
    rows = ragged_rows(tensors, lengths, response_mask, loss_mask)
    rows.pop("model_entropy")
    config = actor_config(token_mask="entropy20")
    model_output, data, _ = make_micro_batch(rows, prompt_lens, int(loss_mask.sum()), len(lengths))
    with folded_mask_update():  # the span in which the STAPO actor worker runs verl's update
        stock, _ = ppo_loss(config, model_output, data)
    wrapped, _, _ = run_micro_batches(STAPOLossFn(config), rows, prompt_lens, [len(lengths)], int(loss_mask.sum()))
    assert float(stock.detach()) == pytest.approx(wrapped, rel=1e-12)


def test_in_loss_step_metrics_are_step_totals_and_means_where_defined():
    """verl hands the trainer each SUM metric summed over a mini-batch's micro-batches and averaged over
    the mini-batches; counts become step totals, thresholds the mean over the micro-batches that had one."""
    reduced = {
        "actor/stapo/_sum/num_spurious": 3.0,
        "actor/stapo/_sum/tau_h": 2.4,
        "actor/stapo/_sum/tau_h#defined": 2.0,
        "actor/stapo/_sum/entropy_p50": 0.0,
        "actor/stapo/_sum/entropy_p50#defined": 0.0,
        "actor/pg_loss": 7.0,
    }
    counts, stats = in_loss_step_metrics(reduced, updates_per_epoch=4)
    assert counts == {"num_spurious": 12.0}
    assert stats["tau_h"] == pytest.approx(1.2) and math.isnan(stats["entropy_p50"]) and len(stats) == 2


def test_a_folded_mask_outside_the_stapo_worker_is_refused_by_the_loss():
    """verl's own trainers (main_ppo with trainer_mode=sync, the legacy trainer) call the registered loss
    without the STAPO worker's fold: the loss refuses instead of training JustRL under STAPO's name."""
    tensors, lengths, prompt_lens = random_batch(2)
    mask = tensors["response_mask"]
    rows = ragged_rows(tensors, lengths, mask, mask)
    rows.pop("model_entropy")
    for name in ("stapo", "entropy20"):
        config = actor_config(token_mask=name)
        model_output, data, _ = make_micro_batch(rows, prompt_lens, int(mask.sum()), len(lengths))
        with pytest.raises(RuntimeError, match=r"token_mask=%s .*trainer\.v1\.trainer_mode=stapo" % name):
            ppo_loss(config, model_output, data)
    model_output, data, _ = make_micro_batch(rows, prompt_lens, int(mask.sum()), len(lengths))
    loss, _ = ppo_loss(actor_config(token_mask="none"), model_output, data)  # nothing to fold: trains
    assert torch.isfinite(loss)
