"""Progress of a trainer run, read from verl's console logger (``step:N - key:value - ...`` lines).

Pure: feeds on output lines and returns what to print, so the same code serves the demo and the
tests, and a slow step never blocks the reader.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from stapo.rundir import ENTROPY_KEYS
from stapo.runs.summary import DECODING_ACC

_STEP_LINE = re.compile(r"step:(\d+) - (.*)")
_METRIC = re.compile(r"(\S+):(-?[0-9.]+(?:e[-+]?\d+)?|nan|inf)")


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, metrics) of one console-logger line, else None."""
    match = _STEP_LINE.search(line)
    if not match:
        return None
    return int(match.group(1)), {k: float(v) for k, v in _METRIC.findall(match.group(2))}


def parse_steps(log: str) -> dict[int, dict[str, float]]:
    """Every logged step of a whole log."""
    steps = {}
    for line in log.splitlines():
        parsed = parse_step_line(line)
        if parsed:
            steps[parsed[0]] = parsed[1]
    return steps


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _value(metrics: dict[str, float], key: str, fmt: str) -> str:
    return format(metrics[key], fmt) if key in metrics else "-"


@dataclass
class Progress:
    """Turns step lines into one-line summaries with time per step and an ETA."""

    total_steps: int
    label: str = "stapo"
    started: float = field(default_factory=time.monotonic)
    step_seconds: list[float] = field(default_factory=list)

    def line(self, step: int, metrics: dict[str, float]) -> str:
        if "timing_s/step" not in metrics and "val/average/acc" in metrics:  # validation before training
            return f"[{self.label}] held-out accuracy before training: {metrics['val/average/acc']:.3f}" + \
                further_decodings(metrics)
        if "timing_s/step" in metrics:
            self.step_seconds.append(metrics["timing_s/step"])
        per_step = sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else 0.0
        remaining = max(0, self.total_steps - step) * per_step
        # the mean entropy of a response token where logged (verl's actor/entropy follows loss_agg_mode)
        entropy_key = next((key for key in ENTROPY_KEYS if key in metrics), ENTROPY_KEYS[-1])
        parts = [
            f"[{self.label}] step {step}/{self.total_steps}",
            f"reward {_value(metrics, 'critic/score/mean', '+.3f')}",
            f"acc {_value(metrics, 'reward/acc/mean', '.3f')}",
            f"entropy {_value(metrics, entropy_key, '.3f')}",
            f"mask {_value(metrics, 'actor/stapo/mask_ratio', '.4f')}",
            f"tau_h {_value(metrics, 'actor/stapo/tau_h', '.3f')}",
            f"{per_step:.0f} s/step",
            f"ETA {format_duration(remaining)}",
        ]
        if "val/average/acc" in metrics:
            parts.append(f"held-out acc {metrics['val/average/acc']:.3f}{further_decodings(metrics)}")
        return " | ".join(parts)


def further_decodings(metrics: dict[str, float]) -> str:
    """`` (T0.7 0.855)`` for the held-out accuracy of each further decoding logged (``stapo.val_decodings``)."""
    found = [f"{name} {metrics[key]:.3f}" for name, key in DECODING_ACC.items() if key in metrics]
    return f" ({', '.join(found)})" if found else ""
