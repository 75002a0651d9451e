"""The fast RL testbed: its tokenizer, its addition task, its reward, and its deterministic, cached build."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from stapo.data.addition import Difficulty, make_rows, problems, split_of, worked_solution, write_parquet
from stapo.models.cache import model_built_on
from stapo.models.testbed import MARKER, RECIPE, build_testbed_model
from stapo.models.testbed.tokenizer import build_tokenizer
from stapo.reward import compute_score
from stapo.runs.machine import machine_kind

# a handful of supervised steps and held-out problems: the build's code paths in seconds
QUICK = {**RECIPE, "sft_steps": 3, "sft_batch_size": 8, "warmup_steps": 2, "eval_problems": 4, "max_new_tokens": 8}


def test_worked_solution_adds_column_by_column_with_carries():
    assert worked_solution((347, 85)) == "7+5+0=12;4+8+1=13;3+0+1=4;\\boxed{432}"
    assert worked_solution((99, 1, 5)) == "9+1+5+0=15;9+0+0+1=10;\\boxed{105}"


def test_tokenizer_round_trips_the_chat_template_and_the_text(tmp_path):
    from transformers import AutoTokenizer

    build_tokenizer().save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.bos_token is None and tokenizer.pad_token_id != tokenizer.eos_token_id
    answer = worked_solution((347, 85, 12))
    chat = [{"role": "user", "content": "347+85+12"}, {"role": "assistant", "content": answer}]
    prompt = tokenizer.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(chat, tokenize=False)
    assert prompt == "<|user|>347+85+12<|end|><|assistant|>" and full == f"{prompt}{answer}<|end|>"
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert len(ids) == len("347+85+12") + len(answer) + 4  # one token a character, four turn markers
    assert tokenizer.decode(ids) == full
    assert tokenizer.decode(ids[len(tokenizer(prompt, add_special_tokens=False)["input_ids"]):],
                            skip_special_tokens=True) == answer
    assert tokenizer.convert_ids_to_tokens(ids[-1]) == tokenizer.eos_token


def test_task_is_deterministic_and_its_held_out_split_is_disjoint(tmp_path):
    hard = Difficulty(operands=4, min_digits=3, max_digits=4)
    assert make_rows(50, "train", seed=3, difficulty=hard) == make_rows(50, "train", seed=3, difficulty=hard)
    assert make_rows(20, "heldout")[:10] == make_rows(10, "heldout")  # a longer read extends a shorter one
    train = [tuple(sorted(p)) for p in islice(problems("train", seed=0, distinct=False), 5000)]
    heldout = [tuple(sorted(p)) for p in islice(problems("heldout", seed=0), 500)]
    assert not set(train) & set(heldout) and len(set(heldout)) == 500
    assert all(split_of(p) == "heldout" for p in heldout)
    assert all(len(p) == 4 and all(100 <= n <= 9999 for n in p) for p in islice(problems("train", 1, hard), 100))
    train_file, heldout_file = write_parquet(tmp_path, train=16, heldout=8, seed=0)
    import pandas as pd

    rows = pd.read_parquet(heldout_file)
    assert len(pd.read_parquet(train_file)) == 16 and len(rows) == 8
    first = rows.iloc[0]
    operands = [int(n) for n in first["prompt"][0]["content"].split("+")]
    assert first["reward_model"]["ground_truth"] == str(sum(operands))
    assert first["extra_info"]["solution"] == worked_solution(tuple(operands))


def test_the_preset_validates_on_the_problems_the_build_measured():
    from stapo.models.testbed import difficulty_of
    from stapo.models.testbed.warm_start import heldout_problems

    measured = heldout_problems({**RECIPE, "eval_problems": 16}, difficulty_of(RECIPE))
    validated = [tuple(row["extra_info"]["operands"]) for row in make_rows(8, "heldout", seed=0)]
    assert validated == measured[:8]


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("7+5+0=12;4+8+1=13;3+0+1=4;\\boxed{432}", 1.0),
        ("7+5+0=12;4+8+1=13;3+0+1=5;\\boxed{532}", -1.0),  # a slip in the reasoning
        ("7+5+0=12;4+8+1=13;3+0+1=4;432", -1.0),  # right sum, no box
        ("\\boxed{123};\\boxed{432}", 1.0),  # the last box counts
        ("", -1.0),
    ],
)
def test_reward_scores_the_last_boxed_sum(reply, score):
    assert compute_score("stapo/addition", reply, "432")["score"] == score


def test_model_builds_deterministically_and_is_cached(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    first = build_testbed_model(tmp_path / "a", QUICK)
    second = build_testbed_model(tmp_path / "b", QUICK)
    assert Path(first).name == Path(second).name
    marker = Path(first) / MARKER
    written = marker.stat().st_mtime_ns
    assert build_testbed_model(tmp_path / "a", QUICK) == first and marker.stat().st_mtime_ns == written  # cached
    report = json.loads(marker.read_text())
    assert report["recipe"] == QUICK and report["seed"] == QUICK["seed"]
    assert report["built_on"] == machine_kind() and model_built_on(first) == machine_kind()  # another kind: other bits
    assert set(report["heldout_pass_rate"]) == {"greedy", "t1"}
    assert all(0.0 <= rate <= 1.0 for rate in report["heldout_pass_rate"].values())
    a = AutoModelForCausalLM.from_pretrained(first).state_dict()
    b = AutoModelForCausalLM.from_pretrained(second).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.norm.weight"], torch.ones_like(a["model.norm.weight"]))  # it did train
    tokenizer = AutoTokenizer.from_pretrained(first)
    config = AutoModelForCausalLM.from_pretrained(first).config
    assert config.head_dim == 32 and config.eos_token_id == tokenizer.eos_token_id
    assert config.vocab_size == len(tokenizer)
    assert build_testbed_model(tmp_path / "a", {**QUICK, "sft_steps": 4}) != first  # the key is the recipe


def test_gain_adamw_gives_the_norm_gains_a_larger_step_and_no_decay():
    import torch
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    from stapo.models.testbed.optim import GainAdamW

    matrix, gain = torch.nn.Parameter(torch.full((4, 4), 0.02)), torch.nn.Parameter(torch.ones(4))
    optimizer = GainAdamW(iter([matrix, gain]), lr=1e-5, weight_decay=0.01, betas=(0.9, 0.999), gain_lr_scale=100)
    matrices, gains = optimizer.param_groups
    assert matrices["params"] == [matrix] and gains["params"] == [gain]  # the matrices first: verl logs their lr
    assert gains["lr"] == 100 * matrices["lr"] and gains["weight_decay"] == 0.0 and matrices["weight_decay"] == 0.01
    (matrix.sum() + gain.sum()).backward()
    before = matrix.detach().clone(), gain.detach().clone()
    optimizer.step()  # a fresh Adam step moves each weight by its lr (plus the decay)
    assert (before[1] - gain).abs().max().item() == pytest.approx(1e-3, rel=1e-3)
    assert (before[0] - matrix).abs().max().item() == pytest.approx(1e-5 * (1 + 0.02 * 0.01), rel=1e-3)
    scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=10)  # as verl's actor builds it
    for _ in range(3):
        optimizer.step()
        scheduler.step()
        assert optimizer.param_groups[1]["lr"] == pytest.approx(100 * optimizer.param_groups[0]["lr"])
    with pytest.raises(ValueError):
        GainAdamW([{"params": [matrix]}], lr=1e-5)
