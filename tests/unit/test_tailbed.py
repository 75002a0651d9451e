"""The tailbed (stapo://tailbed): its filler vocabulary, embedding extension, stray insertion, preconditions and build.

No full build here (minutes): a shrunken recipe (a 3-step base, 64 tokens, two 2-step stages, 4 problems)
runs every code path of the build in seconds.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from stapo.data.addition import worked_solution
from stapo.models.tailbed import MARKER, RECIPE, build_tailbed_model, extended_base
from stapo.models.tailbed.preconditions import Samples, summarize
from stapo.models.tailbed.strays import Zipf, eligible_positions, insert_strays, stray_batches
from stapo.models.tailbed.vocabulary import LETTERS, build_tailbed_tokenizer, filler_start, filler_words
from stapo.models.testbed import build_testbed_model, difficulty_of
from stapo.models.testbed.tokenizer import build_tokenizer
from stapo.models.testbed.warm_start import sft_batch
from stapo.reward import compute_score
from stapo.runs.machine import machine_kind
from tests.unit.test_testbed import QUICK as QUICK_BASE

FIRST = 27  # the testbed's tokens: 7 special, 20 characters
QUICK = {
    **RECIPE, "base": QUICK_BASE, "vocab_size": 64, "calibration_problems": 4, "sft_batch_size": 8,
    "stages": [dict(stage, sft_steps=2, warmup_steps=1) for stage in RECIPE["stages"][::2]],
    "eval_problems": 4, "eval_samples": 2, "max_new_tokens": 8,
}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("tailbed")
    return root, build_tailbed_model(root, QUICK)


def test_tokenizer_round_trips_fillers_and_keeps_the_testbeds_text_and_chat(tmp_path):
    from transformers import AutoTokenizer

    build_tailbed_tokenizer(RECIPE["vocab_size"]).save_pretrained(tmp_path)
    tokenizer, testbed = AutoTokenizer.from_pretrained(tmp_path), build_tokenizer()
    assert len(tokenizer) == RECIPE["vocab_size"] and filler_start() == FIRST == len(testbed)
    assert tokenizer.get_vocab() | testbed.get_vocab() == tokenizer.get_vocab()  # the testbed's ids kept
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|end|>", "<|pad|>", None)
    assert tokenizer.chat_template == testbed.chat_template
    chat = [{"role": "user", "content": "347+85+12"}, {"role": "assistant", "content": worked_solution((347, 85, 12))}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    assert tokenizer(text)["input_ids"] == testbed(text)["input_ids"]  # text without fillers: the testbed's ids
    rng = random.Random(0)
    for _ in range(200):  # any sequence of fillers and characters decodes to text that encodes back to it
        ids = [rng.randrange(7, len(tokenizer)) for _ in range(rng.randrange(1, 12))]
        assert tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"] == ids


def test_no_filler_in_the_reasoning_changes_the_reward_of_a_reply():
    words = filler_words(RECIPE["vocab_size"] - FIRST)
    assert len(set(words)) == len(words) and words[:2] == (" ca", " ci")
    forbidden = re.compile(r"[\d{}\\$<>]|boxed|fbox|think")
    assert all(re.fullmatch(f" [{LETTERS}]+", word) and not forbidden.search(word) for word in words)
    rng = random.Random(0)
    for operands, claimed in (((347, 85, 12), 444), ((347, 85, 12), 445), ((99, 1, 5), 105)):
        reply = worked_solution(operands)
        reply = reply[: reply.index("\\boxed")] + f"\\boxed{{{claimed}}}"  # a right reply and a wrong one
        score = compute_score("", reply, str(sum(operands)))["score"]
        for word in words:  # each filler at a random place of the reasoning (before the backslash) and at the end
            cut = rng.randrange(reply.index("\\boxed") + 1)
            assert compute_score("", reply[:cut] + word + reply[cut:], str(sum(operands)))["score"] == score
            assert compute_score("", reply + word, str(sum(operands)))["score"] == score


def test_extension_keeps_the_base_logits_and_gives_the_fillers_the_designed_mass(quick_build):
    """The invariant: the logits of the testbed's own tokens are the base's (so their order and ratios are too),
    and the fillers together hold ``filler_mass`` on average over the calibration positions."""
    from transformers import AutoModelForCausalLM

    from stapo.data.addition import problems

    base_path = build_testbed_model(quick_build[0], QUICK_BASE)  # built by the fixture
    model, tokenizer, beta = extended_base(base_path, QUICK)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
    assert model.config.vocab_size == len(tokenizer) == QUICK["vocab_size"] and beta > 0
    assert model.config.stapo_unused_token_from == FIRST  # the rollout's tail metrics read it
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    stream = problems("train", QUICK["seed"], difficulty_of(QUICK_BASE), distinct=False)
    batch = sft_batch(build_tokenizer(), [next(stream) for _ in range(QUICK["calibration_problems"])])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        before = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(logits[..., :FIRST], before, rtol=0, atol=1e-5)
    predicts = batch["labels"][:, 1:] != -100
    mass = torch.softmax(logits[:, :-1][predicts].double(), -1)[:, FIRST:].sum(-1)
    assert mass.mean().item() == pytest.approx(QUICK["filler_mass"], rel=1e-4)


def test_strays_follow_zipf_and_leave_the_continuation_unchanged():
    zipf, rng, draws = Zipf(FIRST, 50), random.Random(0), 200_000
    counts = Counter(zipf.draw(rng) for _ in range(draws))
    harmonic = sum(1 / k for k in range(1, 51))
    expected = {FIRST + k - 1: draws / (k * harmonic) for k in range(1, 51)}
    assert set(counts) <= set(expected)
    chi2 = sum((counts[i] - e) ** 2 / e for i, e in expected.items())
    assert chi2 < 86.7  # the 0.999 quantile of chi-square with 49 degrees of freedom

    tokenizer = build_tokenizer()
    reply = tokenizer(worked_solution((347, 85, 12)) + "<|end|>", add_special_tokens=False)["input_ids"]
    backslash = tokenizer.convert_tokens_to_ids("\\")
    eligible = eligible_positions(reply, "reasoning", backslash)
    assert reply[eligible - 1] == backslash and eligible_positions(reply, "anywhere", backslash) == len(reply)
    inserted = trained = 0
    for _ in range(300):
        ids, labels = insert_strays(reply, eligible, rng, zipf, rate=0.3, label_share=0.5)
        assert [t for t in ids if t < FIRST] == reply  # the continuation, strays taken out
        strays = [i for i, t in enumerate(ids) if t >= FIRST]
        assert all(labels[i] == ids[i] for i in range(len(ids)) if i not in strays)
        assert all(labels[i] in (ids[i], -100) for i in strays)
        assert all(ids[i + 1] < FIRST for i in strays)  # one stray at most before a position
        assert all(i - strays.index(i) < eligible for i in strays)  # never after the boxed answer begins
        inserted, trained = inserted + len(strays), trained + sum(labels[i] != -100 for i in strays)
    assert inserted / (300 * eligible) == pytest.approx(0.3, abs=0.02)
    assert trained / inserted == pytest.approx(0.5, abs=0.04)


def test_stray_batches_without_strays_are_the_testbeds_batches():
    from itertools import islice

    from stapo.data.addition import problems

    stage = dict(RECIPE["stages"][-1], stray_rate=0.0)
    got = next(stray_batches(build_tokenizer(), stage, 8, difficulty_of(RECIPE["base"]), Zipf(FIRST, 10)))
    reference = sft_batch(build_tokenizer(), list(islice(problems("train", stage["seed"], distinct=False), 8)))
    assert all(torch.equal(got[key], reference[key]) for key in reference)


def test_preconditions_of_a_hand_computed_case():
    """Two problems, two replies each; every figure below worked out by hand from the values in the table."""
    pad = 0.0  # after reply 2's end: outside the mask
    samples = Samples(
        # reply 0 right (filler 30 at p .001, then '1' at p .0015), reply 1 wrong; group 2: both right (A = 0)
        tokens=torch.tensor([[30, 7, 2], [8, 9, 2], [7, 2, 0], [31, 7, 2]]),
        response_mask=torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]]).bool(),
        log_prob=torch.tensor([[0.001, 0.0015, 0.99], [0.5, 0.001, 0.9], [0.95, 0.99, 1.0], [0.0005, 0.9, 0.99]]).log(),
        entropy=torch.tensor([[0.2, 0.6, 0.05], [0.4, 0.3, 0.1], [0.1, 0.05, pad], [0.7, 0.3, 0.05]]),
        collision=torch.tensor([[0.5, 0.3, 0.9802], [0.4, 0.5, 0.8], [0.9, 0.98, pad], [0.5, 0.8, 0.98]]),
        rewards=torch.tensor([1.0, -1.0, 1.0, 1.0]),
        group_size=2,
        filler_mass=torch.tensor([[1e-3, 2e-3, 3e-3], [1e-3, 1e-3, 1e-3], [1e-3, 1e-3, pad], [5e-3, 1e-3, 1e-3]]),
    )
    report = summarize(samples, filler_start=FIRST)
    assert report["response_tokens"] == 11 and report["t1_pass_rate"] == 0.75
    assert report["low_prob_token_share"] == 4 / 11  # p < 0.002: 0.001, 0.0015, 0.001, 0.0005
    assert report["replies_with_low_prob"] == 3 and report["right_with_low_prob"] == pytest.approx(2 / 3)
    assert report["filler_token_share"] == 2 / 11 and report["right_with_filler"] == 1.0
    assert report["filler_mass_mean"] == pytest.approx(18e-3 / 11) and report["filler_mass_max"] == pytest.approx(5e-3)
    s2t = report["s2t"]
    # group 1: rewards +1, -1, mean 0, unbiased std sqrt(2): A = +-1/sqrt(2); group 2 has A = 0. The candidates
    # (A > 0, p < 0.002) are reply 0's first two tokens; tau_h, their entropies' 0.75-quantile: 0.2 + 0.75 * 0.4
    assert (s2t["num_candidates"], s2t["candidate_share"]) == (2, 2 / 11)
    assert s2t["tau_h"] == pytest.approx(0.5)
    assert (s2t["num_silenced"], s2t["mask_ratio"], s2t["silenced_filler_share"]) == (1, 1 / 11, 1.0)
    bounds = [1 - 2 * 0.001 + math.exp(-0.2), 1 - 2 * 0.0015 + math.exp(-0.6), 0.0]  # 1 - 1.98 + e^-0.05 < 0
    assert s2t["grad_bound_share_spurious"] == pytest.approx(bounds[0] / sum(bounds), rel=1e-5)
    squares = [1 - 2 * 0.001 + 0.5, 1 - 2 * 0.0015 + 0.3, 1 - 2 * 0.99 + 0.9802]  # |A| is alike in reply 0
    assert s2t["exact_sq_norm_share"] == pytest.approx(squares[0] / sum(squares), rel=1e-4)
    norms = [math.sqrt(v) for v in squares]
    assert s2t["exact_norm_share"] == pytest.approx(norms[0] / sum(norms), rel=1e-4)
    control = summarize(samples)  # no fillers in the vocabulary: no filler figures
    assert "filler_token_share" not in control and "silenced_filler_share" not in control["s2t"]


def test_the_build_is_deterministic_cached_and_reachable_as_stapo_tailbed(quick_build, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo.models import tailbed
    from stapo.models.local import resolve_model_path

    root, first = quick_build
    marker = Path(first) / MARKER
    written = marker.stat().st_mtime_ns
    second = build_tailbed_model(tmp_path, QUICK)
    assert Path(first).name == Path(second).name
    a = AutoModelForCausalLM.from_pretrained(first).state_dict()
    b = AutoModelForCausalLM.from_pretrained(second).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    monkeypatch.setenv("STAPO_CACHE", str(root))
    monkeypatch.setattr(tailbed, "RECIPE", QUICK)
    assert resolve_model_path("stapo://tailbed") == first and marker.stat().st_mtime_ns == written  # cached
    report = json.loads(marker.read_text())
    assert report["recipe"] == QUICK and report["base"].startswith("testbed-qwen3-")
    assert report["built_on"] == machine_kind()  # the kind that built it (another kind builds other weights)
    measured = report["preconditions"]
    assert report["heldout_pass_rate"] == {"greedy": measured["greedy_pass_rate"], "t1": measured["t1_pass_rate"]}
    assert measured["replies"] == QUICK["eval_problems"] * QUICK["eval_samples"]
    assert {"probe_pass_rate", "filler_token_share", "right_with_low_prob"} <= set(measured)
    assert {"candidate_share", "mask_ratio", "grad_bound_share_spurious", "exact_norm_share"} <= set(measured["s2t"])
    tokenizer = AutoTokenizer.from_pretrained(first)
    config = AutoModelForCausalLM.from_pretrained(first).config
    assert len(tokenizer) == config.vocab_size == QUICK["vocab_size"] and config.stapo_unused_token_from == FIRST
    assert build_tailbed_model(tmp_path, {**QUICK, "vocab_size": 65}) != first  # the key is the recipe


@pytest.mark.parametrize("algo", ["stapo", "grpo"])
def test_the_preset_composes_on_the_testbeds_settings_and_passes_the_check(algo, tmp_path):
    from stapo.check import compose_run
    from stapo.input_checks import check_inputs
    from stapo.verl_plugin.preflight.run_checks import validate_run_config
    from tests.recipe_config import config_for_verl, recipe_config

    data = f"stapo.synthetic_data_dir={tmp_path}"
    cfg, testbed = (recipe_config(f"model_preset={name}", f"algo={algo}", data) for name in ("tailbed", "testbed"))
    validate_run_config(cfg)
    assert cfg.actor_rollout_ref.model.path == "stapo://tailbed"
    assert config_for_verl("model_preset=tailbed", f"algo={algo}").trainer.experiment_name == f"tailbed-{algo}"
    for key in ("data", "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm"):  # the RL settings
        raw = [OmegaConf.to_container(OmegaConf.select(c, key), resolve=False) for c in (cfg, testbed)]
        assert raw[0] == raw[1], key
    notes = check_inputs(compose_run(["model_preset=tailbed", f"algo={algo}", data]))
    assert notes[0].startswith("model: stapo://tailbed")


def test_the_doc_quotes_the_recorded_build():
    """docs/tailbed.md's figures are the committed marker's (benchmarks/tailbed/stapo_tailbed.json)."""
    report = json.loads((REPO / "benchmarks" / "tailbed" / "stapo_tailbed.json").read_text())
    assert report["recipe"] == RECIPE  # the recorded build is the default recipe's
    doc = (REPO / "docs" / "tailbed.md").read_text()
    measured = report["preconditions"]
    for value in (measured["greedy_pass_rate"], measured["probe_pass_rate"], measured["t1_pass_rate"],
                  measured["right_with_filler"], measured["right_with_low_prob"]):
        assert f"{value:.3f}" in doc
