"""``python -m benchmarks.testbed_timings LOG [LOG...] [--json OUT] [--metrics OUT]``: a trainer run's per-step
timings from its console log, and their summary (medians of steps 2 on, each validation, the wall time outside the
steps); ``--metrics`` also keeps every other logged value, as printed, to show that two runs trained alike.

The run is the testbed preset (``make demo``'s model and task) started as in the testbed step profile
(docs/benchmarks-history.md), its console output in LOG with the wall time appended by the shell as ``run rc 0 wall
<seconds>``. The JSON keeps every step's ``timing_s/*`` and held-out accuracy, so the tables there can be recomputed
from it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

PHASES = ("gen", "old_log_prob", "update_actor", "adv", "update_weights", "step")
# logged keys that measure the machine (time, throughput, memory), not what the run computed
MACHINE_KEYS = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
STEP_LINE = re.compile(r"step:(\d+) - (.*)")  # verl's console logger: one line a step, ``key:value`` pairs


def parse(log: str) -> dict:
    steps = {}
    for match in STEP_LINE.finditer(log):
        timings = {k: float(v) for k, v in re.findall(r"timing_s/([a-z_]+):([0-9.]+)", match.group(2))}
        acc = re.search(r"val-core/[^ ]*/acc/mean@\d+:(?:np\.float64\()?([0-9.]+)", match.group(2))
        steps[int(match.group(1))] = {"timing_s": timings, "held_out_acc": float(acc.group(1)) if acc else None}
    wall = re.search(r"run rc (\d+) wall ([0-9.]+)", log)
    if wall is None:
        return {"steps": steps, "rc": None, "wall_s": None}
    return {"steps": steps, "rc": int(wall.group(1)), "wall_s": float(wall.group(2))}


def logged_values(log: str) -> dict[str, dict[str, str]]:
    """Every step's logged values but ``MACHINE_KEYS``, as printed (``step:N - key:value - ...``): two runs that
    sampled and trained alike print the same strings."""
    steps = {}
    for match in STEP_LINE.finditer(log):
        pairs = (item.partition(":") for item in match.group(2).split(" - "))
        steps[match.group(1)] = {k: v for k, _, v in pairs if not k.startswith(MACHINE_KEYS)}
    return steps


def summary(run: dict) -> dict:
    steps = run["steps"]
    later = [s for s in steps if int(s) >= 2]
    medians = {p: statistics.median(steps[s]["timing_s"][p] for s in later) for p in PHASES}
    # in step order whatever the file's key order (a JSON written with sort_keys puts "10" before "5")
    testing = {int(s): v["timing_s"]["testing"] for s, v in sorted(steps.items(), key=lambda item: int(item[0]))
               if "testing" in v["timing_s"]}
    # step 0 (a validation before training) logs no step time
    in_steps = sum(v["timing_s"].get("step", 0.0) + v["timing_s"].get("testing", 0.0) for v in steps.values())
    return {"median_s": medians, "testing_s": testing, "wall_s": run["wall_s"],
            "outside_steps_s": None if run["wall_s"] is None else run["wall_s"] - in_steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--json", type=Path, help="write {log name: parsed run} here")
    parser.add_argument("--metrics", type=Path, help="write {'runs': {log name: {step: {key: value}}}} here")
    args = parser.parse_args()
    texts = {log.parent.name: log.read_text(errors="replace") for log in args.logs}
    runs = {name: parse(text) for name, text in texts.items()}
    for name, run in runs.items():
        print(name, json.dumps(summary(run)))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1, sort_keys=True))
    if args.metrics:
        logged = {name: logged_values(text) for name, text in texts.items()}
        source = "the runs' console lines `step:N - key:value ...`, every key but " + ", ".join(MACHINE_KEYS)
        args.metrics.write_text(json.dumps({"runs": logged, "source": source}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
