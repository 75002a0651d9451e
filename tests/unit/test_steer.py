"""STEER's weights (stapo/algorithm/steer.py, registry entry ``steer``) against the float64 loop of tests/reference.py.

The pure function takes the current and the old log-prob apart (the authors' formula; the preset passes the old
pass for both), so the loop is checked with ``p != q`` too. Edges: NaN / -inf / +inf log-probs, old log-probs,
entropies and advantages at response tokens (weight 1, and they do not set the maximum), an empty mask,
all-negative advantages, p = 1 and p = e^-60 (the clamps), a maximum below the 0.02 floor (no token reaches
lambda_min), lambda_min = 1 (all ones). The per-mini-batch build is each part's own STEER; DP-global maxima over
2 gloo ranks: tests/unit/test_stare.py; the registry-wide checks (tests/unit/test_masks.py, test_token_weights.py,
tests/integration/test_verl_loss_path.py, through verl's loss) run STEER too.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from stapo.algorithm.masks import MaskInputs, MaskSettings, build_token_mask, build_token_mask_in_parts
from stapo.algorithm.steer import entropy_change, steer_weight
from tests.reference import REFERENCES, reference_steer_m, reference_steer_weights

NAN, INF = float("nan"), float("inf")
CASES = ["random", "nonfinite", "all_negative", "empty", "extreme", "flat"]
LAMBDAS = [0.8, 0.5, 0.05, 1.0]


def steer_inputs(seed: int, case: str, rows: int = 9, cols: int = 23) -> dict[str, torch.Tensor]:
    """Float64 inputs with p != q, ragged rows of either advantage sign and zero; NaN/inf at padded positions."""
    g = torch.Generator().manual_seed(seed)
    old = torch.empty(rows, cols, dtype=torch.float64).uniform_(-9.0, 0.0, generator=g)
    new = (old + torch.empty(rows, cols, dtype=torch.float64).uniform_(-0.5, 0.5, generator=g)).clamp(max=0.0)
    entropy = torch.rand(rows, cols, generator=g, dtype=torch.float64) * 5
    signs = torch.tensor([(1.0, -1.0, 0.0)[i % 3] for i in range(rows)], dtype=torch.float64)
    advantages = (signs * (0.1 + torch.rand(rows, generator=g, dtype=torch.float64))).unsqueeze(-1).expand(rows, cols)
    advantages = advantages.clone()
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(-1)
    if case == "nonfinite":
        new.view(-1)[::5], old.view(-1)[1::7], entropy.view(-1)[2::6] = -INF, NAN, INF
        new.view(-1)[3::11], advantages.view(-1)[4::13] = NAN, NAN
    elif case == "all_negative":
        advantages = -advantages.abs() - 0.1
    elif case == "empty":
        mask = torch.zeros_like(mask)
    elif case == "extreme":
        pick = torch.rand(rows, cols, generator=g)
        new[pick < 0.3], old[pick < 0.2], new[pick > 0.7], old[pick > 0.8] = 0.0, 0.0, -60.0, -70.0
    elif case == "flat":  # |Omega| far below the 0.02 floor everywhere
        advantages = advantages * 1e-6
    new[~mask], old[~mask], entropy[~mask], advantages[~mask] = NAN, NAN, INF, NAN
    return {"response_mask": mask, "advantages": advantages, "log_prob": new, "old_log_prob": old,
            "entropy": entropy}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("lambda_min", LAMBDAS)
def test_weights_with_p_and_q_apart_equal_the_loop_reference(lambda_min, case):
    for seed in range(3):
        t = steer_inputs(seed, case)
        got = steer_weight(t["log_prob"], t["old_log_prob"], t["entropy"], t["advantages"], t["response_mask"],
                           lambda_min)
        want = reference_steer_weights(t["log_prob"].tolist(), t["old_log_prob"].tolist(), t["entropy"].tolist(),
                                       t["advantages"].tolist(), t["response_mask"].tolist(), lambda_min)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0.0)
        mask = t["response_mask"]
        assert bool((got[mask] >= lambda_min).all()) and bool((got <= 1.0).all()) and bool((got[~mask] == 1.0).all())


def test_the_largest_change_gets_lambda_min_and_the_floor_holds_below_002():
    t = steer_inputs(1, "random")
    m = entropy_change(t["log_prob"], t["old_log_prob"], t["entropy"], t["advantages"], t["response_mask"])
    assert float(m.max()) > 0.02
    w = steer_weight(t["log_prob"], t["old_log_prob"], t["entropy"], t["advantages"], t["response_mask"], 0.8)
    assert float(w[m == m.max()].max()) == pytest.approx(0.8, rel=1e-14) and float(w.min()) == pytest.approx(0.8)
    flat = steer_inputs(1, "flat")
    wf = steer_weight(flat["log_prob"], flat["old_log_prob"], flat["entropy"], flat["advantages"],
                      flat["response_mask"], 0.8)
    assert float(wf.min()) > 0.99  # k = -log(0.8) / 0.02: nobody near the floor
    zero_adv = flat["response_mask"] & (flat["advantages"] == 0)
    assert bool(zero_adv.any()) and bool((wf[zero_adv] == 1.0).all())  # A = 0 moves no entropy


def test_undefined_tokens_keep_weight_1_and_set_no_maximum():
    """The authors' clamp would give a -inf log-prob p = 1e-8 and a weight; here it keeps 1 (m = 0)."""
    assert reference_steer_m(-INF, -1.0, 1.0, 1.0) == 0.0 and reference_steer_m(-1.0, -1.0, NAN, 1.0) == 0.0
    lp = torch.tensor([[-INF, -1.0, -2.0, NAN]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0, -2.0, -1.0]], dtype=torch.float64)
    h = torch.tensor([[1.0, 2.0, 0.5, 1.0]], dtype=torch.float64)
    adv, mask = torch.full_like(lp, 1e3), torch.ones_like(lp, dtype=torch.bool)
    w = steer_weight(lp, old, h, adv, mask, 0.8)
    assert w[0, 0].item() == 1.0 and w[0, 3].item() == 1.0
    assert min(w[0, 1].item(), w[0, 2].item()) == pytest.approx(0.8, rel=1e-14)


def test_the_preset_entry_reads_the_old_pass_for_p_and_q():
    t = steer_inputs(2, "random")
    inputs = MaskInputs(t["response_mask"], t["advantages"], t["old_log_prob"], t["entropy"])
    built = build_token_mask(inputs, MaskSettings(token_mask="steer", steer_lambda_min=0.5))
    direct = steer_weight(t["old_log_prob"], t["old_log_prob"], t["entropy"], t["advantages"], t["response_mask"], 0.5)
    assert torch.equal(built.weight, direct) and built.stats["min_weight"] == pytest.approx(0.5)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_per_mini_batch_build_is_each_parts_own_steer(seed):
    """threshold_scope mini_batch: each part's own maximum of m (part 1 holds no token)."""
    t = steer_inputs(seed, "random")
    tensors = {key: t[key] for key in ("response_mask", "advantages", "entropy")}
    tensors["log_prob"] = t["old_log_prob"]
    mask = tensors["response_mask"]
    part = torch.where(torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.5, 0, 2)
    settings = MaskSettings(token_mask="steer", threshold_scope="mini_batch")
    built = build_token_mask_in_parts(MaskInputs(**tensors), settings, part, num_parts=3)
    for k in range(3):
        where = mask & (part == k)
        one_row = {key: [value[where].tolist()] for key, value in tensors.items() if key != "response_mask"}
        one_row["response_mask"] = [[True] * int(where.sum())]
        expected = REFERENCES["steer"](one_row, dataclasses.asdict(settings))["weight"][0]
        torch.testing.assert_close(built.weight[where], torch.tensor(expected, dtype=torch.float64), rtol=1e-12,
                                   atol=0.0)
    whole = build_token_mask(MaskInputs(**tensors), settings)
    assert not torch.equal(whole.weight, built.weight)  # the scope matters: a maximum per part
    assert built.stats["min_weight"] == pytest.approx(float(built.weight[mask].min())) and math.isfinite(
        built.stats["min_weight"])


@pytest.mark.parametrize("value", [0.0, 1.2, float("nan")])
def test_lambda_min_out_of_range_is_refused_naming_the_key_and_range(value):
    from stapo.algorithm.validation import STAPOConfigError

    with pytest.raises(STAPOConfigError, match=r"^pl\.steer_lambda_min must be in \(0, 1\] \(STEER, arXiv 2510\.10150"):
        MaskSettings(token_mask="steer", steer_lambda_min=value).validate(prefix="pl.")
