"""The driver's part of a STAPO step: the reward's extra metrics and, on the steps that write them,
the diagnostics that need the whole batch (and, with them, the mean entropy of a response token,
``ENTROPY_TOKEN_MEAN``). One TransferQueue ``kv_batch_get``, nothing put back.

The mask itself is folded inside the actor workers, on each DP rank's shard (``shard_mask``), so a
step without diagnostics fetches only the reward's ``extra_fields`` (for ``reward/<key>/mean``). On
the steps where the ablation grid, the token sample or the spurious-token log is due,
:meth:`DriverDiagnostics.round_trip` fetches the old-pass fields those need and, for the sample
and the log, builds the mask again from them with the same function as the workers
(``stapo.algorithm.masks``), which gives the same mask bit for bit (tests/integration/test_shard_mask.py).
The spurious-token log fetches the token ids of the few rows it names on its own. The trainer and
``benchmarks/tq_roundtrip.py`` (section 2c of BENCHMARKS.md) call this same code.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from torch.nn.utils.rnn import pad_sequence

from stapo.algorithm.gradnorm import exact_norm_shares
from stapo.algorithm.masks import MaskInputs, MaskSettings, MaskSpec, build_token_mask, build_token_mask_in_parts, count
from stapo.algorithm.token_sample import spread_positions
from stapo.rundir import ENTROPY_MAX, ENTROPY_TOKEN_MEAN, TAIL_MASS, TAIL_MASS_MAX, TAIL_SAMPLED
from stapo.spurious_log import append_jsonl, spurious_records, valid_lengths
from stapo.verl_plugin.cpu.sampling import TOKEN_STATS_FIELD
from stapo.verl_plugin.training.diagnostic_outputs import GridAndSample, SpuriousTokenLog
from stapo.verl_plugin.training.jagged import flat_fields
from stapo.verl_plugin.training.losses import METRIC_PREFIX
from stapo.verl_plugin.training.mini_batches import MiniBatchSplit, token_parts

REWARD_EXTRA_FIELD = "extra_fields"
# the old-pass fields every due diagnostic reads
DIAGNOSTIC_FIELDS = ("response_mask", "advantages", "entropy", "old_log_probs")


@dataclass(frozen=True)
class StepPlan:
    """Which diagnostics are due this step."""

    ablation: bool
    sample: bool
    log_tokens: bool

    @property
    def active(self) -> bool:
        return self.ablation or self.sample or self.log_tokens

    @property
    def needs_mask(self) -> bool:
        return self.sample or self.log_tokens


@dataclass
class RoundTripResult:
    """The metrics to log and the seconds per phase (``benchmarks/tq_roundtrip.py``)."""

    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


class _Clock:
    """Seconds per phase, read at phase ends (a few clock reads a step)."""

    def __init__(self, timings: dict[str, float]):
        self.timings, self._last = timings, time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self._last
        self._last = now


@dataclass
class DriverDiagnostics:
    """The driver-side diagnostics of one run: the mask's settings, its registry entry, the run-dir writers."""

    settings: MaskSettings
    spec: MaskSpec
    diagnostics: GridAndSample
    spurious_log: SpuriousTokenLog
    pad_token_id: int = 0
    tokenizer: Any = None
    # how verl splits the update (read with threshold_scope: mini_batch) and over how many DP ranks
    split: MiniBatchSplit | None = None
    dp_size: int = 1
    # (step, tokens silenced) of the last mask built here: the trainer compares it with the workers' fold
    last_dropped: tuple[int, float] | None = None

    @property
    def silences(self) -> bool:
        """Whether the folded rule silences tokens the log and the tail metrics describe: S2T's, or a custom rule's
        that drops tokens (stapo.algorithm.custom_rule)."""
        custom_mask = self.spec.name.startswith("custom:") and not self.spec.weighted
        return (self.spec.name == "stapo" or custom_mask) and self.settings.folded

    @property
    def downweights(self) -> bool:
        """Whether the folded rule is a custom weight: its tokens below weight 1 are logged as S2T's silenced ones
        are (``spurious_log.DOWNWEIGHTED_NAME``), or a user would not see what the rule did."""
        return self.spec.name.startswith("custom:") and self.spec.weighted and self.settings.folded

    def plan(self, step: int) -> StepPlan:
        ablation = self.diagnostics.ablation_wanted(step)
        sample = self.diagnostics.sample_wanted(step)
        log_tokens = self.spurious_log.wants(step) and (self.silences or self.downweights)
        return StepPlan(ablation, sample, log_tokens)

    def round_trip(self, step: int, keys: list[str], partition_id: str, reward_extra: bool = True) -> RoundTripResult:
        """One ``kv_batch_get`` (the due diagnostics' fields and, if asked, ``extra_fields``), no put."""
        plan = self.plan(step)
        # ``responses`` is not fetched here: the spurious log reads the token ids of at most
        # ``max_tokens`` rows, fetched on their own (``_log_tokens``), not 8 bytes of every token
        fields = (list(DIAGNOSTIC_FIELDS) if plan.active else []) + ([REWARD_EXTRA_FIELD] if reward_extra else [])
        result = RoundTripResult()
        if not fields:
            return result
        clock = _Clock(result.timings)
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
        clock.lap("get")
        token_stats = None
        if reward_extra:
            extra = [getattr(item, "data", item) for item in data.pop(REWARD_EXTRA_FIELD)]
            result.metrics.update(reward_extra_means(extra))
            token_stats = [item.get(TOKEN_STATS_FIELD) if isinstance(item, dict) else None for item in extra]
        if not plan.active:
            return result

        def fetch_responses(rows: list[int]) -> list[torch.Tensor]:
            rows_data = tq.kv_batch_get(
                keys=[keys[r] for r in rows], partition_id=partition_id, select_fields=["responses"]
            )
            return list(rows_data["responses"].unbind())

        self.diagnose(step, plan, data, result, clock, fetch_responses, token_stats)
        return result

    def diagnose(
        self,
        step: int,
        plan: StepPlan,
        data: TensorDict,
        result: RoundTripResult,
        clock: _Clock,
        fetch_responses: Callable[[list[int]], list[torch.Tensor]] | None = None,
        token_stats: list[dict | None] | None = None,
    ) -> None:
        """The due diagnostics from the fetched fields: grid metrics into ``result``, sample and log to the run dir.

        Works on the jagged fields' flat values (``jagged.flat_fields``), row-major, so the token sample
        and the spurious log pick the same tokens as from padded tensors. ``fetch_responses(rows)``
        returns those rows' token ids (the spurious log's; needed only when ``plan.log_tokens``). ``token_stats``
        are the CPU rollout's per-row token statistics (``stapo.verl_plugin.cpu.sampling.token_stats``), when
        every row has them: they add the tail metrics (:func:`tail_metrics`).
        """
        offsets, flat = flat_fields(data, DIAGNOSTIC_FIELDS)
        response_mask = flat["response_mask"].bool()
        log_prob, entropy = flat["old_log_probs"].float(), flat["entropy"].float()
        advantages = flat["advantages"].float()
        if response_mask.any():
            result.metrics[ENTROPY_TOKEN_MEAN] = float(entropy[response_mask].double().mean())
            result.metrics[ENTROPY_MAX] = float(entropy[response_mask].nan_to_num(nan=-math.inf).max())
        stats = flat_token_stats(token_stats, offsets)
        clock.lap("flatten")
        silenced, weight = torch.zeros_like(response_mask), None
        if (plan.needs_mask or stats is not None) and self.settings.folded:
            # the mask the workers folded this step: same function, same inputs, same scopes, same result
            inputs = MaskInputs(response_mask, advantages, log_prob, entropy, offsets=offsets)
            if self.settings.threshold_scope == "mini_batch":
                row_index, parts = self.split.batch_index(len(offsets) - 1, self.dp_size)
                built = build_token_mask_in_parts(inputs, self.settings, token_parts(row_index, offsets), parts)
            else:
                built = build_token_mask(inputs, self.settings)
            silenced, weight = built.drop_response, built.weight
            self.last_dropped = (step, count(response_mask & silenced))
            clock.lap("mask")
        if stats is not None:
            would_be = silenced if self.silences else None
            result.metrics.update(tail_metrics(stats, response_mask, advantages, log_prob, entropy, self.settings,
                                               would_be))
            clock.lap("tail")
        if plan.log_tokens and self.downweights and weight is not None:
            self._log_tokens(step, response_mask & (weight < 1), offsets, flat, log_prob, entropy, fetch_responses,
                             weight)
            clock.lap("log")
        elif plan.log_tokens:
            self._log_tokens(step, silenced, offsets, flat, log_prob, entropy, fetch_responses)
            clock.lap("log")
        if plan.ablation:
            result.metrics.update(self.diagnostics.ablation_metrics(log_prob, entropy, advantages, response_mask))
            clock.lap("ablation")
        if plan.sample:
            self.diagnostics.write_sample(step, log_prob, entropy, advantages, response_mask, silenced)
            clock.lap("sample")

    def _log_tokens(self, step, spurious, offsets, flat, log_prob, entropy, fetch_responses, weight=None) -> None:
        """``SpuriousTokenLog``'s records from the flat mask: the rows holding a kept token (at most
        ``max_tokens``) are fetched and padded, and each record names its row of the batch. With ``weight`` (a
        custom weight rule's, flat) the records carry their token's weight and go to the down-weighted file."""
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
            if weight is not None:
                record["weight"] = float(weight[int(offsets[record["sample"]]) + record["position"]])
        append_jsonl(log.path if weight is None else log.downweighted_path, records)


def reward_extra_means(extra_fields: list) -> dict[str, float]:
    """Mean of every numeric ``reward_extra_info`` value over the batch, as ``reward/<key>/mean``."""
    values: dict[str, list[float]] = defaultdict(list)
    for item in extra_fields:
        item = getattr(item, "data", item)  # a TensorDict non-tensor entry wraps the dict
        info = item.get("reward_extra_info", {}) if isinstance(item, dict) else {}
        for key, value in info.items():
            if isinstance(value, bool | int | float) and math.isfinite(float(value)):
                values[key].append(float(value))
    return {f"reward/{key}/mean": sum(found) / len(found) for key, found in values.items()}


def flat_token_stats(rows: list[dict | None] | None, offsets: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The rollout's per-token statistics as flat tensors over the batch's response tokens (row-major, as
    ``flat_fields``), or None unless every row has them with its response's length (vLLM sends none)."""
    if not rows or any(row is None for row in rows):
        return None
    lengths = offsets.diff().tolist()
    if [len(row["collision"]) for row in rows] != lengths:
        return None
    flat = {"collision": torch.tensor([v for row in rows for v in row["collision"]], dtype=torch.float64)}
    if all("unused_mass" in row for row in rows):
        flat["unused_mass"] = torch.tensor([v for row in rows for v in row["unused_mass"]], dtype=torch.float64)
        flat["unused_sampled"] = torch.tensor(float(sum(row["unused_sampled"] for row in rows)))
    return flat


def tail_metrics(stats, response_mask, advantages, log_prob, entropy, settings: MaskSettings,
                 silenced: torch.Tensor | None = None) -> dict[str, float]:
    """The tail metrics of a step: the silenced tokens' share of the exact logit-gradient norm and of its
    square, for S2T's silenced tokens (``silenced``, the folded mask) or, for another algorithm, the tokens
    S2T would silence at the run's tau_p and q over the step; and, when the model names unused ids, their
    mean and largest probability mass a position and the share of sampled tokens that are unused."""
    if silenced is None:
        would_be = MaskSettings(token_mask="stapo", tau_p=settings.tau_p, entropy_quantile=settings.entropy_quantile)
        silenced = build_token_mask(MaskInputs(response_mask, advantages, log_prob, entropy), would_be).drop_response
    shares = exact_norm_shares(log_prob.double().exp(), stats["collision"], advantages, silenced, response_mask)
    metrics = {METRIC_PREFIX + key: value for key, value in shares.items()}
    tokens = count(response_mask)
    if "unused_mass" in stats and tokens:
        mass = stats["unused_mass"][response_mask]
        metrics[TAIL_MASS] = float(mass.mean())
        metrics[TAIL_MASS_MAX] = float(mass.max())
        metrics[TAIL_SAMPLED] = float(stats["unused_sampled"]) / tokens
    return metrics
