"""Seconds per step of the real tiny CPU trainer: ``algo=stapo`` against ``algo=grpo`` and ``algo=justrl``.

``python -m recipe.stapo.main_stapo model_preset=tiny algo=...`` (run through
``tests/e2e/cpu_runs.run_recipe``: Ray on loopback, verl's v1 trainer, FSDP2 over gloo, the HF
rollout server, the reward, the update). Every run has the same seed, data and sampler (the recipe
pins them: paired rollouts), so the algorithms see the same prompts in the same order.

- ``grpo`` is the baseline the issue names: the paper's GRPO, which also computes reference
  log-probs for its KL loss (``timing_s/ref``) and clips at 0.2/0.2; STAPO has no reference pass.
- ``justrl`` is the same recipe, trainer class and loss with the S2T mask off: stapo / justrl is
  STAPO's own cost in a real step (the driver's round trip in ``adv``, the masked loss).

Runs rotate the algorithms (ABC, BCA, CAB, ...) so a drift in the machine's load hits all alike;
step 1 of every run is dropped (warm-up); the figure is verl's console ``timing_s/step``. With such
a small model a step is dominated by Ray, rollout and process overheads: the ratios say whether
STAPO adds anything visible to a whole step, not what it costs on a GPU.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import fmt_num, load_average, md_row

STEP_KEY = "timing_s/step"
# phases worth comparing: the S2T mask is built and folded by the actor workers at the start of
# `update_actor`; `adv` holds the driver's diagnostics (run for every algorithm)
PHASES = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor", STEP_KEY)
ALGOS = ("stapo", "grpo", "justrl")  # the first is measured against each of the others


def run(repeats: int = 3, steps: int = 4, extra: list[str] | None = None, algos: tuple[str, ...] = ALGOS) -> dict:
    try:
        from tests.e2e.cpu_runs import run_recipe
    except ImportError as exc:  # the recipe or its test helper is not there
        return {"bench": "e2e", "error": f"the CPU trainer is not available ({exc})"}
    if steps < 2:
        raise ValueError("steps must be >= 2: step 1 is dropped as warm-up")
    samples: dict[str, list[float]] = {a: [] for a in algos}
    per_run: dict[str, list[float]] = {a: [] for a in algos}
    phases: dict[str, dict[str, list[float]]] = {a: {p: [] for p in PHASES} for a in algos}
    order, load = [], []
    for i in range(repeats):
        shift = i % len(algos)
        order += [*algos[shift:], *algos[:shift]]
    for algo in order:
        load.append(load_average())
        with tempfile.TemporaryDirectory(prefix="stapo-bench-") as tmp:
            result = run_recipe(
                [f"algo={algo}", f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", *(extra or [])],
                Path(tmp) / "ckpt",
            )
        step_times = [result.steps[s][STEP_KEY] for s in range(2, steps + 1) if STEP_KEY in result.steps.get(s, {})]
        if result.returncode != 0 or len(step_times) != steps - 1:
            return {
                "bench": "e2e",
                "error": f"algo={algo} run failed (rc={result.returncode}, {len(step_times)} of {steps - 1} step "
                f"timings); log tail:\n{result.log[-2000:]}",
            }
        samples[algo] += step_times
        for phase in PHASES:
            phases[algo][phase] += [result.steps[s][phase] for s in range(2, steps + 1) if phase in result.steps[s]]
        per_run[algo].append(statistics.median(step_times))
    medians = {a: statistics.median(v) for a, v in samples.items()}
    head, *baselines = algos
    return {
        "bench": "e2e",
        "algos": list(algos),
        "median_s": medians,
        "ratio": {b: medians[head] / medians[b] for b in baselines},
        # per repeat, the head's run against the baseline's run of the same rotation (adjacent in time)
        "pair_ratio": {b: statistics.median(s / j for s, j in zip(per_run[head], per_run[b])) for b in baselines},
        "samples": samples,
        "runs": repeats,
        "steps": steps,
        "load": load,
        "spread": {a: (max(v) - min(v)) / statistics.median(v) for a, v in samples.items()},
        "phases": {
            phase: {a: statistics.median(phases[a][phase]) if phases[a][phase] else float("nan") for a in phases}
            for phase in PHASES
        },
    }


# ---------------------------------------------------------------- its section of BENCHMARKS.md

NAME = "e2e"
TITLE = "4. End to end: seconds per step of the tiny CPU trainer"
SIZES = {"quick": {"repeats": 1, "steps": 2}, "full": {"repeats": 3, "steps": 6}}


def measure(device, **size) -> list[dict]:
    return [run(**size)]  # the tiny preset runs on the CPU trainer, whatever the device


def render(rows: list[dict]) -> str:
    (result,) = rows
    if result.get("error"):
        first, _, rest = result["error"].partition("\n")
        body = f"Not measured in this run, no figures: {first}"
        return body + (f"\n\n```\n{rest.strip()}\n```" if rest.strip() else "")
    algos = result["algos"]
    head, *baselines = algos
    lines = ["| algo | median timing_s/step | samples (steps 2.., every run) | runs |", "|---|---|---|---|"]
    for algo in algos:
        samples = ", ".join(fmt_num(x) for x in result["samples"][algo])
        lines.append(md_row(algo, fmt_num(result["median_s"][algo]), samples, result["runs"]))
    lines.append("")
    for b in baselines:
        lines.append(
            f"Ratio {head} / {b} (medians): **{result['ratio'][b]:.3f}**; median of the per-rotation run ratios: "
            f"{result['pair_ratio'][b]:.3f}."
        )
    spreads = ", ".join(f"{a} {fmt_num(result['spread'][a])}" for a in algos)
    lines += [
        "",
        (
            f"Per-step spread ((max - min) / median): {spreads}. Load average (1/5/15 min) at the start of each "
            f"run: {'; '.join(result['load'])}."
        ),
        "",
        "Medians of verl's phase timings (s; the actor workers build and fold the mask in `update_actor`; `adv` "
        "holds the driver's diagnostics, written for every algorithm):",
        "",
        "| phase | " + " | ".join(algos) + " | " + " | ".join(f"{head} / {b}" for b in baselines) + " |",
        "|---|" + "---|" * (2 * len(algos) - 1),
    ]
    for phase, values in result["phases"].items():
        ratios = [values[head] / values[b] if values[b] else math.nan for b in baselines]
        lines.append(md_row(f"`{phase}`", *(fmt_num(values[a], 3) for a in algos), *(fmt_num(r, 3) for r in ratios)))
    return "\n".join(lines)
