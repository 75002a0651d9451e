"""Where a STAPO step's mask costs land at paper size: the actor workers' fold and the driver's round trip.

The mask is folded inside the actor workers (``stapo/verl_plugin/training/shard_mask.py``, ``fold_shard``), on
the shard each DP rank already holds for its update (verl's dispatch fetches it from TransferQueue
whatever the algorithm), so the mask adds no TransferQueue traffic: its cost per step is
``fold_shard`` on one rank's shard, in parallel on every rank, plus two small collectives (the
candidates' entropies and one vector of counts). The driver (``DriverDiagnostics.round_trip``) fetches the
reward's ``extra_fields`` every step and the old-pass fields only on the steps that write the
ablation grid, the token sample or the spurious-token log.

This benchmark times, against TransferQueue 0.1.x as verl 0.9.1 starts it (``tq.init`` on a local
Ray, SimpleStorage, one storage unit as the CPU presets use): the driver's round trip on a step
without diagnostics and on a step with every diagnostic (the recipe's defaults), and ``fold_shard``
on the shard of one rank for 1, 8 and 64 DP ranks (one process: the collectives are not timed; on
GPUs they move about 1e-4 of the tokens). The driver's peak RSS above its level before the
diagnostics call is reported.

The batch is stored the way verl's v1 trainer leaves it after advantages: the agent loop puts each
prompt group's jagged int64 ``responses``/``response_mask``/``loss_mask`` and its ``extra_fields``
(reward info), the old-log-prob pass puts float32 ``old_log_probs``/``entropy``, the advantage step
puts ``advantages``/``returns``. Values and lengths come from ``benchmarks.mask_build.paper_batch``.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import fmt_bytes, fmt_num, md_row, rss_kib, rss_peak_reset
from benchmarks.mask_build import TAU_P, Q, paper_batch

GROUP = 8  # responses per prompt (the paper's rollout.n): the agent loop's puts come per prompt group
PARTITION = "train"
PHASES = ("get", "flatten", "mask", "log", "ablation", "sample")
DP_SIZES = (1, 8, 64)
SHARD_FIELDS = ("response_mask", "loss_mask", "advantages", "old_log_probs", "entropy")


class _IdsTokenizer:
    """Stands in for the tokenizer the spurious-token log decodes with (no model files here)."""

    pad_token_id = 0

    @staticmethod
    def decode(ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids)


@contextlib.contextmanager
def transfer_queue():
    """A local Ray and TransferQueue started as verl's TaskRunner does (``tq.init(config.transfer_queue)``)."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    logging.getLogger("transfer_queue").setLevel(logging.ERROR)  # a thread-count warning per put on 2 cores
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths are limited
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_tmp)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq
    finally:
        with contextlib.suppress(Exception):
            tq.close()
        ray.shutdown()


def _nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def store_batch(tq, responses: int, max_len: int, distribution: str, seed: int = 0) -> tuple[list[str], dict]:
    """Put a paper-like batch into TransferQueue field group by field group, as verl's v1 step does."""
    from tensordict import NonTensorStack, TensorDict

    log_prob, entropy, advantages, _, lengths = paper_batch(responses, max_len, distribution, seed)
    g = torch.Generator().manual_seed(seed + 1)
    lens = lengths.tolist()
    keys = [f"uid{i // GROUP}_{i % GROUP}_0" for i in range(responses)]
    ids = [torch.randint(1, 50_000, (n,), generator=g) for n in lens]
    masks = [torch.ones(n, dtype=torch.int64) for n in lens]
    for start in range(0, responses, GROUP):  # the agent loop: one put per prompt group
        rows = range(start, min(start + GROUP, responses))
        fields = TensorDict(
            {
                "responses": _nested([ids[i] for i in rows]),
                "response_mask": _nested([masks[i] for i in rows]),
                "loss_mask": _nested([masks[i].clone() for i in rows]),
                "extra_fields": NonTensorStack(*({"reward_extra_info": {"acc": float(i % 3 == 0)}} for i in rows)),
            },
            batch_size=len(rows),
        )
        tq.kv_batch_put(keys=[keys[i] for i in rows], partition_id=PARTITION, fields=fields)
    for names, tensors in (
        (("old_log_probs", "entropy"), (log_prob, entropy)),
        (("advantages", "returns"), (advantages, advantages)),
    ):
        fields = {name: _nested([t[i, :n] for i, n in enumerate(lens)]) for name, t in zip(names, tensors)}
        tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=TensorDict(fields, batch_size=responses))
    return keys, {"tokens": int(lengths.sum()), "mean_len": float(lengths.float().mean())}


def driver_diagnostics(run_dir: Path):
    """The trainer's ``DriverDiagnostics`` with the recipe's default diagnostics, writing into ``run_dir``."""
    from stapo.algorithm.masks import MaskSettings, get_token_mask
    from stapo.verl_plugin.training.diagnostic_outputs import GridAndSample, SpuriousTokenLog
    from stapo.verl_plugin.training.driver_diagnostics import DriverDiagnostics

    stapo_config = {
        "run_dir": str(run_dir),
        "spurious_log": {"every": 1, "max_tokens": 200, "context": 6},
        "ablation": {"every": 1, "tau_p": [5e-4, 1e-3, 2e-3, 5e-3, 1e-2], "q": [0.5, 0.75, 0.9, 1.0]},
        "token_sample": {"every": 1, "size": 2000},
    }
    settings = MaskSettings(token_mask="stapo", tau_p=TAU_P, entropy_quantile=Q)
    tokenizer = _IdsTokenizer()
    return DriverDiagnostics(
        settings,
        get_token_mask("stapo"),
        GridAndSample.from_config(stapo_config),
        SpuriousTokenLog.from_config(stapo_config),
        pad_token_id=tokenizer.pad_token_id,
        tokenizer=tokenizer,
    )


def quiet(driver):
    """The same ``DriverDiagnostics`` on a step where no diagnostic is due."""
    import dataclasses

    return dataclasses.replace(
        driver,
        diagnostics=dataclasses.replace(driver.diagnostics, ablation_every=0, sample_every=10**9),
        spurious_log=dataclasses.replace(driver.spurious_log, every=10**9),
    )


def _time_fold(tq, keys: list[str], settings, repeats: int) -> tuple[dict[int, float], int]:
    """Median seconds of ``fold_shard`` on the first rank's shard for each DP size, and the loss tokens
    it left at DP 1 (a check against the driver's mask count)."""
    from tensordict import TensorDict

    from stapo.verl_plugin.training.shard_mask import FOLDED_LOSS_TOKENS, fold_shard

    medians, loss_tokens = {}, 0
    for dp in DP_SIZES:
        rows = keys[: -(-len(keys) // dp)]
        shard = tq.kv_batch_get(keys=rows, partition_id=PARTITION, select_fields=list(SHARD_FIELDS))
        times = []
        for round_index in range(repeats + 1):  # round 0 warms up
            data = TensorDict({name: shard[name] for name in SHARD_FIELDS}, batch_size=len(rows))
            t0 = time.perf_counter()
            metrics = fold_shard(data, settings)
            if round_index:
                times.append(time.perf_counter() - t0)
        medians[dp] = statistics.median(times)
        loss_tokens = loss_tokens or int(metrics[FOLDED_LOSS_TOKENS])
        del shard, data
    return medians, loss_tokens


def run(responses: int, max_len: int, distributions=("realistic", "all_max"), repeats: int = 3) -> list[dict]:
    rows = []
    with transfer_queue() as tq, tempfile.TemporaryDirectory(prefix="stapo-tq-") as tmp:
        for distribution in distributions:
            started = time.perf_counter()
            keys, stored = store_batch(tq, responses, max_len, distribution)
            store_s = time.perf_counter() - started
            driver = driver_diagnostics(Path(tmp) / distribution)
            quiet_driver = quiet(driver)
            totals, quiet_totals, phases, peaks, result = [], [], {p: [] for p in PHASES}, [], None
            for round_index in range(repeats + 1):  # round 0 warms up
                t0 = time.perf_counter()
                quiet_driver.round_trip(2, keys, PARTITION)
                quiet_s = time.perf_counter() - t0
                rss_peak_reset()
                rss_before, _ = rss_kib()
                t0 = time.perf_counter()
                result = driver.round_trip(1, keys, PARTITION)
                total = time.perf_counter() - t0
                _, hwm = rss_kib()
                if round_index:
                    quiet_totals.append(quiet_s)
                    totals.append(total)
                    peaks.append(1024 * (hwm - rss_before))
                    for phase in PHASES:
                        phases[phase].append(result.timings.get(phase, 0.0))
            fold_s, loss_tokens = _time_fold(tq, keys, driver.settings, repeats)
            m = result.metrics
            rows.append(
                {
                    "bench": "tq",
                    "distribution": distribution,
                    "responses": responses,
                    "max_len": max_len,
                    "tokens": stored["tokens"],
                    "mean_len": stored["mean_len"],
                    "masked": stored["tokens"] - loss_tokens,
                    "loss_tokens": loss_tokens,
                    "acc_mean": m.get("reward/acc/mean"),
                    "store_s": store_s,
                    "quiet_s": statistics.median(quiet_totals),
                    "total_s": statistics.median(totals),
                    "total_spread": (max(totals) - min(totals)) / statistics.median(totals),
                    "rss_peak_delta_bytes": max(peaks),
                    **{f"{p}_s": statistics.median(v) for p, v in phases.items()},
                    **{f"fold_dp{dp}_s": value for dp, value in fold_s.items()},
                }
            )
            tq.kv_clear(keys=keys, partition_id=PARTITION)
            del stored
    return rows


# ---------------------------------------------------------------- its section of BENCHMARKS.md

NAME = "tq"
TITLE = "2c. The mask's cost per step: the workers' fold, the driver's round trip"
SIZES = {
    "quick": {"responses": 64, "max_len": 1024, "repeats": 1},
    "full": {"responses": 2048, "max_len": 15360, "repeats": 3},
}


def measure(device, **size) -> list[dict]:
    return run(**size)  # the driver and the fold's timing here are CPU processes, whatever the device


def render(rows: list[dict]) -> str:
    dp_columns = [f"fold, {dp} DP" for dp in DP_SIZES]
    lines = [
        (
            "Worker: `fold_shard` (mask, metrics, fold into `response_mask`/`loss_mask`) on one rank's shard "
            "(1/DP of the responses) in seconds, in one process (the collectives, about 1e-4 of the tokens, not "
            "timed); every rank does its own in parallel, before its update. Driver: "
            "`DriverDiagnostics.round_trip` on a quiet step (the reward's `extra_fields` only) and on a step with"
            " every diagnostic (ablation grid, 2,000-token sample, 200-token spurious log), whose phases (s) are:"
            " `get` one `kv_batch_get`; `flatten` the jagged fields' flat values; `mask` the mask again for the "
            "sample and the log; `log` the spurious-token log; `ablation` the grid; `sample` the token sample. "
            "Nothing is put back. RSS peak delta: the driver's VmHWM above its RSS before the diagnostics call."
        ),
        "",
        "| lengths | responses x max | response tokens (mean) | masked | "
        + " | ".join(dp_columns)
        + " | driver, quiet step | "
        + " | ".join(PHASES)
        + " | driver, diagnostics step (spread) | RSS peak delta | store s (setup) |",
        "|---|---|---|---|" + "---|" * len(dp_columns) + "---|" + "---|" * len(PHASES) + "---|---|---|",
    ]
    for r in rows:
        lines.append(
            md_row(
                r["distribution"],
                f"{r['responses']} x {r['max_len']}",
                f"{r['tokens']:,} ({r['mean_len']:.0f})",
                f"{r['masked']:,}",
                *(fmt_num(r[f"fold_dp{dp}_s"]) for dp in DP_SIZES),
                f"**{fmt_num(r['quiet_s'])}**",
                *(fmt_num(r[f"{p}_s"]) for p in PHASES),
                f"{fmt_num(r['total_s'])} ({fmt_num(r['total_spread'])})",
                fmt_bytes(r["rss_peak_delta_bytes"]),
                fmt_num(r["store_s"], 1),
            )
        )
    return "\n".join(lines)
