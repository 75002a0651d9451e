"""stapo/reward/trial.py: the calls the checks make are the ones verl makes, and the scores read as verl reads them.

The keywords are compared with what verl 0.9.1's own naive reward manager passes to a reward function (its
``run_single`` on a tokenised reply, no Ray), recorded by the function itself; the rest against values written by
hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from stapo.reward.trial import (
    REPLY_FORMATS,
    call_keywords,
    one_line,
    prompt_text,
    read_rows,
    reply_pairs,
    score_of,
    wrong_answer,
)


def test_the_keywords_are_the_ones_verls_reward_manager_passes(example_parquet, reward_file, run_config):
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    from stapo.models.tiny import build_tiny_model

    path = reward_file("""
        CALLS = []


        def compute_score(**kwargs):
            CALLS.append(kwargs)
            return 0.0
        """)
    config = run_config(path, format_score=0.5)
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    manager = load_reward_manager(config, tokenizer)
    calls = manager.compute_score.args[0].__globals__["CALLS"]  # verl wraps the raw function in a partial
    rows = read_rows(example_parquet, 3)
    for row in rows:
        reply = f"So it is \\boxed{{{row['reward_model']['ground_truth']}}}."
        ids = tokenizer.encode(reply)
        data = DataProto.from_dict(
            tensors={"prompts": torch.tensor([[1, 2]]), "responses": torch.tensor([ids]),
                     "attention_mask": torch.ones(1, 2 + len(ids), dtype=torch.long)},
            non_tensors={"data_source": np.array([row["data_source"]], dtype=object),
                         "reward_model": np.array([row["reward_model"]], dtype=object),
                         "extra_info": np.array([dict(row["extra_info"])], dtype=object),
                         "__num_turns__": np.array([2], dtype=object)},
        )
        manager.loop.run_until_complete(manager.run_single(data))
        assert calls[-1] == call_keywords(row, reply, {"format_score": 0.5})
    assert len(calls) == 3


def test_the_rows_are_the_files_first_in_each_format(example_parquet, tmp_path):
    rows = read_rows(example_parquet, 3)
    assert [row["reward_model"]["ground_truth"] for row in rows] == ["42", "72", "63"]
    assert prompt_text(rows[0]) == "Put the final answer in \\boxed{}. What is 17 + 25?"
    plain = [json.loads(json.dumps(row)) for row in rows]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(row) for row in plain) + "\n\n", encoding="utf-8")
    (tmp_path / "rows.json").write_text(json.dumps(plain), encoding="utf-8")
    assert read_rows(tmp_path / "rows.jsonl", 2) == plain[:2]
    assert read_rows(tmp_path / "rows.json", 5) == plain
    assert read_rows(example_parquet, 1) == rows[:1]


def test_replies_hold_the_answer_and_a_different_one():
    assert wrong_answer("42") == "43" and wrong_answer("-1") == "0" and wrong_answer("1,000") == "1001"
    assert wrong_answer("2.5") == "3.5" and wrong_answer("\\frac{1}{2}") == "none" and wrong_answer("None") == "unknown"
    pairs = reply_pairs(["7", "seven"])  # a list of accepted answers: the first is written
    assert [(r.text, w.text) for r, w in pairs] == [
        ("7", "8"), ("The answer is \\boxed{7}.", "The answer is \\boxed{8}."), ("#### 7", "#### 8")]
    assert [r.form for r, _ in pairs] == [form for form, _ in REPLY_FORMATS]
    assert all(r.right and w.right is False for r, w in pairs)


@pytest.mark.parametrize("result, score", [
    (1, 1.0), (-1.0, -1.0), (True, 1.0), (np.float32(0.5), 0.5), (torch.tensor(0.25), 0.25),
    ({"score": 0.0, "acc": 1.0}, 0.0), ({"score": np.int64(3)}, 3.0),
])
def test_scores_verl_takes(result, score):
    value = score_of(result)
    assert value == score and isinstance(value, float)


@pytest.mark.parametrize("result, why", [
    (math.nan, "nan: a score must be finite"), ({"score": math.inf}, "inf: a score must be finite"),
    ({"acc": 1.0}, "a dict without a 'score' key (keys ['acc'])"), ("1", "'1', not a number"),
    (None, "None, not a number"), ([1.0], "[1.0] (list), not a number"),
])
def test_scores_verl_cannot_use(result, why):
    with pytest.raises(ValueError) as caught:
        score_of(result)
    assert str(caught.value).startswith(why)


def test_one_line():
    assert one_line("a\n b  c") == "a b c" and one_line("x" * 100, 10) == "xxxxxxx..."
