"""Seconds per step of the real tiny CPU trainer: ``algo=stapo`` against ``algo=justrl``.

JustRL is the same recipe and the same trainer class with the S2T mask off, so the ratio is the
whole cost of STAPO in a real step (mask building on the driver, folding, the masked loss).
Runs are interleaved (stapo, justrl, stapo, ...); the first step of each run is dropped (warm-up).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from tests.e2e.cpu_runs import run_recipe


def run(repeats: int = 3, steps: int = 4) -> dict:
    per_algo: dict[str, list[float]] = {"stapo": [], "justrl": []}
    for _ in range(repeats):
        for algo in per_algo:
            with tempfile.TemporaryDirectory() as tmp:
                result = run_recipe(
                    [f"algo={algo}", f"trainer.total_training_steps={steps}", "trainer.save_freq=-1"],
                    Path(tmp) / "ckpt",
                )
            if result.returncode != 0:
                raise RuntimeError(f"{algo} run failed:\n{result.log[-3000:]}")
            per_algo[algo] += [result.steps[s]["timing_s/step"] for s in range(2, steps + 1)]
    stapo, justrl = statistics.median(per_algo["stapo"]), statistics.median(per_algo["justrl"])
    return {"stapo_s": stapo, "justrl_s": justrl, "ratio": stapo / justrl, "samples": per_algo}
