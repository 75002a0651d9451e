"""A reward function for verl's custom-reward hook: 1.0 when the reply's last ``\\boxed{}`` holds the answer.

Use it with the recipe (or verl's own trainer):

    reward.custom_reward_function.path=$PWD/recipe/stapo/examples/my_reward.py
    reward.custom_reward_function.name=compute_score

(an absolute path: verl opens it from every reward worker's own directory).

verl 0.9.1 imports this file in its reward workers and calls the function once per response, with
keywords: ``data_source``, ``solution_str`` (the decoded response, special tokens removed),
``ground_truth`` (the row's ``reward_model.ground_truth``) and ``extra_info`` (the row's ``extra_info``,
to which verl adds ``num_turns`` and ``rollout_reward_scores``). Each ``reward_kwargs`` entry of the config
(``+reward.custom_reward_function.reward_kwargs.format_score=0.1``) arrives as one more keyword; ``**kwargs``
takes the ones this function does not name (verl passes more with a reward model). It returns a float, or a
dict whose ``"score"`` is the reward; the dict's other numbers are logged by verl as reward extra info.
recipe/stapo/examples/README.md shows the data rows it reads and the whole command.
"""

from __future__ import annotations

from typing import Any

from stapo.reward import last_boxed, normalize_answer


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    format_score: float = 0.0,
    **kwargs: Any,
) -> dict[str, float]:
    """1.0 for the right final answer; ``format_score`` for a boxed answer that is wrong; 0.0 without one.

    The answer is the content of the last ``\\boxed{}`` (after a closing ``</think>``, if any) and both sides
    are normalised the way the paper's reward does (``\\dfrac`` = ``\\frac``, ``3.0`` = ``3``, no ``$``, ...).
    """
    answer = last_boxed(solution_str)
    expected = normalize_answer(str(ground_truth))
    correct = answer is not None and expected != "" and normalize_answer(answer) == expected
    if correct:
        score = 1.0
    else:
        score = float(format_score) if answer is not None else 0.0
    return {"score": score, "acc": float(correct)}
