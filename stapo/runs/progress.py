"""Progress of a trainer run, read from verl's console logger (``step:N - key:value - ...`` lines).

Pure: feeds on output lines and returns what to print, so the same code serves ``stapo train``, the
demo, the sweep and the tests, and a slow step never blocks the reader. The ETA counts the validations
still to come (verl validates every ``trainer.test_freq`` steps and at the last one), each at the mean
validation time measured so far (verl's ``timing_s/testing``; ``timing_s/step`` leaves it out); until one
was timed, the ETA says how many are not counted.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from stapo.rundir import ENTROPY_KEYS
from stapo.runs.summary import DECODING_ACC

_STEP_LINE = re.compile(r"step:(\d+) - (.*)")
STEP_TIME, VAL_TIME = "timing_s/step", "timing_s/testing"
# one ``key:value`` of the line; verl's console prints some numpy scalars by their repr (``np.float64(-0.25)``,
# ``np.int64(2)``: validation means, num_turns, off-policy spans), which are numbers like the others
_METRIC = re.compile(r"(\S+):(?:np\.\w+\()?(-?(?:[0-9.]+(?:e[-+]?\d+)?|nan|inf))\)?")


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, metrics) of one console-logger line, else None."""
    match = _STEP_LINE.search(line)
    if not match:
        return None
    items = (_METRIC.fullmatch(item.strip()) for item in match.group(2).split(" - "))
    return int(match.group(1)), {found.group(1): float(found.group(2)) for found in items if found}


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


def validations_after(step: int, total_steps: int, test_freq: int) -> int:
    """The validations verl runs after ``step``: at each multiple of ``test_freq`` up to ``total_steps`` and at the
    last step (trainer_base.fit: ``is_last_step or global_steps % test_freq == 0``); none when ``test_freq <= 0``."""
    if test_freq <= 0 or step >= total_steps:
        return 0
    return total_steps // test_freq - step // test_freq + (1 if total_steps % test_freq else 0)


@dataclass(eq=False)  # compared by identity: a sweep's clock holds its runs' progress and each run its clock
class Progress:
    """Turns step lines into one-line summaries with time per step and an ETA (validations included).

    ``test_freq``: the run's ``trainer.test_freq`` (0: validations not counted). ``sweep``: the sweep this run
    belongs to, whose overall ETA each line then ends with."""

    total_steps: int
    label: str = "stapo"
    started: float = field(default_factory=time.monotonic)
    step_seconds: list[float] = field(default_factory=list)
    test_freq: int = 0
    val_seconds: list[float] = field(default_factory=list)
    sweep: SweepClock | None = None
    last_step: int = 0

    def remaining(self, step: int | None = None) -> tuple[float, int]:
        """(seconds left after ``step``, validations left that no measured time counts yet)."""
        step = self.last_step if step is None else step
        per_step = sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else 0.0
        seconds = max(0, self.total_steps - step) * per_step
        validations = validations_after(step, self.total_steps, self.test_freq)
        if validations and self.val_seconds:
            return seconds + validations * sum(self.val_seconds) / len(self.val_seconds), 0
        return seconds, validations

    def eta(self, step: int | None = None) -> str:
        if self.total_steps <= 0:  # the data's rows are not known here (remote files, trainer.total_epochs decides)
            return "unknown"
        seconds, untimed = self.remaining(step)
        return format_duration(seconds) + (f" + {untimed} validation{'s' * (untimed != 1)}" if untimed else "")

    def line(self, step: int, metrics: dict[str, float]) -> str:
        if STEP_TIME not in metrics and "val/average/acc" in metrics:  # validation before training
            return f"[{self.label}] held-out accuracy before training: {metrics['val/average/acc']:.3f}" + \
                further_decodings(metrics)
        if STEP_TIME in metrics:
            self.step_seconds.append(metrics[STEP_TIME])
        if VAL_TIME in metrics:
            self.val_seconds.append(metrics[VAL_TIME])
        self.last_step = max(self.last_step, step)
        per_step = sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else 0.0
        # the mean entropy of a response token where logged (verl's actor/entropy follows loss_agg_mode)
        entropy_key = next((key for key in ENTROPY_KEYS if key in metrics), ENTROPY_KEYS[-1])
        parts = [
            f"[{self.label}] step {step}/{self.total_steps}" if self.total_steps > 0 else f"[{self.label}] step {step}",
            f"reward {_value(metrics, 'critic/score/mean', '+.3f')}",
            f"acc {_value(metrics, 'reward/acc/mean', '.3f')}",
            f"entropy {_value(metrics, entropy_key, '.3f')}",
            f"mask {_value(metrics, 'actor/stapo/mask_ratio', '.4f')}",
            f"tau_h {_value(metrics, 'actor/stapo/tau_h', '.3f')}",
            f"{per_step:.0f} s/step",
            f"ETA {self.eta(step)}",
        ]
        if "val/average/acc" in metrics:
            parts.append(f"held-out acc {metrics['val/average/acc']:.3f}{further_decodings(metrics)}")
        if self.sweep is not None:
            parts.append(f"sweep ETA {self.sweep.eta()}")
        return " | ".join(parts)


@dataclass(eq=False)
class SweepClock:
    """The overall ETA of a sweep's runs: what the runs in flight have left, plus the runs not started yet at the
    mean time of a finished run (before one finished: of a run in flight, its time so far plus its ETA), shared
    among ``parallel`` runs at once. Runs report from threads of one process (``--max-parallel``)."""

    runs: int
    parallel: int = 1
    finished_seconds: list[float] = field(default_factory=list)
    running: list[Progress] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, progress: Progress) -> Progress:
        with self.lock:
            progress.sweep = self
            self.running.append(progress)
        return progress

    def finish(self, progress: Progress, seconds: float) -> None:
        with self.lock:
            if progress in self.running:
                self.running.remove(progress)
            self.finished_seconds.append(seconds)

    def eta(self) -> str:
        with self.lock:
            running = list(self.running)
            finished = list(self.finished_seconds)
        waiting = max(0, self.runs - len(finished) - len(running))
        measured = [run for run in running if run.step_seconds]
        if finished:
            per_run = sum(finished) / len(finished)
        elif measured:
            per_run = sum(time.monotonic() - run.started + run.remaining()[0] for run in measured) / len(measured)
        else:
            return "after the first step"
        left = sum(run.remaining()[0] if run.step_seconds else per_run for run in running) + waiting * per_run
        untimed = sum(run.remaining()[1] for run in running)
        text = format_duration(left / max(1, min(self.parallel, len(running) + waiting)))
        return text + (f" + {untimed} validation{'s' * (untimed != 1)}" if untimed else "")


def further_decodings(metrics: dict[str, float]) -> str:
    """`` (T0.7 0.855)`` for the held-out accuracy of each further decoding logged (``stapo.val_decodings``)."""
    found = [f"{name} {metrics[key]:.3f}" for name, key in DECODING_ACC.items() if key in metrics]
    return f" ({', '.join(found)})" if found else ""
