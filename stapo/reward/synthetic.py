"""Reward of the tiny CPU smoke task (``model_preset=tiny``), and only of that task.

A randomly initialised 100k-parameter model cannot do arithmetic, so the paper's strict reward
would give every response -1, every advantage 0 and nothing to learn or to mask. This reward
gives partial credit: +1 when the reply contains the last digit of the answer, -1 otherwise, which
the untrained tiny model hits about a third of the time, so most groups have mixed outcomes and
the whole STAPO path runs. ``acc`` still reports the strict last-``\\boxed{}`` match. Never use it
for real experiments.
"""

from __future__ import annotations

from typing import Any

from stapo.reward.boxed import compute_score as strict_score


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs) -> dict:
    answer = str(ground_truth).strip()
    partial = bool(answer) and answer[-1] in (solution_str or "")
    strict = strict_score(data_source, solution_str, ground_truth, extra_info)
    return {"score": 1.0 if partial else -1.0, "acc": strict["acc"], "has_answer": strict["has_answer"]}
