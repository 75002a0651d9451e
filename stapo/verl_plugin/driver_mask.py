"""The driver's part of a STAPO step, one TransferQueue round trip: fetch, build the mask, fold, put back.

After verl's advantages the trainer (``STAPOTrainer._compute_advantage``) needs the whole batch's
old-pass tensors once: :meth:`DriverMask.round_trip` fetches only the fields this step needs, in one
``kv_batch_get`` (the reward's ``extra_fields`` included, for ``reward/<key>/mean``), builds the
token mask (``stapo.masks``), folds it into ``response_mask`` and ``loss_mask`` and puts back only
those two fields, then adds the ablation grid and the token sample when they are due. The trainer
and ``benchmarks/tq_roundtrip.py`` call this same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.workers.utils.padding import response_to_nested

from stapo.masks import MaskInputs, MaskSettings, MaskSpec, build_token_mask, finalize_metrics
from stapo.verl_plugin.losses import METRIC_PREFIX
from stapo.verl_plugin.run_log import SpuriousTokenLog, StepDiagnostics, reward_extra_means

REWARD_EXTRA_FIELD = "extra_fields"


def fold_masks(
    response_mask: torch.Tensor, loss_mask: torch.Tensor, drop_response: torch.Tensor, drop_loss: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero the dropped positions, keeping each mask's dtype (any layout, all four of one shape)."""
    return (
        response_mask * (~drop_response).to(response_mask.dtype),
        loss_mask * (~drop_loss).to(loss_mask.dtype),
    )


@dataclass(frozen=True)
class StepPlan:
    """What one step's round trip does: which fields it fetches and which outputs are due."""

    fold: bool
    ablation: bool
    sample: bool
    log_tokens: bool
    fields: tuple[str, ...]

    @property
    def active(self) -> bool:
        return self.fold or self.ablation or self.sample


@dataclass
class RoundTripResult:
    """The metrics to log, the folded masks' token count (None without folding), the batch meta after the put."""

    metrics: dict[str, float] = field(default_factory=dict)
    expected_loss_tokens: float | None = None
    batch: Any = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase (benchmarks/tq_roundtrip.py)


class _Clock:
    """Seconds per phase, read at phase ends (a few clock reads a step)."""

    def __init__(self, timings: dict[str, float]):
        self.timings, self._last = timings, time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self._last
        self._last = now


@dataclass
class DriverMask:
    """The driver-side mask of one run: its settings, its registry entry and the run-dir writers."""

    settings: MaskSettings
    spec: MaskSpec
    diagnostics: StepDiagnostics
    spurious_log: SpuriousTokenLog
    pad_token_id: int = 0
    tokenizer: Any = None

    def plan(self, step: int) -> StepPlan:
        ablation = self.diagnostics.ablation_wanted(step)
        sample = self.diagnostics.sample_wanted(step)
        log_tokens = self.spurious_log.wants(step) and self.spec.name == "stapo" and self.settings.folded
        old_pass = ablation or sample or self.spec.needs_log_prob
        fields = ["response_mask", "loss_mask", "advantages"]
        fields += ["entropy"] if old_pass or self.spec.needs_entropy else []
        fields += ["old_log_probs"] if old_pass else []
        fields += ["responses"] if log_tokens else []
        return StepPlan(self.settings.folded, ablation, sample, log_tokens, tuple(fields))

    def round_trip(self, step: int, keys: list[str], partition_id: str, reward_extra: bool = True) -> RoundTripResult:
        """One ``kv_batch_get`` (mask fields and, if asked, ``extra_fields``), the mask, one ``kv_batch_put``."""
        plan = self.plan(step)
        fields = list(plan.fields) if plan.active else []
        fields += [REWARD_EXTRA_FIELD] if reward_extra else []
        result = RoundTripResult()
        if not fields:
            return result
        clock = _Clock(result.timings)
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
        clock.lap("get")
        if reward_extra:
            result.metrics.update(reward_extra_means(list(data.pop(REWARD_EXTRA_FIELD))))
        if not plan.active:
            return result
        folded = self.compute(step, plan, data, result, clock)
        if folded is not None:
            result.batch = tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=folded)
            clock.lap("put")
        return result

    def compute(
        self, step: int, plan: StepPlan, data: TensorDict, result: RoundTripResult, clock: _Clock
    ) -> TensorDict | None:
        """The mask, its metrics (into ``result``) and the folded masks (jagged, as fetched) from the fetched fields."""
        nested_response_mask = data["response_mask"]
        if not torch.equal(nested_response_mask.offsets(), data["loss_mask"].offsets()):
            raise RuntimeError(
                "STAPO expects response-only loss_mask and response_mask of equal lengths (verl 0.9.1 v1 "
                "agent loop); this verl version lays them out differently"
            )
        responses = data.pop("responses").to_padded_tensor(padding=self.pad_token_id) if plan.log_tokens else None
        padded = data.to_padded_tensor()
        response_mask = padded["response_mask"].bool()
        log_prob = padded["old_log_probs"].float() if "old_log_probs" in padded.keys() else None
        entropy = padded["entropy"].float() if "entropy" in padded.keys() else None
        advantages = padded["advantages"].float()
        silenced = torch.zeros_like(response_mask)
        folded = None
        clock.lap("pad")
        if plan.fold:
            built = build_token_mask(MaskInputs(response_mask, advantages, log_prob, entropy), self.settings)
            silenced = built.drop_response
            step_metrics = finalize_metrics(self.spec, built.counts, built.stats)
            result.metrics.update({METRIC_PREFIX + key: value for key, value in step_metrics.items()})
            clock.lap("mask")
            if plan.log_tokens:
                self.spurious_log.write(step, responses, built.drop_response, padded, self.tokenizer)
                clock.lap("log")
            folded_response, folded_loss = fold_masks(
                padded["response_mask"], padded["loss_mask"], built.drop_response, built.drop_count
            )
            folded = TensorDict(
                {
                    "response_mask": response_to_nested(folded_response, nested_response_mask),
                    "loss_mask": response_to_nested(folded_loss, nested_response_mask),
                },
                batch_size=data.batch_size,
            )
            result.expected_loss_tokens = float(torch.count_nonzero(folded_loss))
            clock.lap("fold")
        if plan.ablation:
            result.metrics.update(self.diagnostics.ablation_metrics(log_prob, entropy, advantages, response_mask))
            clock.lap("ablation")
        if plan.sample:
            self.diagnostics.write_sample(step, log_prob, entropy, advantages, response_mask, silenced)
            clock.lap("sample")
        return folded
