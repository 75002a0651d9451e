"""Checks of STAPO settings, with errors that name the setting and its allowed range.

Pure Python, so the same checks run in the core functions, in the verl config dataclass and on the
driver before any worker (and any GPU time) starts. ``prefix`` lets the caller name the full
Hydra key, e.g. ``actor_rollout_ref.actor.policy_loss.tau_p``. Only this project's own settings are
checked here; checks of verl's keys (clip ratios, batch sizes) live in ``stapo/verl_plugin/``.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

# the paper's values, written once: the defaults of stapo.algorithm.masks.MaskSettings (and so of the typed
# verl config) and of the pure functions, and the hints in the error messages
PAPER_TAU_P = 0.002
PAPER_ENTROPY_QUANTILE = 0.75
ENTROPY20_TOP_FRACTION = 0.2
# the soft per-token weights' values (docs/algorithm.md section 7): TACO's alpha and lambda, and Advantage
# Reweighting's alpha (the authors' K&K script, arXiv 2505.12929)
TACO_ALPHA = 0.01
TACO_LAMBDA = 0.9
ADVREW_ALPHA = 0.3
# Lopti's eta (the same paper and script): tokens with old-policy probability below it are updated first
LOPTI_ETA = 0.5


class STAPOConfigError(ValueError):
    """A STAPO setting is out of range or contradicts another setting."""

    # True: the message is a headline and one line per item (the keys a checkpoint's run differs in), kept as lines
    keeps_lines = False


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_tau_p(value: Any, prefix: str = "") -> None:
    if not is_finite_number(value) or not 0.0 < value < 1.0:
        raise STAPOConfigError(f"{prefix}tau_p must be a probability in (0, 1) (paper: {PAPER_TAU_P}), got {value!r}")


def check_entropy_quantile(value: Any, prefix: str = "") -> None:
    if not is_finite_number(value) or not 0.0 < value <= 1.0:
        raise STAPOConfigError(
            f"{prefix}entropy_quantile must be in (0, 1] (paper: {PAPER_ENTROPY_QUANTILE}), got {value!r}"
        )


def check_top_fraction(value: Any, prefix: str = "") -> None:
    if not is_finite_number(value) or not 0.0 < value <= 1.0:
        raise STAPOConfigError(
            f"{prefix}entropy_top_fraction must be in (0, 1] (20-Entropy baseline: {ENTROPY20_TOP_FRACTION}), "
            f"got {value!r}"
        )


def check_interval(name: str, value: Any, low: float, high: float, closed: str, hint: str, prefix: str = "") -> None:
    """``value`` a finite number in the interval from ``low`` to ``high``; ``closed`` names the closed ends
    (``""``, ``"low"``, ``"high"`` or ``"both"``), and the message writes the interval as it is."""
    if not is_finite_number(value):
        ok = False
    else:
        above = low <= value if closed in ("low", "both") else low < value
        below = value <= high if closed in ("high", "both") else value < high
        ok = above and below
    if not ok:
        left = "[" if closed in ("low", "both") else "("
        right = "]" if closed in ("high", "both") else ")"
        raise STAPOConfigError(f"{prefix}{name} must be in {left}{low:g}, {high:g}{right} ({hint}), got {value!r}")


def check_choice(name: str, value: Any, allowed: tuple[str, ...], prefix: str = "") -> None:
    if value not in allowed:
        raise STAPOConfigError(f"{prefix}{name} must be one of {list(allowed)}, got {value!r}")


def check_positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise STAPOConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def check_number(key: str, value: Any, minimum: float = 0.0, hint: str = "") -> float:
    """A finite number >= ``minimum`` (a string such as ``lr=fast`` reaches the workers otherwise)."""
    if not is_finite_number(value) or value < minimum:
        raise STAPOConfigError(f"{key} must be a finite number >= {minimum:g}{hint}, got {value!r}")
    return value


def did_you_mean(word: Any, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing when none is close."""
    close = difflib.get_close_matches(str(word), [str(choice) for choice in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def refusal_line(error: BaseException) -> str:
    """The one line a refused setting is reported with, on every command: ``stapo: <message>`` (an error that
    lists items keeps one line each, after its headline)."""
    if getattr(error, "keeps_lines", False):
        head, *items = [" ".join(line.split()) for line in str(error).splitlines() if line.strip()]
        return "stapo: " + "".join([head, *(f"\n  {item}" for item in items)])
    return "stapo: " + " ".join(str(error).split())
