"""Math answer checking: extract a final answer from a completion, parse numbers, compare with the gold."""

from __future__ import annotations

import math
import re

# A number as written in prose: optional minus (not one joining two operands, as in "5-3"), thousands
# separators, decimals, an optional "/denominator".
_NUMBER = re.compile(r"(?<![\w.])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*(?P<rest>[^\n]*)", re.IGNORECASE)
_PLAIN = re.compile(r"^[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?$")
_FRAC = re.compile(r"^([+-]?)\\[dt]?frac\s*(?:\{([^{}]+)\}|(\d))\s*(?:\{([^{}]+)\}|(\d))$")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{[^{}]*\}")


def find_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces handled; None if absent or
    unbalanced."""
    span = boxed_span(text)
    return text[span[0] : span[1]].strip() if span else None


def boxed_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the content of the last balanced ``\\boxed{...}``; the closing brace is at ``end``."""
    for match in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return start, i
    return None


def _number_or_first(candidate: str) -> str | None:
    """``candidate`` if it parses as a number, else the first number inside it, else None."""
    candidate = candidate.strip()
    if parse_number(candidate) is not None:
        return candidate
    match = _NUMBER.search(candidate)
    return match.group(0) if match else None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion, as a string (parse it with :func:`parse_number`).

    Priority: the last ``\\boxed{...}``; then the text after the last ``####`` (to the end of that line); then the
    last "answer is X" / "answer: X"; then the last number in the text. For ``####`` and "answer is", when the
    text is not a bare number, the first number in it is taken ("#### 72 clips" -> "72").
    """
    if not text:
        return None
    boxed = find_boxed(text)
    if boxed:
        return boxed
    if "####" in text:
        line = text.rsplit("####", 1)[1].split("\n", 1)[0]
        found = _number_or_first(line)
        if found is not None:
            return found
        if line.strip():
            return line.strip()
    matches = list(_ANSWER_IS.finditer(text))
    if matches:
        rest = matches[-1].group("rest")
        found = _number_or_first(rest)
        if found is not None:
            return found
        if rest.strip().rstrip("."):
            return rest.strip().rstrip(".")
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _strip_decorations(s: str) -> str:
    s = _TEXT_CMD.sub("", s)
    for old, new in (("−", "-"), ("\\$", ""), ("$", ""), ("\\%", "%"), ("\\!", ""), ("\\,", ""), ("\\ ", "")):
        s = s.replace(old, new)
    s = s.replace("\\left", "").replace("\\right", "")
    previous = None
    while s != previous:
        previous = s
        s = s.strip().strip("*_`").strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]"), ("{", "}"), ("(", ")")):
            if s.startswith(left) and s.endswith(right):
                s = s[len(left) : -len(right)]
        s = s.rstrip(".").rstrip("%")
    return s.strip()


def parse_number(s: str | float | int | None) -> float | None:
    """A float from an answer string, or None.

    Accepts ``$``/``\\$``, thousands separators (``1,234``), a trailing period, ``%`` (``50%`` -> 50.0), markdown
    ``**``/backticks, surrounding ``$...$``/``\\(...\\)``, negatives (also the Unicode minus), simple fractions
    ``3/4``, ``\\frac{a}{b}`` (and ``\\dfrac``/``\\tfrac``), and ``\\text{...}`` units, which are dropped.
    Rejects anything else (e.g. ``"1,5"``, ``"12 apples"``, non-finite values).
    """
    if s is None or isinstance(s, bool):
        return None
    if isinstance(s, (int, float)):
        return float(s) if math.isfinite(s) else None
    t = _strip_decorations(str(s))
    if not t:
        return None
    frac = _FRAC.match(t)
    if frac:
        sign, num_b, num_d, den_b, den_d = frac.groups()
        num, den = parse_number(num_b or num_d), parse_number(den_b or den_d)
        if num is None or den is None or den == 0:
            return None
        return -num / den if sign == "-" else num / den
    t = re.sub(r"\s*/\s*", "/", re.sub(r"^([+-])\s+", r"\1", t))
    if "/" in t:
        num_s, _, den_s = t.partition("/")
        num, den = _plain(num_s), _plain(den_s)
        if num is None or den is None or den == 0:
            return None
        return num / den
    return _plain(t)


def _plain(t: str) -> float | None:
    if not _PLAIN.match(t):
        return None
    try:
        value = float(t.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def normalize_answer(s: str) -> str:
    """Lower-cased answer without decorations or whitespace, for non-numeric comparison."""
    return re.sub(r"\s+", "", _strip_decorations(s)).lower()


def answers_match(pred: str | None, gold: str, rel_tol: float = 1e-6) -> bool:
    """Numeric comparison (relative tolerance ``rel_tol``) when both parse as numbers, else equality of the
    normalised strings. ``pred`` None never matches."""
    if pred is None:
        return False
    p, g = parse_number(pred), parse_number(gold)
    if p is not None and g is not None:
        return math.isclose(p, g, rel_tol=rel_tol, abs_tol=1e-9)
    return normalize_answer(str(pred)) == normalize_answer(str(gold)) != ""
