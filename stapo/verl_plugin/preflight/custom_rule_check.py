"""``stapo.custom_rule`` and ``stapo.import_files`` checked on the driver, before Ray starts.

A rule that fails inside a worker fails after a cluster start-up, a rollout and the old-policy pass, on every
rank. Here the file is imported, the function found and called on synthetic batches (seeded: the same batches
every time; ragged, rows of different lengths and one empty): a small one, and one of the run's own shape
(``data.train_batch_size`` x ``rollout.n`` rows of ``data.max_response_length`` tokens, fewer rows past
``MAX_CHECK_TOKENS``), so a rule written for one shape fails here. Each way it can break the contract
(stapo.algorithm.custom_rule) is refused in one line naming the file, the line and the reason: a missing file
or function, an import error, a keyword of ``stapo.custom_rule.kwargs`` the function does not take, an error
raised by the rule (at the line that raised; an exit too), a return value of the wrong shape or dtype, a NaN,
negative or too large weight (``stapo.custom_rule.max_weight``), an input changed in place. What the rule
returned (a mask or a weight) is its kind from then on; ``stapo check`` prints its keep ratio or mean weight on
the run-shaped batch. The loss files are imported, so the registry check (``run_checks._check_registered``)
sees the losses they register.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from stapo.algorithm.validation import STAPOConfigError
from stapo.verl_plugin.training.custom_rule import (
    RULE_KEY,
    TOKEN_MASK_KEY,
    RuleSetting,
    describe_error,
    error_location,
    file_digest,
    find_function,
    function_line,
    import_files,
    load_file,
    register_rule,
    rule_setting,
)

ROWS, LENGTH, SEED = 8, 32, 0
# the run-shaped batch's cap (rows are dropped past it, the length kept): about 100 MB over the five tensors
MAX_CHECK_TOKENS = 1 << 22


def synthetic_batch(rows: int = ROWS, length: int = LENGTH, seed: int = SEED) -> dict[str, torch.Tensor]:
    """A padded batch as a rule receives one: rows of different lengths (one empty), half the responses with a
    positive advantage, one with 0, a tail of improbable tokens (p = u^3: about one token in eight below
    S2T's 0.002) and entropies in [0, 4). float32, as verl's old-policy pass."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min(4, length), length + 1, (rows,), generator=generator)
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
    shape: tuple[int, int] = (ROWS, LENGTH)  # the largest batch it was called on
    sha256: str = ""  # of the file checked: what every process compares before it runs it

    def note(self) -> str:
        bound = f", weights up to max_weight={self.setting.max_weight:g}" if self.kind == "weight" else ""
        small = f" (and {ROWS} x {LENGTH})" if tuple(self.shape) != (ROWS, LENGTH) else ""
        return (f"custom rule {self.where} ({self.setting.name}): a {self.kind}, {self.ratio_name} {self.ratio:.4f} "
                f"on a synthetic batch of {self.shape[0]} x {self.shape[1]} tokens{small}{bound}; "
                f"it replaces the preset's rule as {TOKEN_MASK_KEY}={self.setting.registry_name}; sha256 "
                f"{self.sha256[:12]}, checked again in every process")


def run_shape(config) -> tuple[int, int]:
    """(rows, response length) of the run's batch: ``train_batch_size`` x ``rollout.n`` rows of
    ``max_response_length`` tokens, rows capped so the batch holds at most ``MAX_CHECK_TOKENS``."""
    from omegaconf import OmegaConf

    def number(key: str, default: int) -> int:
        value = OmegaConf.select(config, key, default=None)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

    length = number("data.max_response_length", LENGTH)
    rows = number("data.train_batch_size", ROWS) * number("actor_rollout_ref.rollout.n", 1)
    return max(1, min(rows, MAX_CHECK_TOKENS // length)), length


def check_rule_function(fn, setting: RuleSetting, shape: tuple[int, int] | None = None) -> RuleCheck:
    """Call the rule on :func:`synthetic_batch` and on one of ``shape`` (its helper over this process only) and
    refuse what breaks the contract; the returned kind (the same on both) is the one every process registers."""
    from stapo.algorithm.custom_rule import kwargs_problem, parameters_problem

    where = function_line(fn, setting.located())
    label = f"{where} ({setting.name})"
    problem = parameters_problem(fn) or kwargs_problem(fn, setting.kwargs)
    if problem:
        raise STAPOConfigError(f"{label}: {problem}")
    shapes = [(ROWS, LENGTH)] + ([tuple(shape)] if shape and tuple(shape) != (ROWS, LENGTH) else [])
    kind = ratio_name = ratio = None
    for rows, length in shapes:
        found, ratio_name, ratio = call_on_batch(fn, setting, label, synthetic_batch(rows, length))
        if kind is not None and found != kind:
            raise STAPOConfigError(f"{label}: returned a {kind} on {ROWS} x {LENGTH} tokens and a {found} on {rows} "
                                   f"x {length}: a rule must return one kind")
        kind = found
    return RuleCheck(setting, where, kind, ratio_name, ratio, shapes[-1])


def call_on_batch(fn, setting: RuleSetting, label: str, tensors: dict) -> tuple[str, str, float]:
    """One call of the rule on ``tensors``: (its kind, the ratio's name, the ratio), or a one-line refusal."""
    from stapo.algorithm.custom_rule import call_arguments, keep_or_weight_ratio, output_problem, scope_quantile

    pristine = {name: value.clone() for name, value in tensors.items()}
    mask = tensors["response_mask"]
    shape = f"{mask.shape[0]} x {mask.shape[1]}"
    try:
        output = fn(**call_arguments(fn, tensors, scope_quantile(None), setting.kwargs))
    except KeyboardInterrupt:  # the user stopping the check, not the rule's fault
        raise
    except BaseException as error:  # the user's code (an exit too): located in the user's file
        raise STAPOConfigError(
            f"{error_location(error, setting.located())} ({setting.name}): raised on a synthetic batch of {shape}: "
            f"{describe_error(error)}"
        ) from None
    changed = [name for name, value in tensors.items() if not torch.equal(value, pristine[name])]
    if changed:
        raise STAPOConfigError(f"{label}: changes its input(s) {changed} in place; compute new tensors instead")
    problem, kind = output_problem(output, mask, mask, setting.max_weight)
    if problem:
        raise STAPOConfigError(f"{label}: {problem} (a synthetic batch of {shape})")
    ratio_name, ratio = keep_or_weight_ratio(output, mask)
    if not math.isfinite(ratio):
        raise STAPOConfigError(f"{label}: its {ratio_name} on a synthetic batch of {shape} is {ratio}")
    return kind, ratio_name, ratio


def check_rule(setting: RuleSetting, shape: tuple[int, int] | None = None) -> RuleCheck:
    """Import the file, find the function, check it, and register it in this process."""
    fn = find_function(load_file(setting.path, f"{RULE_KEY}.path", setting.fallback, setting.sha256), setting)
    found = check_rule_function(fn, setting, shape)
    digest = file_digest(setting.located())
    register_rule(RuleSetting(setting.path, setting.name, setting.kwargs, found.kind, setting.fallback, digest,
                              setting.max_weight), fn)
    return replace(found, sha256=digest)


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
    return check_rule(setting, run_shape(config))


def effective_token_mask(config, name: str) -> str:
    """The token rule a run trains with: the custom rule's registry name when one is set, else ``name``."""
    setting = rule_setting(config)
    return setting.registry_name if setting is not None else name
