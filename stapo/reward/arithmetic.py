"""Reward of the CPU demo (``stapo demo``, ``model_preset=smollm2``): answer credit with a format bonus.

SmolLM2-135M-Instruct almost never writes ``\\boxed{}`` unprompted by training, so the paper's strict
+1/-1 reward would be -1 for nearly every response: no group with mixed outcomes, no advantage, no
learning signal in a 15-minute run. This reward credits the final answer wherever it is written and
pays more for the paper's format, so the run can both get answers right and learn to box them:

* +1.0  the last ``\\boxed{}`` holds the right answer (what the paper's reward pays);
* +0.5  no box, but the last number of the reply is the right answer;
* -1.0  otherwise.

``acc`` is "the final answer is right" (box or last number); ``boxed_acc`` is the paper's strict
accuracy. Bounded time: only the tail of the reply is scanned, with linear-time regexes.
"""

from __future__ import annotations

import re
from typing import Any

from stapo.reward.boxed import as_reply_text, ground_truths, last_boxed, normalize_answer

MAX_SCAN_CHARS = 2_000
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number in the tail of ``text``, thousands separators removed."""
    numbers = _NUMBER.findall(text[-MAX_SCAN_CHARS:])
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs) -> dict:
    reply = as_reply_text(solution_str)
    truths = ground_truths(ground_truth)
    truth = normalize_answer(truths[0]) if truths else None  # no ground truth: nothing can be right
    boxed = last_boxed(reply)
    boxed_right = truth is not None and boxed is not None and normalize_answer(boxed) == truth
    number = None if boxed is not None else last_number(reply)
    number_right = truth is not None and number is not None and normalize_answer(number) == truth
    score = 1.0 if boxed_right else 0.5 if number_right else -1.0
    return {
        "score": score,
        "acc": float(boxed_right or number_right),
        "boxed_acc": float(boxed_right),
        "has_box": float(boxed is not None),
    }
