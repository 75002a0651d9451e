"""A user's token rule as an entry of the token-mask registry (docs/algorithm.md section 10).

Why an adapter and not a new code path: registered as ``custom:NAME`` next to ``stapo`` and ``taco``, the
user's function is folded, renormalised, logged and compared by the very code that runs the built-in rules
(``stapo.algorithm.masks``), so two runs that differ only in the rule differ only in the rule.

The rule is called with keywords, each a tensor of one shape ``(batch, response_len)`` (padded; the
padding is where ``response_mask`` is False): ``log_prob`` and ``old_log_prob`` (both the old-policy
pass, made before the update: the only source a custom rule runs from), ``entropy``, ``advantages`` (one
value per token) and ``response_mask``; and ``quantile(values, q)``, the exact linear quantile of the
finite ``values`` over the scope STAPO takes its threshold over (every DP rank, per mini-batch with
``threshold_scope: mini_batch``; ``stapo.algorithm.quantile``), NaN when the scope holds none. It
returns a bool tensor (True: the token keeps its gradient; a dropped token leaves the sum and the count,
as S2T's) or a float weight per token (>= 0 and at most the rule's ``max_weight``, multiplying the token's loss,
the token staying in the count, as TACO's). Pure torch: the file is loaded by
``stapo.verl_plugin.training.custom_rule``.
"""

from __future__ import annotations

import inspect
import math
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from stapo.algorithm.masks import (
    TOKEN_MASK_REGISTRY,
    WEIGHT_RATIOS,
    MaskInputs,
    MaskSettings,
    TokenMask,
    count,
    register_token_mask,
    weighted_mask,
)
from stapo.algorithm.quantile import all_reduce_sum, global_quantile

CUSTOM_PREFIX = "custom:"
KINDS = ("mask", "weight")
# the tensors a rule may take, by name, and the helper
TENSOR_NAMES = ("log_prob", "old_log_prob", "entropy", "advantages", "response_mask")
HELPER_NAME = "quantile"
MASK_RATIOS = {"mask_ratio": ("num_dropped", "num_response_tokens"), "keep_ratio": ("num_kept", "num_response_tokens")}


class RuleOutputError(ValueError):
    """The rule's return value breaks the contract (the message says how; the caller names the file)."""


def registry_name(function_name: str) -> str:
    return CUSTOM_PREFIX + function_name


def is_custom(name: str) -> bool:
    return name.startswith(CUSTOM_PREFIX)


def scope_quantile(group: dist.ProcessGroup | None) -> Callable[[torch.Tensor, float], float]:
    """``quantile(values, q)`` over every rank of ``group``: S2T's own exact quantile
    (``global_quantile``), of the finite values only (a NaN cannot be ranked: S2T leaves such a candidate
    out too). A collective: every rank must call it as often, in the same order."""

    def quantile(values: torch.Tensor, q: float) -> float:
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"quantile(values, q) takes a tensor, got {type(values).__name__}")
        q = float(q)
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1], got {q}")
        flat = values.detach().reshape(-1)
        return global_quantile(flat[torch.isfinite(flat)], q, group)

    return quantile


def parameters_problem(fn: Callable) -> str | None:
    """What of ``fn``'s signature cannot be served (a required parameter the rule is not given), or None."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    given = {*TENSOR_NAMES, HELPER_NAME}
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.kind is parameter.POSITIONAL_ONLY:
            return f"parameter {name!r} is positional-only: a rule is called with keywords"
        if name not in given and parameter.default is parameter.empty:
            return f"takes a parameter {name!r} that is not passed (a rule receives {sorted(given)} by name)"
    return None


def named_parameters(fn: Callable):
    """``fn``'s parameters when it names every keyword it takes; None when it takes ``**kwargs`` (any keyword) or
    its signature cannot be read (then nothing can be said about its keywords)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    return None if any(p.kind is p.VAR_KEYWORD for p in parameters.values()) else parameters


def kwargs_problem(fn: Callable, kwargs: dict) -> str | None:
    """Which of the fixed ``kwargs`` ``fn`` does not take (a misspelt keyword is otherwise never passed), or None."""
    parameters = named_parameters(fn)
    if parameters is None:
        return None
    unknown = sorted(set(kwargs) - set(parameters))
    if not unknown:
        return None
    own = sorted(name for name, p in parameters.items()
                 if name not in (*TENSOR_NAMES, HELPER_NAME) and p.kind is not p.VAR_POSITIONAL)
    return f"takes no keyword {unknown} (stapo.custom_rule.kwargs); the keywords it takes: {own}"


def raising_line(error: BaseException, path: str) -> int | None:
    """The line of the innermost frame of ``error`` in the file ``path`` (the line that raised, not the ``def``),
    or None when the error did not pass through that file."""
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if _same_file(frame.filename, path)]
    return lines[-1] if lines else None


def _same_file(filename: str, path: str) -> bool:
    try:
        return os.path.samefile(filename, path)
    except OSError:  # a frame of no file on disk (<string>, a deleted file)
        return False


def raise_site(error: BaseException, fn: Callable) -> str | None:
    """``file:line`` of the line in ``fn``'s own file that raised, or None when the error did not pass through it."""
    code = getattr(fn, "__code__", None)
    line = raising_line(error, code.co_filename) if code is not None else None
    return f"{code.co_filename}:{line}" if line else None


def describe_raise(error: BaseException, fn: Callable) -> str:
    """``raised TYPE: message at file:line``, one line (an exit named as one: its text is a bare code)."""
    text = str(error).splitlines()[0] if str(error) else ""
    if isinstance(error, SystemExit):
        text = f"the rule exits the process (sys.exit({error.code!r}))"
    site = raise_site(error, fn)
    return f"raised {type(error).__name__}: {text}" + (f" at {site}" if site else "")


def call_arguments(fn: Callable, tensors: dict[str, torch.Tensor], quantile, kwargs: dict) -> dict:
    """The keywords ``fn`` accepts: every tensor and the helper when it takes ``**kwargs``, else those it names."""
    offered = {**tensors, HELPER_NAME: quantile, **kwargs}
    parameters = named_parameters(fn)
    if parameters is None:
        return offered
    return {name: value for name, value in offered.items() if name in parameters}


def output_problem(output, like: torch.Tensor, response_mask: torch.Tensor,
                   max_weight: float = math.inf) -> tuple[str | None, str | None]:
    """``(problem, kind)``: why ``output`` is not a rule's answer for tensors shaped as ``like`` (None if it is),
    and whether it is a ``mask`` or a ``weight``; a weight above ``max_weight`` is refused with the bound."""
    if not isinstance(output, torch.Tensor):
        return f"returned {type(output).__name__}, not a tensor (bool: keep; float: weight)", None
    if tuple(output.shape) != tuple(like.shape):
        return f"returned shape {tuple(output.shape)}, the inputs' shape is {tuple(like.shape)}", None
    if output.dtype == torch.bool:
        return None, "mask"
    if not output.dtype.is_floating_point:
        return f"returned dtype {output.dtype}: a bool mask (True keeps the gradient) or a float weight", None
    values = output.detach()[response_mask]
    nonfinite = int((~torch.isfinite(values)).sum())
    if nonfinite:
        return f"returned {nonfinite} non-finite weight(s) (NaN or inf) at response tokens", "weight"
    negative = int((values < 0).sum())
    if negative:
        return f"returned {negative} negative weight(s) at response tokens (min {float(values.min()):.4g})", "weight"
    above = int((values > max_weight).sum())
    if above:
        return (f"returned {above} weight(s) above max_weight={max_weight:g} at response tokens (max "
                f"{float(values.max()):.4g}): a weight multiplies its token's loss; stapo.custom_rule.max_weight "
                "raises the bound"), "weight"
    return None, "weight"


@dataclass(frozen=True)
class Rows:
    """Where each token of a flat layout sits in the padded ``(rows, longest)`` one."""

    row: torch.Tensor
    position: torch.Tensor
    rows: int
    longest: int

    @classmethod
    def from_offsets(cls, offsets: torch.Tensor, device) -> Rows:
        offsets = offsets.to(device=device, dtype=torch.long)
        lengths = offsets.diff()
        rows = int(lengths.numel())
        row = torch.repeat_interleave(torch.arange(rows, device=device), lengths)
        position = torch.arange(int(offsets[-1] - offsets[0]), device=device) - (offsets[row] - offsets[0])
        return cls(row, position, rows, int(lengths.max()) if rows else 0)

    def pad(self, flat: torch.Tensor, fill=0) -> torch.Tensor:
        padded = torch.full((self.rows, self.longest), fill, dtype=flat.dtype, device=flat.device)
        padded[self.row, self.position] = flat
        return padded

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        return padded[self.row, self.position]


@dataclass
class CustomRule:
    """A loaded rule: the function, its registry name, what it returns (``kind``), its fixed keywords."""

    fn: Callable
    name: str
    kind: str
    kwargs: dict = field(default_factory=dict)
    where: str = ""  # "file.py:LINE (FN)" for messages
    max_weight: float = math.inf  # a weight rule's bound (stapo.custom_rule.max_weight)

    def outputs(self, inputs: MaskInputs, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """The rule's output on ``inputs`` in their own layout (flat tokens are padded to rows through
        ``offsets`` for the call, and back), checked on every rank together: a refused output raises on every
        rank of ``inputs.group`` at the same point, never on one rank while the others wait in a collective."""
        mask = inputs.response_mask.bool()
        rows = None
        if mask.dim() == 1:
            if offsets is None:
                offsets = torch.tensor([0, mask.numel()])
            rows = Rows.from_offsets(offsets, mask.device)
        tensors = {
            "log_prob": inputs.log_prob,
            "old_log_prob": inputs.log_prob,
            "entropy": inputs.entropy,
            "advantages": inputs.advantages,
            "response_mask": mask,
        }
        # fresh tensors for the call: a rule writing into its inputs cannot change the batch or the counts
        tensors = {k: (rows.pad(v) if rows is not None else v.clone()) for k, v in tensors.items()}
        padded_mask = tensors["response_mask"]
        try:
            output = self.fn(**call_arguments(self.fn, tensors, scope_quantile(inputs.group), self.kwargs))
        except KeyboardInterrupt:  # the user stopping the run: not the rule's output
            raise
        except BaseException as error:  # an exit too; refused on every rank below, not raised on this one alone
            problem = describe_raise(error, self.fn)
        else:
            problem, kind = output_problem(output, padded_mask, padded_mask, self.max_weight)
            if problem is None and kind != self.kind:
                problem = f"returned a {kind} where its check found a {self.kind}: a rule must return one kind"
        refused = torch.tensor(float(problem is not None), device=mask.device)
        if all_reduce_sum(refused, inputs.group).item():
            raise RuleOutputError(f"{self.where}: {problem or 'refused on another rank'}")
        output = output.detach().to(mask.device)
        return rows.unpad(output) if rows is not None else output

    def build(self, inputs: MaskInputs, settings: MaskSettings, offsets: torch.Tensor | None = None) -> TokenMask:
        output = self.outputs(inputs, offsets)
        mask = inputs.response_mask
        if self.kind == "mask":
            drop = mask & ~output
            return TokenMask(drop, drop, {"num_kept": count(mask & output)})
        dtype = inputs.log_prob.dtype if inputs.log_prob is not None else torch.float32
        weight = torch.where(mask, output.to(dtype), torch.ones((), dtype=dtype, device=output.device))
        return weighted_mask(inputs, weight)

    def register(self) -> str:
        """Registered (again, replacing an earlier custom entry of the same name) as ``custom:NAME``."""
        if self.kind not in KINDS:
            raise ValueError(f"a rule's kind is one of {KINDS}, got {self.kind!r}")
        existing = TOKEN_MASK_REGISTRY.get(self.name)
        if existing is not None:
            if not is_custom(existing.name):
                raise ValueError(f"{self.name!r} is a built-in token mask")
            del TOKEN_MASK_REGISTRY[self.name]
        weighted = self.kind == "weight"

        def entry(inputs: MaskInputs, settings: MaskSettings) -> TokenMask:
            return self.build(inputs, settings, getattr(inputs, "offsets", None))

        entry.__doc__ = f"the rule {self.where}"
        register_token_mask(
            self.name,
            needs_log_prob=True,
            needs_entropy=True,
            sources=("old",),
            ratios=WEIGHT_RATIOS if weighted else MASK_RATIOS,
            weighted=weighted,
        )(entry)
        return self.name


def keep_or_weight_ratio(output: torch.Tensor, response_mask: torch.Tensor) -> tuple[str, float]:
    """``("keep ratio", kept / response tokens)`` of a mask, ``("mean weight", ...)`` of a weight."""
    tokens = count(response_mask)
    if output.dtype == torch.bool:
        return "keep ratio", count(response_mask & output) / tokens if tokens else math.nan
    total = float(output.detach().double()[response_mask].sum())
    return "mean weight", total / tokens if tokens else math.nan
