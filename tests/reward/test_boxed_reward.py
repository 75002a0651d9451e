"""The paper's strict reward on real-looking model outputs (both signs), and its bounded cost."""

from __future__ import annotations

import time

import pytest

from stapo.reward import checker_name, compute_score, last_boxed, normalize_answer

CASES = [
    # (model output, ground truth, correct?)
    ("So the answer is \\boxed{42}.", "42", True),
    ("The answer is \\boxed{42}", "41", False),
    ("First I thought \\boxed{12}, but recomputing: \\boxed{13}", "13", True),
    ("First I thought \\boxed{13}, but recomputing: \\boxed{12}", "13", False),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", True),
    ("\\boxed{\\tfrac12}", "\\frac{1}{2}", True),
    ("\\boxed{\\frac12}", "\\dfrac{1}{2}", True),
    ("\\boxed{\\frac{3}{4}}", "\\frac{1}{2}", False),
    ("\\boxed{\\sqrt{\\frac{2}{3}}}", "\\sqrt{\\frac{2}{3}}", True),
    ("\\boxed{\\frac{\\sqrt3}{2}}", "\\frac{\\sqrt{3}}{2}", True),
    ("\\boxed{2\\sqrt2}", "2\\sqrt{2}", True),
    ("nested: \\boxed{{a}^{2} + {b}^{2}}", "{a}^{2}+{b}^{2}", True),
    ("\\boxed{\\frac{1}{\\frac{2}{3}}}", "\\frac{1}{\\frac{2}{3}}", True),
    ("\\boxed 7", "7", True),
    ("\\boxed 7 apples", "7", True),
    ("$\\boxed 7$", "7", True),
    ("\\boxed 8", "7", False),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{1,000,000}", "1000000", True),
    ("\\boxed{1{,}024}", "1024", True),
    ("\\boxed{(1,2)}", "(1,2)", True),
    ("\\boxed{(1, 2)}", "(2,1)", False),
    ("\\boxed{\u22125}", "-5", True),
    ("\\boxed{-5}", "5", False),
    ("\\boxed{50\\%}", "50", True),
    ("\\boxed{50}", "50\\%", True),
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{90^{\\circ}}", "90", True),
    ("\\boxed{45^\\circ}", "90", False),
    ("\\boxed{\\text{(B)}}", "(B)", True),
    ("\\boxed{(C)}", "C", True),
    ("\\boxed{ 3 }", "3", True),
    ("\\boxed{3.0}", "3", True),
    ("\\boxed{3.5}", "3", False),
    ("\\boxed{0.50}", ".5", True),
    ("\\boxed{[0, 1)}", "[0,1)", True),
    ("\\boxed{\\left[0, 1\\right)}", "[0,1)", True),
    ("\\boxed{(0, 1]}", "[0,1)", False),
    ("\\boxed{x \\in (-\\infty, 2]}", "(-\\infty,2]", True),
    ("\\boxed{(-\\infty, 2) \\cup (3, \\infty)}", "(-\\infty,2)\\cup(3,\\infty)", True),
    ("$\\boxed{12}$.", "12", True),
    ("\\boxed{x = 4}", "4", True),  # DAPO keeps the right-hand side of an equation
    ("\\boxed{x = 5}", "4", False),
    ("\\boxed{x \\le 4}", "4", False),
    ("\\boxed{12 \\text{ cm}}", "12", True),
    ("\\boxed{12\\text{ cm}^2}", "12", True),
    ("\\boxed{12 square units}", "12", True),
    ("\\boxed{\\text{12 cm}}", "12", True),
    ("\\boxed{12\\,\\text{cm}}", "12", True),
    ("\\boxed{\\$18.90}", "18.90", True),
    ("\\boxed{18.9 \\text{ dollars}}", "18.90", True),
    ("\\boxed{\\text{m}}", "m", True),  # a variable, not a unit
    ("\\boxed{3m + 2}", "3+2", False),
    ("\\boxed{\\pi}", "\\pi", True),
    ("\\boxed{2\\pi}", "\\pi", False),
    ("\\boxed{\\$5}", "5", True),
    ("\\boxed{5.}", "5", True),
    ("\\fbox{17}", "17", True),
    ("answer: \\boxed{2^{10}}", "2^{10}", True),
    ("\\boxed{2^{10}}", "1024", False),  # strict: no evaluation (math-verify's job)
    ("<think>maybe \\boxed{5}</think> The answer is \\boxed{6}", "6", True),
    ("<think>maybe \\boxed{5}</think> The answer is 6", "5", False),
    ("<think>so it is \\boxed{5}... wait, let me", "5", False),  # reasoning cut off: no answer
    ("Let me think.\n</think>\n\nThe area is $\\boxed{\\dfrac{9}{4}}$.", "\\frac94", True),
    ("no box here, the answer is 42", "42", False),
    ("", "42", False),
    ("\\boxed{}", "42", False),
    ("\\boxed{", "42", False),
    ("\\boxed{42", "42", False),
    ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}", False),
    ("\\boxed{42}", "", False),
    ("\\boxed{42}", "The answer is \\boxed{42}.", True),  # a boxed solution as ground truth
    (
        "We have $a+b=7$ and $ab=12$, so $a^2+b^2=(a+b)^2-2ab=49-24=25$.\n\n"
        "Therefore, the final answer is $\\boxed{25}$. I hope it is correct.",
        "25",
        True,
    ),
    (
        "The probability is $\\frac{3}{8}$, so $m+n = 3+8 = 11$.\n\n**Final Answer**\n\\[\n\\boxed{11}\n\\]",
        "11",
        True,
    ),
    ("Counting the cases gives 1,234 arrangements.\n\nAnswer: \\boxed{1234}", "1,234", True),
    ("So $x = -\\frac{7}{3}$, i.e. \\boxed{-\\dfrac{7}{3}}", "-\\frac{7}{3}", True),
    ("So $x = -\\frac{7}{3}$, i.e. \\boxed{\\dfrac{7}{3}}", "-\\frac{7}{3}", False),
    ("The sides are 3, 4, 5, hence \\boxed{3, 4, 5}", "3,4,5", True),
    ("Hence the answer is \\boxed{\\textbf{(D)}\\ 24}", "24", False),  # letter + value: strict says no
]


@pytest.mark.parametrize("output, truth, correct", CASES)
def test_strict_reward_table(output, truth, correct):
    result = compute_score("math", output, truth)
    assert result["score"] == (1.0 if correct else -1.0), (output, truth, last_boxed(output))
    assert result["acc"] == float(correct)


def test_both_signs_are_well_represented():
    signs = [c for _, _, c in CASES]
    assert sum(signs) >= 40 and len(signs) - sum(signs) >= 25


def test_megabytes_of_output_score_fast():
    giant = "blah " * 400_000 + "\\boxed{7}"
    deep = "\\boxed{" + "{" * 50_000 + "7" + "}" * 50_000 + "}"
    start = time.perf_counter()
    assert compute_score("math", giant, "7")["score"] == 1.0
    compute_score("math", deep, "7")
    compute_score("math", "\\boxed{" * 200_000, "7")
    assert time.perf_counter() - start < 2.0


def test_normalisation_is_idempotent():
    for _, truth, _ in CASES:
        once = normalize_answer(truth)
        assert normalize_answer(once) == once


@pytest.mark.parametrize(
    "output, truth, correct",
    [
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
        ("\\boxed{0.6}", "\\frac{1}{2}", False),
    ],
)
def test_math_verify_turns_strict_false_negatives_into_positives(output, truth, correct):
    strict = compute_score("math", output, truth)
    assert strict["score"] == -1.0  # the strict checker alone says no
    result = compute_score("math", output, truth, math_verify=True)
    assert result["score"] == (1.0 if correct else -1.0)
    assert result["checker_math_verify"] == 1.0 and result["checker_strict"] == 0.0


def hang_on_loop(conn) -> None:
    """A stand-in child loop that never answers the question 'loop' (sympy on adversarial input)."""
    while True:
        gold, answer = conn.recv()
        if answer == "loop":
            time.sleep(3600)
        conn.send(gold == answer)


def test_a_hanging_check_times_out_to_unverified_and_the_next_call_works():
    from stapo.reward.verify import BoundedVerifier

    verifier = BoundedVerifier(timeout_s=0.5, serve=hang_on_loop)
    assert verifier.equivalent("1", "1") is True  # warm the child up
    start = time.perf_counter()
    assert verifier.equivalent("1", "loop") is None  # unverified, not a hang
    assert time.perf_counter() - start < 5.0
    assert verifier.equivalent("2", "2") is True  # a fresh child after the kill
    assert verifier.equivalent("x" * 3000, "1") is None  # oversized input is not sent to sympy


def test_real_math_verify_on_adversarial_latex_is_bounded():
    from stapo.reward.verify import BoundedVerifier

    verifier = BoundedVerifier(timeout_s=1.0)
    verifier.equivalent("1", "1")
    start = time.perf_counter()
    hard = "+".join(f"x^{{{k}}}" for k in range(300)) + "=" + "*".join(f"(x+{k})" for k in range(100))
    assert verifier.equivalent("\\frac{1}{3}", hard) in (None, False)
    assert time.perf_counter() - start < 1.0 + 25.0  # the deadline (+ a restart's grace at most)


def test_giant_inputs_with_think_blocks_stay_fast():
    start = time.perf_counter()
    unfinished = "<think>" + "hmm " * 1_000_000 + "\\boxed{7}"
    assert compute_score("math", unfinished, "7")["has_answer"] == 0.0
    finished = "<think>" + "hmm " * 1_000_000 + "</think>" + "x " * 500_000 + "\\boxed{7}"
    assert compute_score("math", finished, "7")["score"] == 1.0
    assert compute_score("math", "7", "\\boxed{" * 100_000)["score"] == -1.0  # junk ground truth
    assert time.perf_counter() - start < 2.0


def test_math_verify_switch_from_the_environment(monkeypatch):
    monkeypatch.setenv("STAPO_MATH_VERIFY", "1")
    result = compute_score("math", "\\boxed{0.5}", "\\frac{1}{2}")
    assert result["score"] == 1.0 and checker_name(result) == "math_verify"
    monkeypatch.setenv("STAPO_MATH_VERIFY", "0")
    assert checker_name(compute_score("math", "\\boxed{0.5}", "\\frac{1}{2}")) == "strict"


def test_math_verify_from_worker_threads():
    """verl calls the reward from an executor's threads, where signal-based timeouts fail."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [("\\boxed{0.5}", "\\frac{1}{2}", 1.0), ("\\boxed{0.6}", "\\frac{1}{2}", -1.0)] * 4
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda j: compute_score("math", j[0], j[1], math_verify=True)["score"], jobs))
    assert scores == [j[2] for j in jobs]


def test_every_result_has_the_same_numeric_keys():
    """verl builds its reward extra info from the first result's keys: they must never vary."""
    results = [compute_score("math", out, truth) for out, truth, _ in CASES]
    keys = {tuple(sorted(r)) for r in results}
    assert len(keys) == 1
    assert all(isinstance(v, float) for r in results for v in r.values())


def die_at_once(conn) -> None:
    """A stand-in child that crashes before answering."""
    raise SystemExit(3)


def test_a_crashing_checker_is_unverified_not_an_exception():
    from stapo.reward.verify import BoundedVerifier

    verifier = BoundedVerifier(timeout_s=0.5, serve=die_at_once)
    assert verifier.equivalent("1", "1") is None


def test_loaded_through_verls_custom_reward_hook_with_reward_kwargs():
    """The exact path verl takes: pkg://stapo.reward + compute_score, reward_kwargs merged in."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {
            "path": "pkg://stapo.reward", "name": "compute_score",
            "reward_kwargs": {"math_verify": True, "verify_timeout_s": 5},
        }}}
    )
    reward_fn = get_custom_reward_fn(config)
    result = reward_fn(data_source="stapo/math500", solution_str="so \\boxed{0.5}", ground_truth="\\frac12",
                       extra_info={"split": "test", "index": 0})
    assert result["score"] == 1.0 and result["checker_math_verify"] == 1.0
    assert reward_fn(data_source="x", solution_str="\\boxed{3}", ground_truth="3", extra_info=None)["score"] == 1.0


@pytest.mark.slow  # starts processes: out of make test-fast
def test_math_verify_and_its_deadline_inside_a_ray_actor():
    """Inside a Ray worker, from executor threads (as verl's reward loop calls it): real math-verify
    answers, a hanging check is cut at its deadline, and the next check works."""
    import os
    from pathlib import Path

    ray = pytest.importorskip("ray")
    root = str(Path(__file__).resolve().parents[2])
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}})
    try:
        @ray.remote
        def in_worker():
            from concurrent.futures import ThreadPoolExecutor

            from stapo.reward import compute_score
            from stapo.reward.verify import BoundedVerifier
            from tests.reward.test_boxed_reward import hang_on_loop

            jobs = [("\\boxed{0.5}", "\\frac{1}{2}"), ("\\boxed{0.6}", "\\frac{1}{2}")]
            with ThreadPoolExecutor(2) as pool:
                scores = list(pool.map(lambda j: compute_score("m", j[0], j[1], math_verify=True)["score"], jobs))
            verifier = BoundedVerifier(timeout_s=0.5, serve=hang_on_loop)
            verifier.equivalent("1", "1")
            start = time.perf_counter()
            hung = verifier.equivalent("1", "loop")
            return scores, hung, time.perf_counter() - start, verifier.equivalent("2", "2")

        scores, hung, seconds, after = ray.get(in_worker.remote(), timeout=240)
    finally:
        ray.shutdown()
    assert scores == [1.0, -1.0] and hung is None and seconds < 5.0 and after is True
