"""The paper's reward for verl's custom-reward hook: +1 / -1 from the last ``\\boxed{}`` answer.

Use with ``reward.custom_reward_function.path=pkg://stapo.reward`` and ``.name=compute_score``.
"""

from stapo.reward.boxed import checker_name, compute_score, last_boxed, normalize_answer

__all__ = ["checker_name", "compute_score", "last_boxed", "normalize_answer"]
