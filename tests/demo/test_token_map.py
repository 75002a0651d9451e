"""The probability-entropy map of a run folder's token samples (PNG written, region drawn, torn lines skipped)."""

from __future__ import annotations

import json
import math

import torch

from stapo.algorithm.token_sample import token_sample
from stapo.demo.token_map import draw_token_map, read_samples


def test_token_sample_is_spread_and_faithful():
    g = torch.Generator().manual_seed(0)
    log_prob = -torch.rand(6, 10, generator=g) * 8
    entropy = torch.rand(6, 10, generator=g) * 3
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0])
    mask = torch.rand(6, 10, generator=g) < 0.7
    silenced = mask & (log_prob < -6)
    records = token_sample(log_prob, entropy, advantages, mask, silenced, size=8)
    assert len(records) == 8
    # every record is a real response token with its own p, H, A and silenced flag
    expected = {
        (
            round(math.exp(float(log_prob[i, t])), 9),
            round(float(entropy[i, t]), 9),
            float(advantages[i]),
            bool(silenced[i, t]),
        )
        for i, t in mask.nonzero().tolist()
    }
    got = {(round(r["prob"], 9), round(r["entropy"], 9), r["advantage"], r["silenced"]) for r in records}
    assert got <= expected
    # spread: the sample reaches the last rows, not only the first ones
    assert {r["advantage"] for r in records} >= {1.0, 0.0}
    assert token_sample(log_prob, entropy, advantages, mask, silenced, size=10_000) and len(
        token_sample(log_prob, entropy, advantages, mask, silenced, size=10_000)
    ) == int(mask.sum())


def test_token_map_png(tmp_path):
    lines = [
        json.dumps({"step": s, "prob": p, "entropy": h, "advantage": a, "silenced": p < 0.002 and h < 1.0})
        for s in (1, 2)
        for p, h, a in ((0.9, 0.2, 1.0), (0.001, 0.5, 1.0), (0.3, 2.0, -1.0), (0.0005, 0.1, -1.0))
    ]
    (tmp_path / "token_samples.jsonl").write_text("\n".join(lines) + "\n{torn")
    assert len(read_samples(tmp_path)) == 8
    out = draw_token_map(tmp_path, tmp_path / "plots" / "token_map.png", tau_p=0.002, tau_h_by_step={2: 1.0})
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert draw_token_map(tmp_path / "nothing", tmp_path / "x.png") is None


def test_stapo_plot_draws_the_map_of_a_run_folder(tmp_path):
    from stapo.runs.plot import main

    run = tmp_path / "stapo-seed1"
    run.mkdir()
    (run / "config.yaml").write_text("actor_rollout_ref:\n  actor:\n    policy_loss:\n      tau_p: 0.002\n")
    (run / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps({"step": s, "data": {"actor/stapo/tau_h": 1.0, "actor/entropy": 2.0, "critic/score/mean": 0.1}})
            for s in (1, 2)
        )
        + "\n"
    )
    (run / "token_samples.jsonl").write_text(
        json.dumps({"step": 2, "prob": 0.001, "entropy": 0.5, "advantage": 1.0, "silenced": True}) + "\n"
    )
    assert main([str(run), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "token_map_stapo-seed1.png").stat().st_size > 5000
