"""The pieces of the S2T analysis demo: advantages (verl's, against a loop), entropies, the silenced-token log."""

from __future__ import annotations

import json

import pytest
import torch

from stapo.demo.analyze import _response_mask, group_advantages, token_log_prob_and_entropy
from stapo.spurious_log import append_jsonl, most_frequent, spurious_records


def test_group_advantages_match_a_loop():
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    got = group_advantages(rewards, 4)
    for g in range(2):
        group = rewards[g * 4 : (g + 1) * 4].tolist()
        mean = sum(group) / 4
        std = (sum((r - mean) ** 2 for r in group) / 3) ** 0.5
        for k in range(4):
            assert float(got[g * 4 + k]) == pytest.approx((group[k] - mean) / (std + 1e-6))
    assert (got[4:] == 0).all()  # equal rewards: no signal


def test_entropy_and_log_prob_against_explicit_sums():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0)) * 3
    tokens = torch.randint(0, 11, (2, 3))
    log_prob, entropy = token_log_prob_and_entropy(logits, tokens)
    for i in range(2):
        for t in range(3):
            probs = torch.softmax(logits[i, t].double(), -1)
            assert float(log_prob[i, t]) == pytest.approx(float(torch.log(probs[tokens[i, t]])), rel=1e-5)
            assert float(entropy[i, t]) == pytest.approx(float(-(probs * probs.log()).sum()), rel=1e-5)


def test_response_mask_stops_after_the_first_eos():
    responses = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 2, 2], [5, 6, 7, 8, 9]])
    assert _response_mask(responses, [2]).tolist() == [
        [True, True, True, False, False],
        [True, True, False, False, False],
        [True, True, True, True, True],
    ]


def test_spurious_records_and_summary(tmp_path):
    ids = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    mask = torch.tensor([[False, True, False, False], [False, False, False, True]])
    log_prob = torch.log(torch.full((2, 4), 1e-4))
    entropy = torch.full((2, 4), 0.5)
    vocab = {10: "a", 11: " 7", 12: "b", 13: "c", 20: "d", 21: "e", 22: "f", 23: "7"}
    decode = lambda xs: "".join(vocab[x] for x in xs)  # noqa: E731
    records = spurious_records(ids, mask, log_prob, entropy, decode, context=2, step=3)
    assert [(r["sample"], r["position"], r["token"], r["before"], r["after"]) for r in records] == [
        (0, 1, " 7", "a", "bc"),
        (1, 3, "7", "ef", ""),
    ]
    assert records[0]["prob"] == pytest.approx(1e-4) and records[0]["step"] == 3
    assert most_frequent(records) == [("7", 2)]
    append_jsonl(tmp_path / "log.jsonl", records)
    append_jsonl(tmp_path / "log.jsonl", records[:1])
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["token"] for line in lines] == [" 7", "7", " 7"]
