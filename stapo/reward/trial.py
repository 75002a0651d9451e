"""Trying a reward function on a data file's own rows, as verl's reward manager would call it (no verl here).

``stapo check`` (stapo/verl_plugin/preflight/reward_check.py) and ``stapo reward test`` (stapo/reward/cli.py)
read a few rows of the training file, build the keywords verl 0.9.1's reward managers pass
(verl/experimental/reward_loop/reward_manager/naive.py: ``data_source``, ``solution_str``, ``ground_truth``,
``extra_info`` with ``num_turns`` and ``rollout_reward_scores`` added, then the config's ``reward_kwargs``) and
read the score as the manager does (a number, or a dict's ``"score"``). A reply is only plausible: the row's own
answer written the ways rewards commonly read it (bare, in the last ``\\boxed{}``, after ``####``), and the same
with a wrong answer, so that a reward which cannot tell them apart is noticed before a run learns nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# what verl's agent loop reports for a single-turn chat (the prompt and the reply)
SINGLE_TURN = 2
# the ways a reply commonly carries its final answer: bare (an exact-match reward), the paper's \boxed{} and
# the GSM8K "#### answer" line (verl's gsm8k reward); tried in this order until the right answer scores higher
REPLY_FORMATS = (("bare", "{}"), ("in \\boxed{}", "The answer is \\boxed{{{}}}."), ("after ####", "#### {}"))


@dataclass(frozen=True)
class Reply:
    """One reply tried on a row: how it was made (``label``), its text, and for a made one whether it holds the
    row's answer (``right``) and in which of :data:`REPLY_FORMATS` (``form``)."""

    label: str
    text: str
    right: bool | None = None
    form: str = ""


def call_keywords(row: dict[str, Any], reply: str, reward_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keywords verl's naive reward manager calls a reward with for ``row`` and ``reply``; ``reward_kwargs``
    (``reward.custom_reward_function.reward_kwargs``) win on a clash, as in verl's ``_call_with_kwargs``."""
    extra_info = dict(row.get("extra_info") or {})
    extra_info["num_turns"] = SINGLE_TURN
    extra_info["rollout_reward_scores"] = {}
    keywords = {"data_source": row.get("data_source"), "solution_str": reply,
                "ground_truth": ground_truth(row), "extra_info": extra_info}
    return {**keywords, **(reward_kwargs or {})}


def ground_truth(row: dict[str, Any]) -> Any:
    """``reward_model.ground_truth`` of a row (None when it has none)."""
    reward_model = row.get("reward_model") or {}
    return reward_model.get("ground_truth") if isinstance(reward_model, dict) else None


def answer_text(truth: Any) -> str:
    """The ground truth as a model would write it: the first of a list of accepted answers, else its text."""
    if isinstance(truth, (list, tuple)) and truth:
        truth = truth[0]
    return "" if truth is None else str(truth)


def wrong_answer(answer: str) -> str:
    """An answer that is not ``answer``: the next number for a number, else a word that differs from it."""
    text = answer.strip()
    try:
        number = int(text.replace(",", ""))
        return str(number + 1)
    except ValueError:
        pass
    try:
        value = float(text)
        if math.isfinite(value):
            return repr(value + 1.0)
    except ValueError:
        pass
    return "none" if text.lower() != "none" else "unknown"


def reply_pairs(truth: Any) -> list[tuple[Reply, Reply]]:
    """(right, wrong) replies for a row's ground truth, one pair for each of :data:`REPLY_FORMATS`."""
    answer = answer_text(truth)
    wrong = wrong_answer(answer)
    return [(Reply(f"the ground truth, {label}", pattern.format(answer), True, label),
             Reply(f"a wrong answer, {label}", pattern.format(wrong), False, label))
            for label, pattern in REPLY_FORMATS]


def score_of(result: Any) -> float:
    """The score verl takes from a reward's return value (a number, or a dict's ``"score"``), as a float;
    ``ValueError`` with the reason when verl could not use it (no ``"score"``, not a number, NaN or infinite)."""
    value = result
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a dict without a 'score' key (keys {sorted(map(str, result))})")
        value = result["score"]
    if isinstance(value, (str, bytes)) or value is None:
        raise ValueError(f"{_short(value)}, not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{_short(value)} ({type(value).__name__}), not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{number}: a score must be finite (a NaN or infinite reward poisons every advantage "
                         "of its group)")
    return number


def read_rows(path: str | Path, count: int) -> list[dict[str, Any]]:
    """The first ``count`` rows of a parquet, JSON-lines or JSON file (the formats verl's RLHFDataset reads)."""
    file = Path(path)
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(file)
        for batch in parquet.iter_batches(batch_size=max(count, 1)):
            return batch.to_pylist()[:count]
        return []
    text = file.read_text(encoding="utf-8", errors="replace")
    if file.suffix == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines()[: count * 4] if line.strip()]
    return [row for row in rows if isinstance(row, dict)][:count]


def prompt_text(row: dict[str, Any], prompt_key: str = "prompt") -> str:
    """The last user message of a row's chat prompt (or the prompt itself when it is text)."""
    prompt = row.get(prompt_key)
    if isinstance(prompt, (list, tuple)):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        contents = users or [m.get("content") for m in prompt if isinstance(m, dict)]
        prompt = contents[-1] if contents else ""
    return "" if prompt is None else str(prompt)


def one_line(text: Any, width: int = 80) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _short(value: Any) -> str:
    return one_line(repr(value), 60)
