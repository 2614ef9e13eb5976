"""Draft-free proposals for self-speculative decoding: n-gram (prompt-lookup) matching, on the host.

Instead of a draft model, the next tokens of a sequence are guessed from the sequence itself (prompt + generated so
far): take its last ``n`` tokens (the suffix), find an earlier occurrence of them, and propose the (up to)
``num_tokens`` tokens that followed that occurrence. vLLM calls this the "ngram" method (``prompt_lookup_min`` /
``prompt_lookup_max``); Hugging Face calls it prompt-lookup decoding.

The rules, the same for every entry point here:

* ``n`` runs from ``max_n`` down to ``min_n`` (never beyond the sequence's length); the first ``n`` whose suffix
  occurs earlier decides, so a longer match always beats a shorter one.
* An occurrence counts only if at least one token follows it, i.e. it ends before the suffix ends: the suffix never
  matches itself. It may overlap the suffix (``[5, 5, 5]`` with ``n = 2``: ``[5, 5]`` at 0 matches, proposing
  ``[5]``), as in vLLM and Hugging Face.
* Among several occurrences of the same ``n``-gram, ``prefer="recent"`` (the default) takes the most recent one,
  ``prefer="earliest"`` the first one. vLLM v1 (``_find_longest_matched_ngram_and_propose_tokens``) and Hugging
  Face's ``PromptLookupCandidateGenerator`` both take the EARLIEST; "recent" follows the newest context (a loop the
  model has just entered, a passage it is quoting now). Their trade-off: the most recent occurrence often sits close
  to the end, so fewer than ``num_tokens`` tokens follow it (in a period-``p`` loop it proposes only ``p``).
* The proposal is the tokens that follow the occurrence, at most ``num_tokens``; fewer where the sequence ends
  first; ``[]`` without a match.
* Only known tokens: a negative id (the engine's ``PENDING_TOKEN`` placeholder, -1) or one >= 2**32 is a
  ``ValueError``. A sequence with ``num_pending`` placeholders is given ``token_ids[:num_tokens - num_pending]``.

Two ways in:

* ``NgramIndex`` — the per-step path. One per running sequence, fed the tokens as they become known
  (``extend``/``append``); ``propose()`` is then a few dict look-ups, independent of the sequence's length. It keeps a
  dict per ``n`` from each ``n``-gram (its ids packed into one int) to the position after its most recent (or first)
  occurrence, and the packed keys of the current suffix. Measured on a 2-core CPU, 256 sequences of 1,000 tokens,
  ``max_n = 3``, k = 4: ``propose()`` for all 256 in 0.12-0.19 ms; appending one token to each and proposing
  0.46-0.69 ms (~1.2 us per token appended one at a time); five tokens each 1.5-1.7 ms. A prompt is indexed at
  ~0.5 us per token. Memory ~240 bytes per indexed token (ints in dicts: 60 MB for 256 x 1,000 tokens).
* ``propose_ngram`` / ``propose_batch`` — stateless: each call scans the whole sequence (a C-level ``rfind`` over the
  ids packed as 32-bit words), ~10-15 us per 1,000-token sequence (256 x 1,000: 2.5-4 ms; 256 x 4,000: 8-13 ms).
  For tests, tools and one-off calls; cheaper than the index only where dozens of tokens arrive between proposals.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

_TOKEN_BITS = 32
_TOKEN_LIMIT = 1 << _TOKEN_BITS  # ids are packed into 32 bits (n-gram keys, the byte search)
_TYPECODE = next(code for code in "IL" if array(code).itemsize == 4)  # C unsigned 32-bit (overflow: an error)
_SHORT_EXTEND = 16  # extend() appends one at a time below this many tokens (the bulk path has a fixed cost)


@dataclass(frozen=True)
class NgramConfig:
    """``min_n``..``max_n``: the suffix lengths tried, longest first; ``num_tokens``: the most tokens proposed (k);
    ``prefer``: which of several earlier occurrences wins (module docstring)."""

    min_n: int = 1
    max_n: int = 3
    num_tokens: int = 4
    prefer: Literal["recent", "earliest"] = "recent"

    def validate(self) -> None:
        _positive_int("min_n", self.min_n)
        _positive_int("max_n", self.max_n)
        if self.max_n < self.min_n:
            raise ValueError(f"NgramConfig.max_n ({self.max_n}) must be >= min_n ({self.min_n})")
        _positive_int("num_tokens", self.num_tokens)
        if self.prefer not in ("recent", "earliest"):
            raise ValueError(f"NgramConfig.prefer must be 'recent' or 'earliest', got {self.prefer!r}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"NgramConfig.{name} must be an integer >= 1, got {value!r}")


def _bad_token(token_ids: Iterable[int]) -> ValueError:
    bad = next((t for t in token_ids if not 0 <= t < _TOKEN_LIMIT), None)
    return ValueError(f"n-gram proposals need known token ids in [0, 2**32), got {bad!r} "
                      f"(a pending placeholder? pass only the tokens read back)")


def _known_ids(token_ids: Iterable[int]) -> array:
    """The ids as 32-bit unsigned words: one C-level pass that converts (numpy arrays and ints included), refuses
    floats (TypeError) and refuses ids outside [0, 2**32) (ValueError)."""
    if hasattr(token_ids, "tolist"):  # numpy array / torch tensor
        token_ids = token_ids.tolist()
    elif not isinstance(token_ids, (list, tuple)):
        token_ids = list(token_ids)
    try:
        return array(_TYPECODE, token_ids)
    except OverflowError:
        raise _bad_token(token_ids) from None


# --------------------------------------------------------------------------------------------- stateless


def propose_ngram(token_ids: Sequence[int], config: NgramConfig) -> list[int]:
    """The proposal for one sequence of known token ids (module docstring: the rules). Scans the whole sequence."""
    config.validate()
    return _propose_scan(_known_ids(token_ids), config)


def propose_batch(sequences: Sequence[Sequence[int]], config: NgramConfig) -> list[list[int]]:
    """``propose_ngram`` for each sequence (the config validated once)."""
    config.validate()
    return [_propose_scan(_known_ids(ids), config) for ids in sequences]


def _propose_scan(tokens: array, config: NgramConfig) -> list[int]:
    length = len(tokens)
    if length <= config.min_n:  # the suffix needs an earlier occurrence followed by a token
        return []
    buf = tokens.tobytes()
    recent = config.prefer == "recent"
    limit = 4 * (length - 1)  # the occurrence must lie within tokens[:-1]: one token follows it
    for n in range(min(config.max_n, length - 1), config.min_n - 1, -1):
        pattern = buf[4 * (length - n):]
        lo, hi = 0, limit
        while True:  # a byte match that is not 4-aligned straddles two ids: search past it
            off = buf.rfind(pattern, lo, hi) if recent else buf.find(pattern, lo, hi)
            if off < 0:
                break
            if off & 3 == 0:
                start = off // 4 + n
                return tokens[start:start + config.num_tokens].tolist()
            if recent:
                hi = off + 4 * n - 1
            else:
                lo = off + 1
    return []


# --------------------------------------------------------------------------------------------- incremental


class NgramIndex:
    """The n-gram proposer's state for one sequence, fed its known tokens as they arrive.

    ``NgramIndex(config, prompt_ids)``, then ``extend(new_ids)`` (or ``append(id)``) each time tokens are read back
    (accepted draft tokens included: only tokens that are final), and ``propose()`` when drafts are needed. Never give
    it placeholders: ``len(index)`` tokens are indexed, so ``index.extend(seq.token_ids[len(index):seq.num_tokens -
    seq.num_pending])`` keeps it in step with an engine sequence. There is no rollback: tokens, once given, stay.
    A refused token (ValueError) leaves the index as it was.
    """

    __slots__ = ("_config", "_min_n", "_max_n", "_recent", "_tokens", "_maps", "_tail", "_stores", "_shifts")

    def __init__(self, config: NgramConfig, token_ids: Iterable[int] = ()) -> None:
        config.validate()
        self._config = config
        self._min_n, self._max_n = config.min_n, config.max_n
        self._recent = config.prefer == "recent"
        self._tokens: list[int] = []
        # _maps[n]: packed n-gram -> position of the token after its most recent / first occurrence (n < min_n: empty)
        self._maps: list[dict[int, int]] = [{} for _ in range(config.max_n + 1)]
        # _tail[n]: packed key of the last n tokens (meaningful once there are >= n tokens); _tail[0] stays 0
        self._tail: list[int] = [0] * (config.max_n + 1)
        # hoisted loops of _push_many: (n, _maps[n]) for the stored n; (n, n - 1) for the tail's update, longest first
        self._stores = tuple((n, self._maps[n]) for n in range(config.min_n, config.max_n + 1))
        self._shifts = tuple((n, n - 1) for n in range(config.max_n, 1, -1))
        self.extend(token_ids)

    @property
    def config(self) -> NgramConfig:
        return self._config

    @property
    def token_ids(self) -> list[int]:
        """The indexed tokens (a copy)."""
        return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def append(self, token_id: int) -> None:
        token = operator.index(token_id)
        if not 0 <= token < _TOKEN_LIMIT:
            raise _bad_token([token])
        self._push_many((token,))

    def extend(self, token_ids: Iterable[int]) -> None:
        new = _known_ids(token_ids).tolist()
        if len(new) < _SHORT_EXTEND:
            self._push_many(new)
        else:
            self._extend_bulk(new)

    def _push_many(self, new: Iterable[int]) -> None:
        # each token: the n-grams ending at the current last token get their follower, at position `pos`
        tokens, tail, stores, shifts = self._tokens, self._tail, self._stores, self._shifts
        recent = self._recent
        for token in new:
            pos = len(tokens)
            if recent:
                for n, positions in stores:
                    if n > pos:  # no n-gram ends there yet
                        break
                    positions[tail[n]] = pos
            else:
                for n, positions in stores:
                    if n > pos:
                        break
                    positions.setdefault(tail[n], pos)
            for n, m in shifts:
                tail[n] = (tail[m] << _TOKEN_BITS) | token
            tail[1] = token
            tokens.append(token)

    def _extend_bulk(self, new: list[int]) -> None:
        """``_push_many(new)``, with the keys built by list comprehensions and stored by ``dict.update``."""
        max_n, min_n = self._max_n, self._min_n
        old_len = len(self._tokens)
        self._tokens.extend(new)
        tokens, length = self._tokens, len(self._tokens)
        base = max(0, old_len - max_n)  # the old tokens an n-gram ending at a new follower's predecessor may start at
        seg = tokens[base:]
        keys = seg  # keys[j]: the packed n-gram starting at seg[j] (n = 1: the tokens themselves)
        for n in range(1, max_n + 1):
            if n > 1:
                keys = [(a << _TOKEN_BITS) | b for a, b in zip(keys, seg[n - 1:])]
            if not keys:
                break
            self._tail[n] = keys[-1]  # the n-gram ending at the new last token
            if n < min_n:
                continue
            # n-grams ending at e in [max(old_len - 1, n - 1), length - 2], each followed by the token at e + 1
            first_end = max(old_len - 1, n - 1)
            if first_end > length - 2:
                continue
            lo = first_end - (n - 1) - base  # index in keys of the n-gram ending at first_end
            chunk = keys[lo:lo + (length - 1 - first_end)]
            followers = range(first_end + 1, length)
            positions = self._maps[n]
            if self._recent:
                positions.update(zip(chunk, followers))
            else:
                first = dict(zip(reversed(chunk), reversed(followers)))  # duplicates: the earliest assigned last
                positions.update({key: pos for key, pos in first.items() if key not in positions})

    def propose(self, num_tokens: int | None = None) -> list[int]:
        """Up to ``num_tokens`` (default: the config's) proposed next tokens; ``[]`` without a match."""
        k = self._config.num_tokens if num_tokens is None else num_tokens
        if k < 0:
            raise ValueError(f"num_tokens must be >= 0, got {k}")
        tokens, tail, maps = self._tokens, self._tail, self._maps
        length = len(tokens)
        top = self._max_n if length > self._max_n else length - 1
        for n in range(top, self._min_n - 1, -1):
            pos = maps[n].get(tail[n])
            if pos is not None:
                return tokens[pos:pos + k]
        return []
