"""Seconds per step of the real tiny CPU trainer: ``algo=stapo`` against ``algo=justrl``.

``python -m recipe.stapo.main_stapo model_preset=tiny algo=...`` (run through
``tests/e2e/cpu_runs.run_recipe``: Ray on loopback, verl's v1 trainer, FSDP2 over gloo, the HF rollout
server, the reward, the update). JustRL is the same recipe and trainer class with the S2T mask off,
so the ratio is STAPO's whole cost in a real step: mask building and folding on the driver and the
masked loss. Runs alternate stapo, justrl, justrl, stapo, ... (ABBA, so a drift in the machine's
load hits both alike); step 1 of every run is dropped (warm-up); the figure is verl's console
``timing_s/step``. With such a small model a step is dominated by Ray, rollout and process overheads:
the ratio says whether STAPO adds anything visible to a whole step, not what it costs on a GPU.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import fmt_num, md_row

STEP_KEY = "timing_s/step"
# phases worth comparing: the S2T mask is built and folded inside verl's advantage phase
PHASES = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor", STEP_KEY)


def run(repeats: int = 3, steps: int = 4, extra: list[str] | None = None) -> dict:
    try:
        from tests.e2e.cpu_runs import run_recipe
    except ImportError as exc:  # the recipe or its test helper is not there
        return {"bench": "e2e", "error": f"the CPU trainer is not available ({exc})"}
    if steps < 2:
        raise ValueError("steps must be >= 2: step 1 is dropped as warm-up")
    samples: dict[str, list[float]] = {"stapo": [], "justrl": []}
    per_run: dict[str, list[float]] = {"stapo": [], "justrl": []}
    phases: dict[str, dict[str, list[float]]] = {"stapo": {p: [] for p in PHASES}, "justrl": {p: [] for p in PHASES}}
    order = []
    for i in range(repeats):
        order += ["stapo", "justrl"] if i % 2 == 0 else ["justrl", "stapo"]
    for algo in order:
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
    stapo, justrl = statistics.median(samples["stapo"]), statistics.median(samples["justrl"])
    pair_ratios = [s / j for s, j in zip(per_run["stapo"], per_run["justrl"])]
    return {
        "bench": "e2e",
        "stapo_s": stapo,
        "justrl_s": justrl,
        "ratio": stapo / justrl,
        "pair_ratio": statistics.median(pair_ratios),
        "samples": samples,
        "runs": repeats,
        "steps": steps,
        "spread": {a: (max(v) - min(v)) / statistics.median(v) for a, v in samples.items()},
        "phases": {
            phase: {a: statistics.median(phases[a][phase]) if phases[a][phase] else float("nan") for a in phases}
            for phase in PHASES
        },
    }


# ---------------------------------------------------------------- its section of BENCHMARKS.md

NAME = "e2e"
TITLE = "4. End to end: seconds per step of the tiny CPU trainer"
SIZES = {"quick": dict(repeats=1, steps=2), "full": dict(repeats=2, steps=6)}


def measure(device, **size) -> list[dict]:
    return [run(**size)]  # the tiny preset runs on the CPU trainer, whatever the device


def render(rows: list[dict]) -> str:
    (result,) = rows
    if result.get("error"):
        first, _, rest = result["error"].partition("\n")
        body = f"Not measured in this run, no figures: {first}"
        return body + (f"\n\n```\n{rest.strip()}\n```" if rest.strip() else "")
    lines = ["| algo | median timing_s/step | samples (steps 2.., every run) | runs |", "|---|---|---|---|"]
    for algo in ("stapo", "justrl"):
        samples = ", ".join(fmt_num(x) for x in result["samples"][algo])
        lines.append(md_row(algo, fmt_num(result[algo + "_s"]), samples, result["runs"]))
    lines += [
        "",
        f"Ratio stapo / justrl (medians): **{result['ratio']:.3f}**; median of the per-run-pair ratios: "
        f"{result['pair_ratio']:.3f}; per-step spread stapo {fmt_num(result['spread']['stapo'])}, "
        f"justrl {fmt_num(result['spread']['justrl'])}.",
        "",
        "Medians of verl's phase timings (s; the S2T mask is built and folded in `adv`):",
        "",
        "| phase | stapo | justrl | ratio |",
        "|---|---|---|---|",
    ]
    for phase, values in result["phases"].items():
        ratio = values["stapo"] / values["justrl"] if values["justrl"] else math.nan
        lines.append(md_row(f"`{phase}`", fmt_num(values["stapo"], 3), fmt_num(values["justrl"], 3), fmt_num(ratio, 3)))
    return "\n".join(lines)
