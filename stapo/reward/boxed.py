"""Strict last-``\\boxed{}`` matching (DAPO-style), bounded in time by construction: no sympy."""

from __future__ import annotations

import re
from typing import Any

MAX_SCAN_CHARS = 20_000  # only the tail of a reply can hold its final answer; megabytes stay fast
_BOXED = "\\boxed"


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed) or ``\\boxed x``; None if absent."""
    text = text[-MAX_SCAN_CHARS:]
    if "</think>" in text:  # judge only the answer after a reasoning block
        text = text.rsplit("</think>", 1)[1]
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    rest = text[start + len(_BOXED) :]
    if rest.startswith(" "):
        match = re.match(r"\s+([^\s$]+)", rest)
        return match.group(1) if match else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for index, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:index]
    return None  # unbalanced: no answer


_REMOVE = [r"\left", r"\right", r"\!", r"\,", r"\;", r"\ ", "\\$", "$", r"^\circ", r"^{\circ}", "\\%", "%"]


def normalize_answer(answer: str) -> str:
    """Canonical string form: no spaces or TeX spacing, unified fractions and minus, no trailing dot."""
    text = answer.strip().replace("\u2212", "-")
    text = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", text)
    for token in _REMOVE:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"(\d),(?=\d{3}(\D|$))", r"\1", text)  # thousands separators
    text = text.replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?\d+\.0+", text):
        text = text.split(".")[0]
    return text


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Any = None,
    math_verify: bool = False,
    verify_timeout_s: float = 5.0,
    **kwargs,
) -> dict:
    """verl custom-reward signature: +1 / -1 from the strict match of the last ``\\boxed{}``.

    With ``math_verify=True`` (``+reward.custom_reward_function.reward_kwargs.math_verify=true``)
    a strict miss gets a second opinion from math-verify, bounded by ``verify_timeout_s``; the
    ``checker_*`` flags (verl reward extra info) say which checker decided.
    """
    extracted = last_boxed(solution_str or "")
    truth = str(ground_truth)
    correct = extracted is not None and normalize_answer(extracted) == normalize_answer(truth)
    decided_by = "strict"
    if not correct and math_verify and extracted is not None:
        from stapo.reward.verify import default_verifier

        verdict = default_verifier(verify_timeout_s).equivalent(truth, extracted)
        correct, decided_by = bool(verdict), ("timeout" if verdict is None else "math_verify")
    return {
        "score": 1.0 if correct else -1.0,
        "acc": float(correct),
        "has_answer": float(extracted is not None),
        "checker_strict": float(decided_by == "strict"),
        "checker_math_verify": float(decided_by == "math_verify"),
        "checker_timeout": float(decided_by == "timeout"),
    }
