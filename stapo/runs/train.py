"""One training run of the demo (and of ``stapo sweep``): the real recipe as a child process.

The child's whole output goes to ``trainer.log`` in the run folder (flushed line by line, so a
killed run keeps it); the console shows one progress line per step, a heartbeat while a step is
running, and the held-out accuracy when validation reports it. Peak memory covers the child's
whole process tree (Ray workers included). The child runs in the run folder: the recipe is an
installed package, so no checkout is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import stapo
from stapo.runs.process import recipe_command, run_recipe_process
from stapo.runs.progress import Progress, format_duration, parse_step_line

HEARTBEAT_S = 60.0


def repo_root() -> Path:
    """The checkout this package runs from, for what only a checkout has (``launch/`` scripts).

    The recipe and its configs do not need it (they are installed); ``stapo sweep --launcher ray``
    submits through ``launch/ray/submit.sh``.
    """
    root = Path(stapo.__file__).resolve().parents[1]
    if not (root / "launch").is_dir():
        raise SystemExit(
            f"{root} is not a checkout of this project (no launch/ folder): the Ray launch scripts come "
            "with the source tree; install it with `pip install -e .` from a checkout"
        )
    return root


@dataclass
class TrainResult:
    returncode: int
    seconds: float
    peak_rss_bytes: int
    steps: dict[int, dict[str, float]]
    log_path: Path


def run_trainer(overrides: list[str], run_dir: Path, total_steps: int, label: str, echo: bool = False) -> TrainResult:
    """Run ``main_stapo`` with ``overrides``; stream progress; return when it exits."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "trainer.log"
    progress = Progress(total_steps, label)
    steps: dict[int, dict[str, float]] = {}
    last_output = [time.monotonic()]
    with log_path.open("a", encoding="utf-8") as log:
        log.write("$ " + " ".join(recipe_command(overrides)) + "\n")
        log.flush()

        def on_line(line: str, _proc) -> None:
            log.write(line)
            log.flush()
            if echo:
                print(line, end="", flush=True)
            parsed = parse_step_line(line)
            if parsed:
                steps[parsed[0]] = parsed[1]
                print(progress.line(*parsed), flush=True)
                last_output[0] = time.monotonic()

        def on_tick(elapsed: float) -> None:
            if time.monotonic() - last_output[0] >= HEARTBEAT_S:
                doing = f"step {max(steps) + 1}" if steps else "start-up and validation before training"
                print(f"[{label}] ... {doing} running, {format_duration(elapsed)} elapsed", flush=True)
                last_output[0] = time.monotonic()

        try:
            run = run_recipe_process(overrides, on_line=on_line, on_tick=on_tick, cwd=run_dir)
        except KeyboardInterrupt:
            print(f"\n[{label}] interrupted: the trainer was stopped (checkpoints so far are kept)", flush=True)
            raise
    return TrainResult(run.returncode, run.seconds, run.peak_rss_bytes, steps, log_path)
