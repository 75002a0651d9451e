"""Strict last-``\\boxed{}`` matching (DAPO-style), bounded in time by construction: no sympy.

Extraction: the answer is the content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``, nested
braces allowed, or ``\\boxed 5`` without braces). When the reply has a reasoning block, only the
text after its closing ``</think>`` counts; a ``<think>`` that is never closed means the reply was
cut off while reasoning, so it has no answer.

Normalisation (applied to both the answer and the ground truth) follows the DAPO / Minerva math
checker: keep the right-hand side of an equation, drop TeX spacing, ``\\left``/``\\right``, dollar
signs, degree marks, percent signs, ``\\text{}`` wrappers and unit words, spaces, a trailing period,
thousands separators; unify ``\\dfrac``/``\\tfrac``/``\\frac12``, ``\\sqrt2``, the unicode minus and
decimal forms such as ``3.0``/``.5``. Two answers match when their normalised strings are equal.

Cost is linear in the input and the scan is capped (``MAX_SCAN_CHARS`` of the reply's tail,
``MAX_ANSWER_CHARS`` of an answer), so megabytes of text score in milliseconds.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

MAX_SCAN_CHARS = 20_000  # only the tail of a reply can hold its final answer
MAX_ANSWER_CHARS = 1_000  # a longer "answer" is not a math answer
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _final_section(text: str) -> str | None:
    """The part of a reply that may hold the final answer (None: reasoning never finished)."""
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        text = text[close + len(_THINK_CLOSE) :]
    elif text.find(_THINK_OPEN) >= 0:
        return None
    return text[-MAX_SCAN_CHARS:]


def _braced(text: str, start: int) -> str | None:
    """Content of the balanced ``{...}`` group opening at ``text[start]``; None if unbalanced."""
    depth = 0
    for index in range(start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : index]
    return None


def _last_box_position(text: str) -> tuple[int, str] | None:
    best = None
    for command in _BOX_COMMANDS:
        position = text.rfind(command)
        while position >= 0:
            after = text[position + len(command) : position + len(command) + 1]
            if not after.isalpha():  # \boxed, not \boxedanswer
                break
            position = text.rfind(command, 0, position)
        if position >= 0 and (best is None or position > best[0]):
            best = (position, command)
    return best


def last_boxed(text: str | None) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\boxed x`` of the reply's final section, or None."""
    if not text:
        return None
    section = _final_section(text)
    if section is None:
        return None
    found = _last_box_position(section)
    if found is None:
        return None
    position, command = found
    rest = section[position + len(command) :]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        content = _braced(stripped, 0)
    elif rest[:1].isspace():  # \boxed 5: one token, up to a space or the closing dollar
        match = re.match(r"([^\s$]+)", stripped)
        content = match.group(1) if match else None
    else:
        content = None
    if content is None or not content.strip() or len(content) > MAX_ANSWER_CHARS:
        return None
    return content.strip()


# --- normalisation -------------------------------------------------------------------------------

_UNIT_WORDS = (
    "units?", "square", "sq", "cubic", "cm", "mm", "km", "m", "meters?", "metres?", "centimeters?",
    "kilometers?", "inch(?:es)?", "feet", "foot", "ft", "yards?", "miles?", "mph", "kg", "grams?",
    "pounds?", "lbs?", "ounces?", "liters?", "litres?", "ml", "seconds?", "sec", "s", "minutes?",
    "min", "hours?", "hrs?", "days?", "weeks?", "months?", "years?", "degrees?", "radians?",
    "dollars?", "cents?", "euros?", "points?", "ways", "integers?", "digits?", "students?", "people",
    "edges?", "faces?", "vertices", "sides?", "times", "cookies?", "apples?", "marbles?", "coins?",
    "tiles?", "cubes?", "books?", "pages?", "games?", "teams?", "handshakes?", "meals?", "tickets?",
    "multiples?", "rows?", "seats?", "triangles?", "solutions?", "pairs?", "percent", "and",
)
_UNIT_PHRASE = r"(?:(?:" + "|".join(_UNIT_WORDS) + r")(?![A-Za-z])(?:\^\{?[23]\}?)?\s*)+"
# a trailing unit phrase, after a number / closing brace / parenthesis: "5 cm", "5\text{ cm}^2"
_TRAILING_UNITS = re.compile(
    r"(?<=[\d}).])\s*(?:\\(?:text|mbox|mathrm|textrm)\s*\{\s*" + _UNIT_PHRASE + r"\}|\s+" + _UNIT_PHRASE
    + r")(?:\^\{?[23]\}?)?\s*$"
)
_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = (r"\left", r"\right", r"\displaystyle", r"\!", r"\,", r"\;", r"\:", r"\quad", r"\qquad", r"\ ", "~")
_DEGREES = (r"^{\circ}", r"^\circ", "\u00b0", r"\degree")
_NUMBER = re.compile(r"(-?)(\d*)(?:\.(\d*))?")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _strip_units(text: str) -> str:
    for _ in range(3):  # "5 square units" is one phrase; "5 cm^2 \text{each}" needs two passes
        stripped = _TRAILING_UNITS.sub("", text)
        if stripped == text:
            break
        text = stripped
    return text


def _canonical_number(text: str) -> str:
    """"3.0" -> "3", ".5" -> "0.5", "007" -> "7", "-0" -> "0"; anything else unchanged."""
    match = _NUMBER.fullmatch(text)
    if not match or not (match.group(2) or match.group(3)):
        return text
    sign, whole, fraction = match.group(1), match.group(2).lstrip("0") or "0", (match.group(3) or "").rstrip("0")
    number = whole + ("." + fraction if fraction else "")
    return number if number == "0" else sign + number


def normalize_answer(answer: str) -> str:
    """Canonical string form of a final answer (see the module docstring for the rules)."""
    text = str(answer)[:MAX_ANSWER_CHARS].strip()
    text = text.replace("\u2212", "-").replace("\u2013", "-").replace("\u00a0", " ")
    boxed = last_boxed(text) if ("\\boxed" in text or "\\fbox" in text) else None
    if boxed is not None:  # a ground truth that is a whole boxed solution
        text = boxed
    text = text.replace("\\$", "").replace("$", "")
    for token in _SPACING:
        text = text.replace(token, " ")
    if "=" in text and not re.search(r"\\(?:le|ge|ne)q?(?![a-z])|[<>]", text):
        text = text.split("=")[-1]  # "x = 4" -> "4", as DAPO's checker does
    text = re.sub(r"^\s*[A-Za-z]\s*\\in(?![a-z])\s*", "", text)  # "x \in [0, 1)" -> "[0, 1)"
    for token in _DEGREES:
        text = text.replace(token, "")
    text = text.replace("\\%", "").replace("%", "")
    text = text.replace("{,}", ",")  # 1{,}000
    text = _strip_units(text.strip())
    for _ in range(3):  # \text{\textbf{5}}
        text = _WRAPPERS.sub(lambda m: m.group(1), text)
    text = _strip_units(text.strip())  # \text{5 cm}
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)  # \frac12
    text = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", text)  # \frac1{2}
    text = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", text)  # \frac{1}2
    text = re.sub(r"\\sqrt\s*(\d+|[a-zA-Z](?![a-zA-Z]))", r"\\sqrt{\1}", text)  # \sqrt2
    text = re.sub(r"\s+", "", text).rstrip(".")
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    match = re.fullmatch(r"\(([A-Ea-e])\)", text)  # multiple choice "(B)" -> "B"
    if match:
        text = match.group(1).upper()
    return _canonical_number(text)


# --- the reward ----------------------------------------------------------------------------------

def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Any = None,
    math_verify: bool | None = None,
    verify_timeout_s: float | None = None,
    **kwargs,
) -> dict:
    """verl custom-reward signature: +1 / -1 from the strict match of the last ``\\boxed{}``.

    With ``math_verify`` (``+reward.custom_reward_function.reward_kwargs.math_verify=true``, or
    the environment variable ``STAPO_MATH_VERIFY=1``) a strict miss gets a second opinion from
    math-verify, run in a killable child process and bounded by ``verify_timeout_s`` (default 5 s,
    or ``STAPO_MATH_VERIFY_TIMEOUT``); an overrun scores -1 and is flagged ``checker_timeout``.
    The ``checker_*`` flags (verl reward extra info, numeric) say which checker decided.
    """
    if math_verify is None:
        math_verify = _flag(os.environ.get("STAPO_MATH_VERIFY", "0"))
    if verify_timeout_s is None:
        verify_timeout_s = float(os.environ.get("STAPO_MATH_VERIFY_TIMEOUT", "5"))
    extracted = last_boxed(as_reply_text(solution_str))
    truths = ground_truths(ground_truth)
    golds = {normalize_answer(truth) for truth in truths} - {""}
    correct = extracted is not None and normalize_answer(extracted) in golds
    decided_by = "strict"
    if not correct and _flag(math_verify) and extracted is not None and golds:
        from stapo.reward.verify import default_verifier

        for truth in truths:  # the first one math-verify accepts; a timeout stops the search
            verdict = default_verifier(float(verify_timeout_s)).equivalent(truth, extracted)
            correct, decided_by = bool(verdict), ("timeout" if verdict is None else "math_verify")
            if verdict is not False:
                break
    return {
        "score": 1.0 if correct else -1.0,
        "acc": float(correct),
        "has_answer": float(extracted is not None),
        # a row without a usable ground truth scores -1 whatever the reply; this counts them
        "has_ground_truth": float(bool(golds)),
        "checker_strict": float(decided_by == "strict"),
        "checker_math_verify": float(decided_by == "math_verify"),
        "checker_timeout": float(decided_by == "timeout"),
    }


def as_reply_text(reply: Any) -> str:
    """The reply as text whatever the caller passed (None, bytes, a number): the reward never raises."""
    if reply is None:
        return ""
    if isinstance(reply, (bytes, bytearray)):
        return bytes(reply).decode("utf-8", errors="replace")
    return reply if isinstance(reply, str) else str(reply)


def ground_truths(value: Any) -> list[str]:
    """The usable ground-truth strings of a row: none for None / NaN / inf / empty / a mapping, one per
    element for a list or array (any of them counts as right), else the value as text."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    out = []
    for item in values:
        if item is None or isinstance(item, (bool, dict, list, tuple)):
            continue
        if isinstance(item, float) and not math.isfinite(item):
            continue
        text = as_reply_text(item).strip()[:MAX_ANSWER_CHARS]
        if text:
            out.append(text)
    return out


def checker_name(result: dict) -> str:
    """The short name of the checker that decided a ``compute_score`` result."""
    for name in ("math_verify", "timeout", "strict"):
        if result.get(f"checker_{name}"):
            return name
    return "strict"
