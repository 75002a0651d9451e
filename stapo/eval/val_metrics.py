"""Benchmark names for verl's validation metrics: ``val/<benchmark>/acc`` next to verl's own keys.

verl groups validation scores by each row's ``data_source`` and logs
``val-core/<data_source>/acc/mean@<n>`` (``acc`` is what ``stapo.reward.compute_score`` returns,
so its mean over the n validation samples of every prompt, averaged over prompts, is avg@n as a
fraction). ``stapo data prepare`` writes ``data_source = "stapo/<benchmark>"``; hub copies and
other pipelines use other spellings. :func:`benchmark_val_metrics` maps them all to the six names
of the paper's table and adds their unweighted mean, as the paper averages benchmarks:

    val/aime24/acc, ..., val/olympiadbench/acc, val/average/acc

Wiring (the recipe's v1 trainer subclass)::

    def _val_metrics_update(self, *args, **kwargs):
        metrics = super()._val_metrics_update(*args, **kwargs)
        metrics.update(benchmark_val_metrics(metrics))
        return metrics
"""

from __future__ import annotations

import re
from collections.abc import Mapping

BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")

# lower-cased data_source spellings seen in the wild -> benchmark (besides "stapo/<name>" and "<name>")
_ALIASES = {
    "huggingfaceh4/aime_2024": "aime24", "math-ai/aime24": "aime24", "aime_2024": "aime24", "aime2024": "aime24",
    "yentinglin/aime_2025": "aime25", "math-ai/aime25": "aime25", "aime_2025": "aime25", "aime2025": "aime25",
    "math-ai/amc23": "amc23", "amc2023": "amc23", "amc": "amc23",
    "huggingfaceh4/math-500": "math500", "math-500": "math500", "math_500": "math500",
    "math-ai/minervamath": "minerva", "minervamath": "minerva", "minerva_math": "minerva",
    "math-ai/olympiadbench": "olympiadbench", "olympiad_bench": "olympiadbench", "olympiad": "olympiadbench",
}
_CORE_ACC = re.compile(r"^val-core/(?P<source>.+)/acc/mean@(?P<n>\d+)$")


def benchmark_of(data_source: str) -> str:
    """The benchmark name for a data_source; unknown sources keep their own name ('/' -> '_')."""
    key = str(data_source).strip().lower()
    if key.startswith("stapo/"):
        key = key[len("stapo/") :]
    if key in BENCHMARKS:
        return key
    return _ALIASES.get(key, key.replace("/", "_"))


def benchmark_val_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """``val/<benchmark>/acc`` (fraction) for every ``val-core/<data_source>/acc/mean@n`` key,
    plus ``val/average/acc`` over the paper's benchmarks present (all sources if none is)."""
    best: dict[str, tuple[int, float]] = {}  # benchmark -> (n, value): keep the largest n
    for key, value in metrics.items():
        match = _CORE_ACC.match(key)
        if match is None:
            continue
        name, n = benchmark_of(match.group("source")), int(match.group("n"))
        if name not in best or n > best[name][0]:
            best[name] = (n, float(value))
    out = {f"val/{name}/acc": value for name, (_, value) in sorted(best.items())}
    paper = [value for name, (_, value) in best.items() if name in BENCHMARKS]
    pool = paper or [value for _, value in best.values()]
    if pool:
        out["val/average/acc"] = sum(pool) / len(pool)
    return out
