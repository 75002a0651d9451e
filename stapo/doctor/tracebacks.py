"""The line of a job's log that says why it failed: Ray's worker prefixes and colours removed, tracebacks
read for the exception that closes them (Ray's wrapper exceptions give way to the one they carry)."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray prefixes a worker's lines with "(ActorName pid=123, ip=10.0.0.2)"
_RAY_PREFIX = re.compile(r"^\(\S+ pid=\d+(?:, ip=[\d.a-f:]+)?\)\s?")
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?:\(\w+\))?(?::.*)?$"
)
# wrappers whose own line says less than the exception they carry
_WRAPPERS = ("RayTaskError", "RayActorError", "ActorDiedError", "WorkerCrashedError", "ActorUnavailableError")
REFUSAL_PREFIX = "stapo: "  # every refused setting, on every command (stapo.cli, the recipe)
_ERROR_WORD = re.compile(r"\berror\b", re.IGNORECASE)


def _clean(line: str) -> str:
    return _RAY_PREFIX.sub("", _ANSI.sub("", line)).rstrip()


def _is_wrapper(line: str) -> bool:
    return line.split(":", 1)[0].rsplit(".", 1)[-1].startswith(_WRAPPERS)


def _traceback_ends(lines: list[str]) -> list[str]:
    """The exception line closing each traceback, in order of appearance. Ray prints a remote
    error as its wrapper line followed by the remote frames and the carried exception: that one wins."""
    found = []
    for index, line in enumerate(lines):
        if line.strip() != "Traceback (most recent call last):":
            continue
        end = None
        for candidate in lines[index + 1 :]:
            if candidate.strip() == "Traceback (most recent call last):":
                break
            if candidate[:1] in (" ", "\t", "") or not _EXCEPTION.match(candidate):
                continue
            end = candidate if end is None or _is_wrapper(end) else end
            if not _is_wrapper(end):
                break
        if end is not None:
            found.append(end)
    return found


def first_error_line(log: str) -> str | None:
    """The line of a job log that says why it failed, or None for a log without any error.

    Preference: the recipe's one-line refusal of a setting (``stapo: ...``); the first exception that
    closes a traceback (the root cause of a chained error
    comes first; Ray's wrappers give way to the exception they carry); then any other exception
    line; then a line with the word "error" that is not a warning nor the submit script's own
    summary; that summary last.
    """
    lines = [_clean(line) for line in log.splitlines()]
    refusals = [line.strip() for line in lines if line.startswith(REFUSAL_PREFIX)]
    if refusals:  # the recipe refused a setting in one line (stapo.check): nothing says it better
        return refusals[0][:300]
    ends = _traceback_ends(lines)
    direct = [line for line in ends if not _is_wrapper(line)]
    if ends:
        return (direct or ends)[0][:300]
    exceptions = [line.strip() for line in lines if _EXCEPTION.match(line.strip())]
    if exceptions:
        return exceptions[0][:300]
    wordy = [line.strip() for line in lines if _ERROR_WORD.search(line) and "warn" not in line.lower()]
    own = [line for line in wordy if line.startswith("[stapo-ray")]
    others = [line for line in wordy if not line.startswith("[stapo-ray")]
    chosen = others or own
    return chosen[0][:300] if chosen else None


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)
