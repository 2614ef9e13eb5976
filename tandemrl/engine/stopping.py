"""Stop strings: validation, finding the earliest one, and mapping a text cut back to tokens.

Convention (the same as vLLM's): when a stop string appears in a completion,
- the completion's token ids keep every token up to AND INCLUDING the token whose decoding first makes the
  text contain the stop string (the policy did choose that token, so the trainer scores it), and
- ``text`` is cut just before the stop string (the stop string and anything after it are dropped).
The earliest stop string wins: the one whose occurrence starts first in the text.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence


def validate_stop(stop: str | Iterable[str] | None) -> tuple[str, ...]:
    """Return the stop strings as a tuple; a bare string counts as one stop string.

    Raises ValueError naming the first entry that is not a non-empty string.
    """
    if stop is None:
        return ()
    entries = (stop,) if isinstance(stop, str) else tuple(stop)
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"stop entries must be non-empty strings; bad entry {entry!r} in {stop!r}")
    return entries


def find_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index in ``text`` where the earliest stop string starts, or None if none occurs."""
    starts = [i for i in (text.find(s) for s in stop) if i != -1]
    return min(starts) if starts else None


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before its earliest stop string, and whether one was found."""
    i = find_stop(text, stop)
    return (text, False) if i is None else (text[:i], True)


def tokens_to_keep(ids: Sequence[int], decode: Callable[[Sequence[int]], str], stop: Sequence[str]) -> int | None:
    """Number of leading tokens to keep so the completion ends with the token that completed a stop string.

    That is the smallest ``n`` such that ``decode(ids[:n])`` contains a stop string; None if even the whole
    of ``ids`` decodes to text without one. Prefix texts grow as tokens are appended, so containment is
    monotone in ``n`` and a binary search over prefixes finds ``n`` in O(log len) decodes.
    """
    if not stop or find_stop(decode(ids), stop) is None:
        return None
    lo, hi = 1, len(ids)  # decode(ids[:hi]) contains a stop string; find the smallest such prefix
    while lo < hi:
        mid = (lo + hi) // 2
        if find_stop(decode(ids[:mid]), stop) is not None:
            hi = mid
        else:
            lo = mid + 1
    return hi
