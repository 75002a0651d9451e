"""Real verl inputs for the integration tests: Hydra-composed configs and jagged micro-batches.

Micro-batches are laid out the way verl's FSDP engine hands them to the loss function (nested
prompts/responses, response-only masks, model log-probs over the whole sequence, left-shifted by
one), so the tests drive verl's own ``ppo_loss`` rather than a copy of it.
"""

from __future__ import annotations

import torch
from hydra import compose, initialize_config_module
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass

from stapo.verl_plugin.config import TARGET

PL = "actor_rollout_ref.actor.policy_loss"


def compose_verl(overrides: list[str]):
    """verl's own ppo_trainer config with the given Hydra overrides."""
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def stapo_overrides(**policy_loss) -> list[str]:
    overrides = [
        f"{PL}._target_={TARGET}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=10.0",
    ]
    for key, value in policy_loss.items():
        prefix = "" if key == "loss_mode" else "+"
        overrides.append(f"{prefix}{PL}.{key}={value}")
    return overrides


def actor_config(**policy_loss):
    return omega_conf_to_dataclass(compose_verl(stapo_overrides(**policy_loss)).actor_rollout_ref.actor)


def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def make_micro_batch(rows: dict[str, list[torch.Tensor]], prompt_lens: list[int], batch_num_tokens: int, global_bsz: int):
    """A micro-batch TensorDict and a model output whose response log-probs are ``rows['log_prob']``.

    Returns ``(model_output, data, leaf)`` where ``leaf`` is the flat tensor the gradient reaches.
    """
    pieces = []
    for prompt_len, log_prob in zip(prompt_lens, rows["log_prob"]):
        # positions prompt_len-1 .. prompt_len+resp_len-2 predict the response tokens
        pieces += [torch.zeros(prompt_len - 1, dtype=log_prob.dtype), log_prob, torch.zeros(1, dtype=log_prob.dtype)]
    leaf = torch.cat(pieces).detach().requires_grad_(True)
    lengths = torch.tensor([p + len(r) for p, r in zip(prompt_lens, rows["log_prob"])])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(leaf, offsets)}
    if "model_entropy" in rows:
        entropy_pieces = []
        for prompt_len, entropy in zip(prompt_lens, rows["model_entropy"]):
            entropy_pieces += [torch.zeros(prompt_len - 1), entropy, torch.zeros(1)]
        model_output["entropy"] = torch.nested.nested_tensor_from_jagged(torch.cat(entropy_pieces), offsets)
    data = TensorDict(
        {
            "prompts": jagged([torch.ones(p, dtype=torch.long) for p in prompt_lens]),
            "responses": jagged([torch.ones(len(r), dtype=torch.long) for r in rows["log_prob"]]),
            "response_mask": jagged(rows["response_mask"]),
            "loss_mask": jagged(rows["loss_mask"]),
            "old_log_probs": jagged(rows["old_log_prob"]),
            "advantages": jagged(rows["advantages"]),
        },
        batch_size=len(prompt_lens),
    )
    tu.assign_non_tensor(data, batch_num_tokens=batch_num_tokens, dp_size=1, global_batch_size=global_bsz)
    return model_output, data, leaf
