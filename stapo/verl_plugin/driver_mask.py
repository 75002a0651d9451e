"""The driver's part of a STAPO step, one TransferQueue round trip: fetch, build the mask, fold, put back.

After verl's advantages the trainer (``STAPOTrainer._compute_advantage``) needs the whole batch's
old-pass tensors once: :meth:`DriverMask.round_trip` fetches only the fields this step needs, in one
``kv_batch_get`` (the reward's ``extra_fields`` included, for ``reward/<key>/mean``), builds the
token mask (``stapo.masks``) on the jagged fields' flat values, folds it into ``response_mask`` and
``loss_mask`` and puts back only those two fields, then adds the ablation grid and the token sample
when they are due. The spurious-token log fetches the token ids of the few rows it names on its own.
The trainer and ``benchmarks/tq_roundtrip.py`` (section 2c of BENCHMARKS.md) call this same code.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from torch.nn.utils.rnn import pad_sequence

from stapo.masks import MaskInputs, MaskSettings, MaskSpec, build_token_mask, finalize_metrics
from stapo.spurious_log import append_jsonl, spread_positions, spurious_records, valid_lengths
from stapo.verl_plugin.losses import METRIC_PREFIX
from stapo.verl_plugin.run_log import SpuriousTokenLog, StepDiagnostics, reward_extra_means

REWARD_EXTRA_FIELD = "extra_fields"


def fold_masks(
    response_mask: torch.Tensor, loss_mask: torch.Tensor, drop_response: torch.Tensor, drop_loss: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero the dropped positions, keeping each mask's dtype (any layout, all four of one shape).

    ``masked_fill``, not a product with the inverted mask: one pass, no full-batch temporary."""
    return response_mask.masked_fill(drop_response, 0), loss_mask.masked_fill(drop_loss, 0)


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
        # ``responses`` is not fetched here: the spurious log reads the token ids of at most
        # ``max_tokens`` rows, fetched on their own (``_log_tokens``), not 8 bytes of every token
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

        def fetch_responses(rows: list[int]) -> list[torch.Tensor]:
            rows_data = tq.kv_batch_get(
                keys=[keys[r] for r in rows], partition_id=partition_id, select_fields=["responses"]
            )
            return list(rows_data["responses"].unbind())

        folded = self.compute(step, plan, data, result, clock, fetch_responses)
        if folded is not None:
            result.batch = tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=folded)
            clock.lap("put")
        return result

    def compute(
        self,
        step: int,
        plan: StepPlan,
        data: TensorDict,
        result: RoundTripResult,
        clock: _Clock,
        fetch_responses: Callable[[list[int]], list[torch.Tensor]] | None = None,
    ) -> TensorDict | None:
        """The mask, its metrics (into ``result``) and the folded masks (jagged, as fetched) from the fetched fields.

        Works on the jagged fields' flat values (views, no copy): every mask of the registry and every
        diagnostic is token-wise or over the whole batch, and a padded copy would triple the work on a
        long-CoT batch (mean length a third of the maximum). Row-major order is kept, so the token
        sample and the spurious log pick the same tokens as from padded tensors. ``fetch_responses(rows)``
        returns those rows' token ids (the spurious log's; needed only when ``plan.log_tokens``).
        """
        offsets, flat = flat_fields(data, plan.fields)
        response_mask = flat["response_mask"].bool()
        log_prob, entropy = flat.get("old_log_probs"), flat.get("entropy")
        log_prob = None if log_prob is None else log_prob.float()
        entropy = None if entropy is None else entropy.float()
        advantages = flat["advantages"].float()
        silenced, folded = None, None
        clock.lap("flatten")
        if plan.fold:
            built = build_token_mask(MaskInputs(response_mask, advantages, log_prob, entropy), self.settings)
            silenced = built.drop_response
            counts = {**built.counts, "empty_responses": float(empty_rows(response_mask, offsets))}
            step_metrics = finalize_metrics(self.spec, counts, built.stats)
            result.metrics.update({METRIC_PREFIX + key: value for key, value in step_metrics.items()})
            clock.lap("mask")
            if plan.log_tokens:
                self._log_tokens(step, built.drop_response, offsets, flat, log_prob, entropy, fetch_responses)
                clock.lap("log")
            folded_response, folded_loss = fold_masks(
                flat["response_mask"], flat["loss_mask"], built.drop_response, built.drop_count
            )
            folded = TensorDict(
                {"response_mask": jagged(folded_response, offsets), "loss_mask": jagged(folded_loss, offsets)},
                batch_size=data.batch_size,
            )
            result.expected_loss_tokens = float(torch.count_nonzero(folded_loss))
            clock.lap("fold")
        if plan.ablation:
            result.metrics.update(self.diagnostics.ablation_metrics(log_prob, entropy, advantages, response_mask))
            clock.lap("ablation")
        if plan.sample:
            silenced = torch.zeros_like(response_mask) if silenced is None else silenced
            self.diagnostics.write_sample(step, log_prob, entropy, advantages, response_mask, silenced)
            clock.lap("sample")
        return folded

    def _log_tokens(self, step, spurious, offsets, flat, log_prob, entropy, fetch_responses) -> None:
        """``SpuriousTokenLog``'s records from the flat mask: the rows holding a kept token (at most
        ``max_tokens``) are fetched and padded, and each record names its row of the batch."""
        log = self.spurious_log
        positions = spread_positions(spurious, log.max_tokens)
        if positions.numel() == 0:
            return
        rows = torch.searchsorted(offsets, positions, right=True) - 1
        picked = torch.unique(rows)  # sorted: row-major order is kept
        spans = [(int(offsets[r]), int(offsets[r + 1])) for r in picked]
        response_ids = fetch_responses(picked.tolist())
        if [len(ids) for ids in response_ids] != [b - a for a, b in spans]:
            raise RuntimeError("STAPO expects responses laid out as response_mask (same row lengths)")

        def pad(values: torch.Tensor, value: float = 0) -> torch.Tensor:
            return pad_sequence([values[a:b] for a, b in spans], batch_first=True, padding_value=value)

        response_mask = pad(flat["response_mask"])
        keep = torch.zeros_like(response_mask, dtype=torch.bool)
        keep[torch.searchsorted(picked, rows), positions - offsets[rows]] = True
        records = spurious_records(
            pad_sequence(response_ids, batch_first=True, padding_value=self.pad_token_id),
            keep,
            pad(log_prob),
            pad(entropy),
            lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
            context=log.context,
            step=step,
            lengths=valid_lengths(response_mask),
        )
        for record in records:
            record["sample"] = int(picked[record["sample"]])
        append_jsonl(log.path, records)


def flat_fields(data: TensorDict, names) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The response offsets (from 0) and each jagged field's flat values over exactly those rows."""
    reference = data["response_mask"]
    lengths = reference.offsets().diff()
    flat = {}
    for name in names:
        nested = data[name]
        if nested.lengths() is not None or not torch.equal(nested.offsets().diff(), lengths):
            raise RuntimeError(
                f"STAPO expects the response-only field {name!r} laid out as response_mask (same row lengths, "
                "no holes, as verl 0.9.1's v1 agent loop and trainer store them); this verl version lays it "
                "out differently"
            )
        start, end = int(nested.offsets()[0]), int(nested.offsets()[-1])
        flat[name] = nested.values()[start:end]
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    return offsets, flat


def jagged(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """A jagged tensor over ``values`` (no copy), with the row-length bounds ``as_nested_tensor`` caches
    (without them ``to_padded_tensor`` pads every row to the length of ``values``)."""
    lengths = offsets.diff()
    bounds = {"min_seqlen": int(lengths.min()), "max_seqlen": int(lengths.max())} if lengths.numel() else {}
    return torch.nested.nested_tensor_from_jagged(values, offsets, **bounds)


def empty_rows(response_mask: torch.Tensor, offsets: torch.Tensor) -> int:
    """Rows without a response token (verl's padding samples, instant EOS), from the flat mask."""
    bounds = offsets.tolist()
    return sum(1 for a, b in itertools.pairwise(bounds) if not bool(response_mask[a:b].any()))
