"""Tandem-rollout selectors: who writes each completion position, the hot (trainable) or the frozen model.

The engine reads a selector through its per-sequence owner stream only (``OwnerStream``, engine/tandem.py); the
selectors themselves are policy and live here, above the engine.

A *selector* is a per-run spec (``bernoulli(p)``, ``chunk(k, p)``, ``alternating()``, ``sentence(...)``,
``word(...)``); ``selector.stream(seed)`` makes one per-sequence :class:`OwnerStream` with its own
``random.Random(seed)``, so a rollout is reproducible from its request seed.

How the engine uses a stream (speculative decoding with a fixed acceptance rule):

1. ``next_segment(limit) -> (r, hot_follows)`` PEEKS: the next ``r`` positions are the frozen model's (it proposes
   them), then, if ``hot_follows``, one hot position (the hot model samples it from the same forward that ingests
   the ``r`` frozen tokens). Peeking draws into a buffer but never moves the stream, so a failed step can be retried
   and every later call answers the same.
2. For content-dependent selectors (sentence / word) the peeked ``r`` assumes no boundary token occurs in the
   frozen run (it stops only at the segment cap / ``limit``). Once the frozen tokens are known the engine calls
   ``resolve(frozen_tokens) -> (n, hot_next)`` (also a pure peek): the first ``n`` of them are really frozen-owned,
   and ``hot_next`` says whether position ``n`` is hot. For content-independent selectors ``resolve`` simply agrees
   with ``next_segment``.
3. ``advance(tokens, owners)`` consumes the positions the step kept, given the kept tokens and who wrote each
   (True = hot). It checks ``owners`` against the stream (a mismatch is an engine bug: ValueError, stream unchanged).

``state_dict()`` / ``load_state_dict()`` capture everything (position, RNG state, buffered draws, segment state),
so a checkpointed stream resumes exactly.

Randomness contract (tests replay it): every draw is ``rng.random() < p`` (True = hot). Bernoulli draws once per
position, chunk once per chunk of ``k`` positions (chunks aligned to multiples of ``k``), sentence / word once per
segment (the first segment included). p = 1 therefore always gives hot and p = 0 always frozen.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence

from tandemrl.engine.tandem import OwnerStream

SelectorName = Literal["bernoulli", "chunk", "alternating", "sentence", "word"]
SELECTOR_NAMES: tuple[str, ...] = ("bernoulli", "chunk", "alternating", "sentence", "word")


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or limit < 0:
        raise ValueError(f"next_segment limit must be an integer >= 0, got {limit!r}")


def _check_lengths(tokens: Sequence[int], owners: Sequence[bool]) -> None:
    if len(tokens) != len(owners):
        raise ValueError(f"advance: {len(tokens)} tokens but {len(owners)} owners")


def _rng_state(rng: random.Random) -> list[Any]:
    """RNG state as plain lists (serialisable by json / torch.save alike)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _load_common(stream: Any, state: dict[str, Any]) -> int:
    """Check that ``state`` belongs to a stream of this kind and parameters, restore its RNG; its position."""
    if state.get("kind") != stream.kind or state.get("params") != stream._params():
        raise ValueError(f"state is for selector {state.get('kind')!r} {state.get('params')!r}, "
                         f"this stream is {stream.kind!r} {stream._params()!r}")
    _set_rng_state(stream._rng, state["rng_state"])
    return int(state["position"])


def _set_rng_state(rng: random.Random, state: Sequence[Any]) -> None:
    version, internal, gauss = state
    rng.setstate((int(version), tuple(int(x) for x in internal), gauss))


# -------------------------------------------------------------------------------- content-independent streams

class _LookaheadStream:
    """Owners that do not depend on the tokens: produced in order into a buffer and popped by ``advance``.

    Owner i is a fixed function of the seed and i, so peeking any distance ahead (which only extends the buffer)
    cannot change what any later call sees.
    """

    kind: str = ""

    def __init__(self, seed: int | None) -> None:
        self._rng = random.Random(seed)
        self._position = 0
        self._buffer: list[bool] = []  # owners of positions position, position+1, ...

    # subclasses produce the owners of positions [generated, generated + m) for some m >= 1
    def _produce(self, generated: int) -> list[bool]:
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {}

    @property
    def position(self) -> int:
        return self._position

    def _owner_at(self, offset: int) -> bool:
        """Owner of position ``position + offset``, drawing into the buffer as needed."""
        while len(self._buffer) <= offset:
            self._buffer.extend(self._produce(self._position + len(self._buffer)))
        return self._buffer[offset]

    def peek(self, n: int) -> list[bool]:
        """Owners of the next ``n`` positions (True = hot), without moving the stream."""
        if n:  # one slice, not a call per position: a tandem burst peeks ~100 positions per row
            self._owner_at(n - 1)
        return self._buffer[:n]

    def next_segment(self, limit: int) -> tuple[int, bool]:
        _check_limit(limit)
        r = 0
        while r < limit:
            if self._owner_at(r):
                return r, True
            r += 1
        return r, False

    def resolve(self, frozen_tokens: Sequence[int]) -> tuple[int, bool]:
        n = 0
        while n < len(frozen_tokens) and not self._owner_at(n):
            n += 1
        return n, self._owner_at(n)

    def advance(self, tokens: Sequence[int], owners: Sequence[bool]) -> None:
        _check_lengths(tokens, owners)
        expected = self.peek(len(owners))
        if [bool(o) for o in owners] != expected:
            i = next(i for i, (owner, own) in enumerate(zip(owners, expected)) if bool(owner) != own)
            raise ValueError(f"{self.kind} stream: position {self._position + i} belongs to "
                             f"{'hot' if expected[i] else 'frozen'}, advance says {'hot' if owners[i] else 'frozen'}")
        del self._buffer[:len(owners)]
        self._position += len(owners)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": self._params(), "position": self._position,
                "rng_state": _rng_state(self._rng), "buffer": list(self._buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._position = _load_common(self, state)
        self._buffer = [bool(b) for b in state["buffer"]]


class BernoulliStream(_LookaheadStream):
    """Each position independently hot with probability p (one ``rng.random()`` per position)."""

    kind = "bernoulli"

    def __init__(self, p: float, seed: int | None) -> None:
        super().__init__(seed)
        self.p = p

    def _params(self) -> dict[str, Any]:
        return {"p": self.p}

    def _produce(self, generated: int) -> list[bool]:
        return [self._rng.random() < self.p]


class ChunkStream(_LookaheadStream):
    """Positions in chunks of k (starting at multiples of k); one hot-with-probability-p draw per chunk."""

    kind = "chunk"

    def __init__(self, k: int, p: float, seed: int | None) -> None:
        super().__init__(seed)
        self.k, self.p = k, p

    def _params(self) -> dict[str, Any]:
        return {"k": self.k, "p": self.p}

    def _produce(self, generated: int) -> list[bool]:
        # the buffer always ends on a chunk boundary (it is only ever extended by whole chunks)
        assert generated % self.k == 0
        return [self._rng.random() < self.p] * self.k


class AlternatingStream(_LookaheadStream):
    """hot, frozen, hot, frozen, ... (even positions hot); no randomness, the seed is unused."""

    kind = "alternating"

    def _produce(self, generated: int) -> list[bool]:
        return [generated % 2 == 0]


# ---------------------------------------------------------------------------------- content-dependent streams

class BoundaryStream:
    """Sentence / word segments: a writer keeps writing until it writes a boundary token or its segment reaches
    ``max_gap_tokens`` tokens; then the next segment's writer is drawn (hot with probability p).

    Segment writers are the draws 0, 1, 2, ... in segment order, whatever the segments' lengths, so the draws
    can be buffered ahead and peeking (which may look at segment writers beyond the current one) never changes
    them. A segment always has >= 1 token; the boundary token belongs to the segment that wrote it. A new segment
    may be drawn with the same writer as the old one (the run of that writer simply continues).
    """

    def __init__(self, kind: str, p: float, boundary_ids: Iterable[int], max_gap_tokens: int,
                 seed: int | None) -> None:
        self.kind, self.p, self.max_gap_tokens = kind, p, max_gap_tokens
        self.boundary_ids = frozenset(int(i) for i in boundary_ids)
        self._rng = random.Random(seed)
        self._position = 0
        self._draws: list[bool] = []  # writers of the segments after the current one, drawn ahead
        self._writer = self._rng.random() < p  # the first segment's writer is drawn too
        self._seg_len = 0  # tokens already in the current segment

    def _params(self) -> dict[str, Any]:
        return {"p": self.p, "max_gap_tokens": self.max_gap_tokens, "num_boundary_ids": len(self.boundary_ids)}

    @property
    def position(self) -> int:
        return self._position

    @property
    def writer_is_hot(self) -> bool:
        """Writer of the current position (the current segment's writer)."""
        return self._writer

    def _draw(self, k: int) -> bool:
        """Writer of the k-th segment after the current one (0-based), buffered."""
        while len(self._draws) <= k:
            self._draws.append(self._rng.random() < self.p)
        return self._draws[k]

    def _walk(self, tokens: Sequence[int]) -> tuple[bool, int, int, list[bool]]:
        """Segment state after writing ``tokens`` from the current state, pure: (writer, seg_len, draws used,
        writer of each token)."""
        writer, seg_len, used = self._writer, self._seg_len, 0
        owners = []
        for tok in tokens:
            owners.append(writer)
            seg_len += 1
            if int(tok) in self.boundary_ids or seg_len >= self.max_gap_tokens:
                writer, seg_len, used = self._draw(used), 0, used + 1
        return writer, seg_len, used, owners

    def next_segment(self, limit: int) -> tuple[int, bool]:
        """A hot writer: (0, True). A frozen writer: its segment's remaining cap (clipped to ``limit``), assuming no
        boundary inside; ``hot_follows`` iff the cap ends inside the limit and the next segment's draw is hot.

        ``r`` never exceeds the current segment's remaining cap (a capped frozen segment followed by a frozen draw
        is returned as ``(r, False)``; the next call continues the run). The run really ends at the first boundary
        after which a hot writer is drawn: the engine learns that from ``resolve`` once the frozen tokens exist.
        """
        _check_limit(limit)
        if limit == 0:
            return 0, False
        if self._writer:
            return 0, True
        remaining = self.max_gap_tokens - self._seg_len
        if remaining >= limit:
            return limit, False
        return remaining, self._draw(0)

    def resolve(self, frozen_tokens: Sequence[int]) -> tuple[int, bool]:
        """Walk the proposed frozen tokens with their boundaries: the first n stay frozen, position n is hot iff
        ``hot_next`` (n < len(frozen_tokens) implies hot_next)."""
        writer, seg_len, used = self._writer, self._seg_len, 0
        for n, tok in enumerate(frozen_tokens):
            if writer:
                return n, True
            seg_len += 1
            if int(tok) in self.boundary_ids or seg_len >= self.max_gap_tokens:
                writer, seg_len, used = self._draw(used), 0, used + 1
        return len(frozen_tokens), writer

    def advance(self, tokens: Sequence[int], owners: Sequence[bool]) -> None:
        _check_lengths(tokens, owners)
        writer, seg_len, used, expected = self._walk(tokens)
        for i, (owner, want) in enumerate(zip(owners, expected)):
            if bool(owner) != want:
                raise ValueError(f"{self.kind} stream: position {self._position + i} belongs to "
                                 f"{'hot' if want else 'frozen'}, advance says {'hot' if owner else 'frozen'}")
        self._writer, self._seg_len = writer, seg_len
        del self._draws[:used]
        self._position += len(tokens)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": self._params(), "position": self._position,
                "rng_state": _rng_state(self._rng), "draws": list(self._draws),
                "writer": self._writer, "seg_len": self._seg_len}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._position = _load_common(self, state)
        self._draws = [bool(b) for b in state["draws"]]
        self._writer = bool(state["writer"])
        self._seg_len = int(state["seg_len"])


# ------------------------------------------------------------------------------------------------ selector specs

def _check_p(p: float, name: str = "p") -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {p!r}")


def _check_pos_int(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class Bernoulli:
    p: float

    def __post_init__(self) -> None:
        _check_p(self.p)

    def stream(self, seed: int | None) -> BernoulliStream:
        return BernoulliStream(self.p, seed)


@dataclass(frozen=True)
class Chunk:
    k: int
    p: float

    def __post_init__(self) -> None:
        _check_pos_int(self.k, "k")
        _check_p(self.p)

    def stream(self, seed: int | None) -> ChunkStream:
        return ChunkStream(self.k, self.p, seed)


@dataclass(frozen=True)
class Alternating:
    def stream(self, seed: int | None = None) -> AlternatingStream:
        return AlternatingStream(seed)


@dataclass(frozen=True)
class Boundary:
    kind: str  # "sentence" or "word": only the boundary ids differ
    p: float
    boundary_ids: frozenset[int]
    max_gap_tokens: int

    def __post_init__(self) -> None:
        _check_p(self.p)
        _check_pos_int(self.max_gap_tokens, "max_gap_tokens")

    def stream(self, seed: int | None) -> BoundaryStream:
        return BoundaryStream(self.kind, self.p, self.boundary_ids, self.max_gap_tokens, seed)


Selector = Bernoulli | Chunk | Alternating | Boundary


def bernoulli(p: float) -> Bernoulli:
    """Each position independently hot with probability p."""
    return Bernoulli(p)


def chunk(k: int, p: float) -> Chunk:
    """Chunks of k positions, each chunk hot with probability p."""
    return Chunk(k, p)


def alternating() -> Alternating:
    """hot, frozen, hot, ... per token, first position hot."""
    return Alternating()


def sentence(p: float, boundary_ids: Iterable[int], max_gap_tokens: int = 32) -> Boundary:
    """Segments end after a sentence-ending token (see ``boundary_ids(tok, "sentence")``) or at the cap."""
    return Boundary("sentence", p, frozenset(boundary_ids), max_gap_tokens)


def word(p: float, boundary_ids: Iterable[int], max_gap_tokens: int = 32) -> Boundary:
    """Segments end after a word-boundary token (see ``boundary_ids(tok, "word")``) or at the cap."""
    return Boundary("word", p, frozenset(boundary_ids), max_gap_tokens)


# ------------------------------------------------------------------------------------------------------ config

@dataclass
class TandemSelectorConfig:
    """Which selector a tandem rollout uses. ``p`` = probability of the HOT writer (unused by alternating);
    ``chunk_tokens`` is used by chunk only, ``max_gap_tokens`` (segment cap) by sentence / word only.
    The default is the paper's: word-level, cap 32."""

    selector: SelectorName = "word"
    p: float = 0.5
    chunk_tokens: int = 8
    max_gap_tokens: int = 32

    def validate(self) -> None:
        if self.selector not in SELECTOR_NAMES:
            raise ValueError(f"TandemSelectorConfig.selector must be one of {SELECTOR_NAMES}, got {self.selector!r}")
        _check_p(self.p, "TandemSelectorConfig.p")
        _check_pos_int(self.chunk_tokens, "TandemSelectorConfig.chunk_tokens")
        _check_pos_int(self.max_gap_tokens, "TandemSelectorConfig.max_gap_tokens")


def make_selector(config: TandemSelectorConfig, boundary_ids: Iterable[int] | None = None) -> Selector:
    """The selector spec for ``config`` (validated). sentence / word need ``boundary_ids``."""
    config.validate()
    if config.selector == "bernoulli":
        return bernoulli(config.p)
    if config.selector == "chunk":
        return chunk(config.chunk_tokens, config.p)
    if config.selector == "alternating":
        return alternating()
    if boundary_ids is None:
        raise ValueError(f"selector {config.selector!r} needs boundary_ids: pass "
                         f"boundary_ids(tokenizer, {config.selector!r})")
    make = sentence if config.selector == "sentence" else word
    return make(config.p, boundary_ids, config.max_gap_tokens)


def make_stream(config: TandemSelectorConfig, seed: int | None,
                boundary_ids: Iterable[int] | None = None) -> OwnerStream:
    """A fresh per-sequence owner stream for ``config``, seeded with ``seed``."""
    return make_selector(config, boundary_ids).stream(seed)
