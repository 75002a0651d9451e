"""``stapo.custom_rule`` and ``stapo.import_files`` checked on the driver, before Ray starts.

A rule that fails inside a worker fails after a cluster start-up, a rollout and the old-policy pass, on every
rank. Here the file is imported, the function found and called once on a small synthetic batch (seeded: the
same batch every time), and each way it can break the contract (stapo.algorithm.custom_rule) is refused in
one line naming the file, the line and the reason: a missing file or function, an import error, an error
raised by the rule, a return value of the wrong shape or dtype, a NaN or negative weight, an input changed
in place. What the rule returned (a mask or a weight) is its kind from then on; ``stapo check`` prints its
keep ratio or mean weight on that batch. The loss files are imported, so the registry check
(``run_checks._check_registered``) sees the losses they register.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from stapo.algorithm.validation import STAPOConfigError
from stapo.verl_plugin.training.custom_rule import (
    RULE_KEY,
    TOKEN_MASK_KEY,
    RuleSetting,
    error_location,
    find_function,
    function_line,
    import_files,
    load_file,
    register_rule,
    rule_setting,
)

ROWS, LENGTH, SEED = 8, 32, 0


def synthetic_batch(rows: int = ROWS, length: int = LENGTH, seed: int = SEED) -> dict[str, torch.Tensor]:
    """A padded batch as a rule receives one: rows of different lengths (one empty), half the responses with a
    positive advantage, one with 0, a tail of improbable tokens (p = u^3: about one token in eight below
    S2T's 0.002) and entropies in [0, 4). float32, as verl's old-policy pass."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, length + 1, (rows,), generator=generator)
    lengths[-1] = 0
    response_mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    log_prob = 3.0 * torch.rand(rows, length, generator=generator).clamp(min=1e-12).log()
    entropy = 4.0 * torch.rand(rows, length, generator=generator)
    per_row = torch.tensor([1.0, -1.0] * (rows // 2) + [1.0] * (rows % 2))
    per_row[0] = 0.0
    advantages = per_row.unsqueeze(1).expand(rows, length).clone()
    zero = torch.zeros(())
    tensors = {
        "log_prob": torch.where(response_mask, log_prob, zero),
        "entropy": torch.where(response_mask, entropy, zero),
        "advantages": torch.where(response_mask, advantages, zero),
        "response_mask": response_mask,
    }
    tensors["old_log_prob"] = tensors["log_prob"].clone()
    return tensors


@dataclass(frozen=True)
class RuleCheck:
    """What the check found: the rule's kind, and its keep ratio (a mask) or mean weight (a weight)."""

    setting: RuleSetting
    where: str
    kind: str
    ratio_name: str
    ratio: float

    def note(self) -> str:
        return (f"custom rule {self.where} ({self.setting.name}): a {self.kind}, {self.ratio_name} {self.ratio:.4f} "
                f"on a synthetic batch of {ROWS} x {LENGTH} tokens; it replaces the preset's rule as "
                f"{TOKEN_MASK_KEY}={self.setting.registry_name}")


def check_rule_function(fn, setting: RuleSetting) -> RuleCheck:
    """Call the rule once on :func:`synthetic_batch` (its helper over this process only) and refuse what breaks
    the contract; the returned kind is the one every process registers."""
    from stapo.algorithm.custom_rule import (
        call_arguments,
        keep_or_weight_ratio,
        output_problem,
        parameters_problem,
        scope_quantile,
    )

    where = function_line(fn, setting.located())
    label = f"{where} ({setting.name})"
    problem = parameters_problem(fn)
    if problem:
        raise STAPOConfigError(f"{label}: {problem}")
    tensors = synthetic_batch()
    pristine = {name: value.clone() for name, value in tensors.items()}
    try:
        output = fn(**call_arguments(fn, tensors, scope_quantile(None), setting.kwargs))
    except Exception as error:  # the user's code: located in the user's file
        raise STAPOConfigError(
            f"{error_location(error, setting.located())} ({setting.name}): raised on a synthetic batch: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    changed = [name for name, value in tensors.items() if not torch.equal(value, pristine[name])]
    if changed:
        raise STAPOConfigError(f"{label}: changes its input(s) {changed} in place; compute new tensors instead")
    mask = tensors["response_mask"]
    problem, kind = output_problem(output, mask, mask)
    if problem:
        raise STAPOConfigError(f"{label}: {problem}")
    ratio_name, ratio = keep_or_weight_ratio(output, mask)
    if not math.isfinite(ratio):
        raise STAPOConfigError(f"{label}: its {ratio_name} on a synthetic batch is {ratio}")
    return RuleCheck(setting, where, kind, ratio_name, ratio)


def check_rule(setting: RuleSetting) -> RuleCheck:
    """Import the file, find the function, check it, and register it in this process."""
    fn = find_function(load_file(setting.path, f"{RULE_KEY}.path", setting.fallback), setting)
    found = check_rule_function(fn, setting)
    register_rule(RuleSetting(setting.path, setting.name, setting.kwargs, found.kind, setting.fallback), fn)
    return found


def check_custom_files(config) -> RuleCheck | None:
    """The loss files imported and the rule checked and registered in this process (the driver, the TaskRunner);
    the rule's check, or None without one. Run first by ``validate_run_config``."""
    for path, fallback in import_files(config):
        load_file(path, "stapo.import_files", fallback)
    setting = rule_setting(config)
    from omegaconf import OmegaConf

    named = OmegaConf.select(config, TOKEN_MASK_KEY, default=None)
    if setting is None:
        if isinstance(named, str) and named.startswith("custom:"):
            raise STAPOConfigError(
                f"{TOKEN_MASK_KEY}={named} names a custom rule: set {RULE_KEY}.path and {RULE_KEY}.name instead"
            )
        return None
    from stapo.verl_plugin.training.config import TARGET  # imports verl: not at the top (see run_checks)

    target = OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss._target_", default=None)
    if target != TARGET:
        raise STAPOConfigError(
            f"{RULE_KEY} needs actor_rollout_ref.actor.policy_loss._target_={TARGET} (got {target}), which types "
            "token_mask; the conf/algo presets set it"
        )
    if isinstance(named, str) and named.startswith("custom:") and named != setting.registry_name:
        raise STAPOConfigError(
            f"{TOKEN_MASK_KEY}={named} and {RULE_KEY}.name={setting.name} disagree: leave token_mask to the recipe"
        )
    return check_rule(setting)


def effective_token_mask(config, name: str) -> str:
    """The token rule a run trains with: the custom rule's registry name when one is set, else ``name``."""
    setting = rule_setting(config)
    return setting.registry_name if setting is not None else name
