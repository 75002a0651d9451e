"""Reward of the tiny CPU smoke task (``model_preset=tiny``), and only of that task.

A randomly initialised 100k-parameter model cannot do arithmetic, so the paper's strict reward
would give every response -1, every advantage 0 and nothing to learn or to mask. This reward
credits the *form*: +1 when the reply contains a number, -1 otherwise, which a random model hits
about half the time, so every group has mixed outcomes and the whole STAPO path runs. ``acc``
still reports the strict last-``\\boxed{}`` match. Never use it for real experiments.
"""

from __future__ import annotations

import re
from typing import Any

from stapo.reward.boxed import compute_score as strict_score

_DIGIT = re.compile(r"\d")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs) -> dict:
    has_number = bool(_DIGIT.search(solution_str or ""))
    strict = strict_score(data_source, solution_str, ground_truth, extra_info)
    return {"score": 1.0 if has_number else -1.0, "acc": strict["acc"], "has_answer": strict["has_answer"]}
