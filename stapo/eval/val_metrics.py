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
from collections import defaultdict
from collections.abc import Mapping, Sequence

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


# The reward's 0/1 flags (stapo.reward.boxed): their mean over the samples is the figure; verl's bootstrap
# of best@k / worst@k for each (1,000 resamples per prompt, key and k, in numpy) says nothing about a flag and
# was half the driver's time in a testbed validation (docs/benchmarks-history.md, testbed step profile)
FLAG_KEYS = ("has_answer", "has_ground_truth", "checker_strict", "checker_math_verify", "checker_timeout")


def flag_means(data_sources: Sequence, sample_uids: Sequence, infos: Mapping[str, Sequence]) -> dict[str, float]:
    """``val-aux/<data_source>/<flag>/mean@<n>`` and ``std@<n>`` for each flag in ``infos``: the mean over prompts
    of each prompt's mean and (population) standard deviation, as verl's ``mean@n`` and ``std@n`` (``n``: the most
    samples a prompt has, as verl names it)."""
    out = {}
    for key in (k for k in FLAG_KEYS if k in infos):
        per_prompt: dict[tuple, list[float]] = defaultdict(list)
        for source, uid, value in zip(data_sources, sample_uids, infos[key]):
            if value is not None:
                per_prompt[(str(source), str(uid))].append(float(value))
        by_source: dict[str, list[list[float]]] = defaultdict(list)
        for (source, _), values in per_prompt.items():
            by_source[source].append(values)
        for source, prompts in by_source.items():
            n = max(len(values) for values in prompts)
            means = [sum(v) / len(v) for v in prompts]
            stds = [(sum((x - m) ** 2 for x in v) / len(v)) ** 0.5 for v, m in zip(prompts, means)]
            out[f"val-aux/{source}/{key}/mean@{n}"] = sum(means) / len(prompts)
            out[f"val-aux/{source}/{key}/std@{n}"] = sum(stds) / len(prompts)
    return out


def decoding_key(key: str, decoding: str) -> str:
    """A validation metric's name at a further decoding setting: its first segment tagged with the setting's
    name, the rest kept (``val-core/x/acc/mean@8`` -> ``val-core@T0.7/x/acc/mean@8``, ``val/average/acc`` ->
    ``val@T0.7/average/acc``), so every logger, plot and table that splits on '/' keeps working."""
    first, sep, rest = key.partition("/")
    return f"{first}@{decoding}{sep}{rest}"
