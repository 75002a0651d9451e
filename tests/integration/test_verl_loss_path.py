"""STAPO through verl's own actor-loss code path (``ppo_loss`` -> registry -> ``agg_loss``).

The claim of ``source: old``: once the S2T mask is folded into ``response_mask`` and ``loss_mask``,
verl's normalisation (token count from ``loss_mask`` before the micro-batches run) gives exactly the
valid-token mean of spec section 3, however the mini-batch is split into micro-batches.
"""

from __future__ import annotations

import math

import pytest
import torch
from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import ppo_loss

from stapo.s2t import detect_spurious
from stapo.verl_plugin.losses import MASK_FOLDED_KEY, STAPOLossFn
from stapo.verl_plugin.trainer import fold_masks
from tests.integration.verl_batches import actor_config, make_micro_batch
from tests.reference import reference_clipped_token_loss, reference_spurious

TAU_P, Q = 0.002, 0.75


def random_rows(seed: int, count: int = 10):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 26, (count,), generator=g).tolist()
    prompt_lens = torch.randint(2, 7, (count,), generator=g).tolist()
    rows = {"log_prob": [], "old_log_prob": [], "entropy": [], "model_entropy": [], "advantages": []}
    for i, n in enumerate(lengths):
        low = torch.rand(n, generator=g) < 0.35
        old = torch.where(
            low,
            torch.empty(n, dtype=torch.float64).uniform_(math.log(1e-6), math.log(TAU_P), generator=g),
            torch.empty(n, dtype=torch.float64).uniform_(math.log(TAU_P), 0.0, generator=g),
        )
        rows["old_log_prob"].append(old)
        rows["log_prob"].append(old + torch.empty(n, dtype=torch.float64).uniform_(-0.6, 0.6, generator=g))
        rows["entropy"].append(torch.rand(n, generator=g, dtype=torch.float64) * 4)
        rows["model_entropy"].append(torch.rand(n, generator=g) * 4)
        sign = -1.0 if i % 3 == 0 else 1.0
        rows["advantages"].append(torch.full((n,), sign * (0.1 + float(torch.rand(1, generator=g))), dtype=torch.float64))
    return rows, lengths, prompt_lens


def padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


def valid_mean_and_grad(rows, valid):
    """Loop reference: mean clipped loss over valid tokens and d/d log_prob per token."""
    count = sum(sum(v) for v in valid)
    total, grads = 0.0, []
    for i, row_valid in enumerate(valid):
        row_grad = []
        for t, ok in enumerate(row_valid):
            lp, old, a = float(rows["log_prob"][i][t]), float(rows["old_log_prob"][i][t]), float(rows["advantages"][i][t])
            g = 0.0
            if ok:
                total += reference_clipped_token_loss(old, lp, a, 0.2, 0.28, 10.0)
                ratio = math.exp(lp - old)
                unclipped, clipped = -a * ratio, -a * min(max(ratio, 0.8), 1.28)
                if unclipped >= clipped and not (a < 0 and unclipped > -a * 10.0):
                    g = -a * ratio / count
            row_grad.append(g)
        grads.append(row_grad)
    return total / count, grads


def run_micro_batches(loss_fn, rows, prompt_lens, splits, batch_num_tokens, folded=True):
    total, grads = 0.0, []
    start = 0
    for size in splits:
        part = {key: value[start : start + size] for key, value in rows.items()}
        model_output, data, leaf = make_micro_batch(part, prompt_lens[start : start + size], batch_num_tokens, len(prompt_lens))
        tu.assign_non_tensor(data, **{MASK_FOLDED_KEY: folded})
        loss, _ = loss_fn(model_output=model_output, data=data)
        loss.backward()
        total += float(loss.detach())
        offset = 0
        for p, r in zip(prompt_lens[start : start + size], part["log_prob"]):
            grads.append(leaf.grad[offset + p - 1 : offset + p - 1 + len(r)].tolist())
            offset += p + len(r)
        start += size
    return total, grads


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("splits", [[10], [3, 4, 3], [1] * 10])
def test_source_old_folded_mask_gives_exact_valid_token_mean(seed, splits):
    rows, lengths, prompt_lens = random_rows(seed)
    width = max(lengths)
    mask = padded([torch.ones(n) for n in lengths], width).bool()
    detection = detect_spurious(
        padded(rows["old_log_prob"], width), padded(rows["entropy"], width), padded(rows["advantages"], width), mask,
        TAU_P, Q,
    )
    assert detection.spurious.any()
    response_mask, loss_mask = fold_masks(mask.long(), mask.long(), detection.spurious, detection.spurious)
    rows["response_mask"] = [response_mask[i, :n] for i, n in enumerate(lengths)]
    rows["loss_mask"] = [loss_mask[i, :n] for i, n in enumerate(lengths)]

    loss_fn = STAPOLossFn(actor_config(loss_mode="stapo", source="old"))
    total, grads = run_micro_batches(loss_fn, rows, prompt_lens, splits, int(loss_mask.sum()))

    spurious, _ = reference_spurious(
        [r.tolist() for r in rows["old_log_prob"]], [r.tolist() for r in rows["entropy"]],
        [r.tolist() for r in rows["advantages"]], [[True] * n for n in lengths], TAU_P, Q,
    )
    valid = [[not s for s in spurious[i][:n]] for i, n in enumerate(lengths)]
    expected, expected_grads = valid_mean_and_grad(rows, valid)
    assert total == pytest.approx(expected, rel=1e-10)
    for got_row, want_row in zip(grads, expected_grads):
        assert got_row == pytest.approx(want_row, rel=1e-9, abs=1e-15)


def test_masking_inside_the_loss_alone_would_keep_the_wrong_denominator():
    """Why the trainer folds into loss_mask: zeroing only response_mask leaves silenced tokens counted."""
    rows, lengths, prompt_lens = random_rows(0)
    width = max(lengths)
    mask = padded([torch.ones(n) for n in lengths], width).bool()
    spurious = detect_spurious(
        padded(rows["old_log_prob"], width), padded(rows["entropy"], width), padded(rows["advantages"], width), mask
    ).spurious
    response_mask, _ = fold_masks(mask.long(), mask.long(), spurious, spurious)
    rows["response_mask"] = [response_mask[i, :n] for i, n in enumerate(lengths)]
    rows["loss_mask"] = [torch.ones(n, dtype=torch.long) for n in lengths]
    loss_fn = STAPOLossFn(actor_config(loss_mode="stapo", source="old"))
    unfolded, _ = run_micro_batches(loss_fn, rows, prompt_lens, [10], int(mask.sum()))
    rows["loss_mask"] = rows["response_mask"]
    folded, _ = run_micro_batches(loss_fn, rows, prompt_lens, [10], int(response_mask.sum()))
    assert folded == pytest.approx(unfolded * int(mask.sum()) / int(response_mask.sum()), rel=1e-10)
    assert folded != pytest.approx(unfolded, rel=1e-6)


@pytest.mark.parametrize("splits", [[10], [4, 6]])
def test_source_current_detects_on_update_forward_and_rescales(splits):
    rows, lengths, prompt_lens = random_rows(7)
    rows["response_mask"] = [torch.ones(n, dtype=torch.long) for n in lengths]
    rows["loss_mask"] = rows["response_mask"]
    num_tokens = sum(lengths)
    loss_fn = STAPOLossFn(actor_config(loss_mode="stapo", source="current"))
    total, _ = run_micro_batches(loss_fn, rows, prompt_lens, splits, num_tokens, folded=False)

    # reference: per micro-batch, detection on the current log-probs and the forward's entropy,
    # tau_h over that micro-batch, loss scaled from the response-token count to the valid count
    expected, start = 0.0, 0
    for size in splits:
        part = slice(start, start + size)
        spurious, _ = reference_spurious(
            [r.tolist() for r in rows["log_prob"][part]], [r.tolist() for r in rows["model_entropy"][part]],
            [r.tolist() for r in rows["advantages"][part]], [[True] * n for n in lengths[part]], TAU_P, Q,
        )
        valid = [[not s for s in spurious[i][:n]] for i, n in enumerate(lengths[part])]
        part_rows = {k: v[part] for k, v in rows.items()}
        mean, _ = valid_mean_and_grad(part_rows, valid)
        expected += mean * sum(lengths[part]) / num_tokens
        start += size
    assert total == pytest.approx(expected, rel=1e-6)


def test_stapo_loss_refuses_to_run_without_the_stapo_trainer():
    rows, lengths, prompt_lens = random_rows(1, count=2)
    rows["response_mask"] = [torch.ones(n, dtype=torch.long) for n in lengths]
    rows["loss_mask"] = rows["response_mask"]
    model_output, data, _ = make_micro_batch(rows, prompt_lens, sum(lengths), 2)
    config = actor_config(loss_mode="stapo", source="old")
    with pytest.raises(RuntimeError, match="trainer_mode=stapo"):
        ppo_loss(config, model_output, data)  # verl's stock loss function: no STAPO context
    with pytest.raises(RuntimeError, match="no folded S2T mask"):
        run_micro_batches(STAPOLossFn(config), rows, prompt_lens, [2], sum(lengths), folded=False)


def test_non_finite_loss_fails_the_step_with_statistics():
    rows, lengths, prompt_lens = random_rows(2, count=3)
    rows["response_mask"] = [torch.ones(n, dtype=torch.long) for n in lengths]
    rows["loss_mask"] = rows["response_mask"]
    rows["advantages"][1][0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"'advantages': 1"):
        run_micro_batches(STAPOLossFn(actor_config(loss_mode="stapo", source="old")), rows, prompt_lens, [3], sum(lengths))
