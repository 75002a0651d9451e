"""The driver's validation metrics: verl's bootstrap loop against the vectorised one, the same values.

verl's ``process_validation_metrics`` (which the trainer calls after every validation, on the driver) estimates
best@k / worst@k of every prompt's scores by resampling them 1,000 times per prompt, variable and k, one numpy
call per resampled row; ``stapo.verl_plugin.training.val_bootstrap`` replaces that loop with one reduction per
statistic where the values are bit for bit the same (``stapo/eval/bootstrap.py``). Both variants here run
verl's ``process_validation_metrics`` itself, interleaved, on a validation's per-sample lists as verl's trainer
passes them (``acc`` 0/1, ``score`` +1/-1 and ``reward``, as the project's boxed reward returns, no ``pred``):
the testbed's 64 problems x 8 samples, and two sizes a GPU run validates (MATH-500 x 4 samples, 30 AIME problems x
32). Each row also says whether the two returned the same values.
"""

from __future__ import annotations

import random

from benchmarks.common import fmt_num, interleaved, md_row

NAME = "valboot"
TITLE = "6. Validation metrics on the driver: verl's bootstrap loop against the vectorised one"
SIZES = {
    "quick": {"shapes": ((4, 4),), "repeats": 1},
    "full": {"shapes": ((64, 8), (500, 4), (30, 32)), "repeats": 3},
}


def validation_lists(prompts: int, samples: int, seed: int = 0):
    """``data_sources, sample_uids, infos`` for ``prompts`` x ``samples`` scored samples (about half right)."""
    rng = random.Random(seed)
    sources, uids, infos = [], [], {"acc": [], "score": [], "reward": []}
    for prompt in range(prompts):
        for _ in range(samples):
            right = rng.random() < 0.5
            sources.append("stapo/bench")
            uids.append(f"uid-{prompt}")
            infos["acc"].append(float(right))
            infos["score"].append(1.0 if right else -1.0)
            infos["reward"].append(1.0 if right else -1.0)
    return sources, uids, infos


def _plain(nested) -> dict:
    return {s: {v: dict(m) for v, m in by_var.items()} for s, by_var in nested.items()}


def measure(device, shapes, repeats) -> list[dict]:
    from verl.trainer.ppo import metric_utils

    from stapo.verl_plugin.training import val_bootstrap

    saved = metric_utils.bootstrap_metric
    verls = getattr(saved, "verl_bootstrap_metric", saved)
    metric_utils.bootstrap_metric = verls
    val_bootstrap.install()
    vectorised = metric_utils.bootstrap_metric
    rows = []
    try:
        for prompts, samples in shapes:
            lists = validation_lists(prompts, samples)
            results = {}

            def variant(name, bootstrap):
                def prepare():
                    def run():
                        metric_utils.bootstrap_metric = bootstrap
                        results[name] = _plain(metric_utils.process_validation_metrics(*lists))

                    return run

                return prepare

            timings = interleaved({"verl": variant("verl", verls), "vectorised": variant("vectorised", vectorised)},
                                  repeats, device, warmup=0)
            verl_s, fast_s = timings["verl"].median, timings["vectorised"].median
            rows.append({
                "bench": NAME, "prompts": prompts, "samples": samples, "verl_s": verl_s, "vectorised_s": fast_s,
                "ratio": fast_s / verl_s, "same_values": results["verl"] == results["vectorised"],
                "spread": max(timings["verl"].spread, timings["vectorised"].spread),
            })
    finally:
        metric_utils.bootstrap_metric = saved
    return rows


def render(rows: list[dict]) -> str:
    lines = [
        "| prompts x samples | verl's loop, s | vectorised, s | ratio | same values | worst spread |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(md_row(f"{r['prompts']} x {r['samples']}", fmt_num(r["verl_s"]), fmt_num(r["vectorised_s"]),
                            fmt_num(r["ratio"]), "yes" if r["same_values"] else "NO", fmt_num(r["spread"])))
    lines += ["", "Variables `acc`, `score`, `reward` per sample (no `pred`: no majority vote); medians of interleaved "
              "runs of verl's `process_validation_metrics` in one process."]
    return "\n".join(lines)
