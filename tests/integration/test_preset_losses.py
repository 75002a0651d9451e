"""Every algorithm preset's loss, in-process through verl's own actor-loss path, on real tensors.

For each ``conf/algo`` preset, composed by Hydra exactly as the recipe composes it: the preset's mask
folded as the STAPO actor worker folds it, then verl's micro-batch loop (``STAPOLossFn`` -> verl's
``ppo_loss`` -> the preset's registered loss -> ``agg_loss``) over one mini-batch split in several
ways. verl's FSDP engine backpropagates each micro-batch's loss unscaled, so a loss must normalise by
the mini-batch (``global_batch_info``), never by its micro-batch: the gradient of the mini-batch then
does not depend on how it was split (1, 2 or 4 micro-batches, or the uneven splits of dynamic batch
size). That property is what these tests check, per preset, with the loss finite and the gradient
non-zero. (The same checks run end to end, through Ray and FSDP, for a few presets in
``tests/bench/test_algos_train.py``.)
"""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import pytest
import torch
from verl.utils.config import omega_conf_to_dataclass

from stapo.algorithm.masks import MaskSettings
from tests.integration.test_verl_loss_path import ragged_rows, random_batch
from tests.integration.verl_batches import fold_as_trainer, run_micro_batches
from tests.recipe_config import config_for_verl

ALGOS = sorted(path.stem for path in (Path(__file__).resolve().parents[2] / "conf" / "algo").glob("*.yaml"))
ROWS = 12
SPLITS = {"one": [12], "two": [6, 6], "four": [3, 3, 3, 3], "dynamic": [5, 1, 4, 2]}
# Losses that pick tokens within each micro-batch (verl's code, as the authors'): which tokens clip_cov
# and kl_cov select depends on the split by design. The test gives them inputs where the selection
# changes nothing (clip_cov: no covariance inside its band; kl_cov: ratio 1, where its KL penalty and
# its gradient are 0), so what it checks for them is the normalisation.
SELECTION_NEUTRAL = {"clip_cov", "kl_cov"}


@functools.cache
def _preset_actor(algo: str, *overrides: str):
    cfg = config_for_verl("model_preset=tiny", f"algo={algo}", *overrides)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def preset_actor(algo: str, *overrides: str):
    return copy.deepcopy(_preset_actor(algo, *overrides))  # verl's ppo_loss writes into global_batch_info


def preset_batch(algo: str, seed: int, *overrides: str):
    tensors, lengths, prompt_lens = random_batch(seed, count=ROWS)
    if algo == "clip_cov":
        tensors["advantages"] = tensors["advantages"] * 0.02
    if algo == "kl_cov":
        tensors["log_prob"] = tensors["old_log_prob"].clone()
    config = preset_actor(algo, *overrides)
    settings = MaskSettings.from_mapping(config.policy_loss)
    response_mask, loss_mask, built = fold_as_trainer(tensors, settings)
    rows = ragged_rows(tensors, lengths, response_mask, loss_mask, built.weight)
    g = torch.Generator().manual_seed(seed + 100)
    rows["ref_log_prob"] = [r + 0.1 * torch.randn(len(r), generator=g, dtype=r.dtype) for r in rows["old_log_prob"]]
    if config.policy_loss.get("source", "old") != "current":
        rows.pop("model_entropy")
    return config, rows, prompt_lens, int(loss_mask.sum())


def run_split(algo: str, seed: int, splits: list[int]):
    from stapo.verl_plugin.training.losses import STAPOLossFn

    config, rows, prompt_lens, tokens = preset_batch(algo, seed)
    return run_micro_batches(STAPOLossFn(config), rows, prompt_lens, splits, tokens)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("algo", ALGOS)
def test_the_mini_batch_gradient_does_not_depend_on_the_micro_batching(algo, seed):
    whole, whole_grads, whole_metrics = run_split(algo, seed, SPLITS["one"])
    assert math.isfinite(whole) and whole != 0.0
    assert any(abs(g) > 0 for row in whole_grads for g in row)
    if algo == "clip_cov":
        assert float(whole_metrics[0]["actor/pg_clipfrac"].values[0]) == 0.0  # the selection is empty here
    for name in ("two", "four", "dynamic"):
        total, grads, _ = run_split(algo, seed, SPLITS[name])
        assert total == pytest.approx(whole, rel=1e-9, abs=1e-15), name
        for row, (got, want) in enumerate(zip(grads, whole_grads)):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-15), (name, row)


def test_verls_geo_mean_scales_with_the_micro_batches_and_gmpo_does_not():
    """Why the gmpo preset has its own loss: verl 0.9.1's geo_mean averages each micro-batch on its own."""
    from stapo.verl_plugin.training.losses import STAPOLossFn

    results = {}
    for mode in ("gmpo", "geo_mean"):
        loss_mode = f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}"
        config, rows, prompt_lens, tokens = preset_batch("gmpo", 3, loss_mode)
        for name in ("one", "four"):
            results[mode, name] = run_micro_batches(STAPOLossFn(config), rows, prompt_lens, SPLITS[name], tokens)[0]
    # one micro-batch: the two implementations (independent code) agree
    assert results["gmpo", "one"] == pytest.approx(results["geo_mean", "one"], rel=1e-6)
    assert results["gmpo", "four"] == pytest.approx(results["gmpo", "one"], rel=1e-9)
    assert results["geo_mean", "four"] != pytest.approx(results["geo_mean", "one"], rel=1e-3)


def test_gmpo_against_a_loop_reference():
    """The per-response geometric mean of the sign-aware log-space-clipped ratios, times the mean advantage,
    averaged over the mini-batch's responses, computed with Python floats."""
    from stapo.verl_plugin.training.losses import STAPOLossFn

    config, rows, prompt_lens, tokens = preset_batch("gmpo", 4)
    total, _, _ = run_micro_batches(STAPOLossFn(config), rows, prompt_lens, SPLITS["dynamic"], tokens)
    low, high = config.clip_ratio_low, config.clip_ratio_high
    expected = 0.0
    for old, new, adv, mask in zip(rows["old_log_prob"], rows["log_prob"], rows["advantages"], rows["response_mask"]):
        kept = [(float(o), float(n), float(a)) for o, n, a, m in zip(old, new, adv, mask) if m]
        if not kept:
            continue
        clipped = []
        for o, n, a in kept:
            r = n - o
            c = min(max(r, -low), high)
            clipped.append(min(r, c) if a > 0 else max(r, c) if a < 0 else 0.0)
        ratio = math.exp(sum(clipped) / len(kept))
        expected += -(sum(a for _, _, a in kept) / len(kept)) * ratio
    assert total == pytest.approx(expected / ROWS, rel=1e-10)


def test_every_preset_is_checked():
    assert {"stapo", "justrl", "grpo", "entropy20", "gmpo", "dppo_tv", "dppo_kl", "drgrpo"} <= set(ALGOS)
