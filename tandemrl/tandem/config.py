"""The tandem section of the config, and the engine's tandem contract built from it (``TandemConfig.for_engine``).

How the engine runs tandem steps: docs/tandem.md and engine/tandem.py.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

from tandemrl.engine.tandem import OwnerStream, TandemRollouts
from tandemrl.tandem.boundaries import boundary_ids
from tandemrl.tandem.selectors import TandemSelectorConfig, make_stream

BOUNDARY_SELECTORS = ("sentence", "word")  # switch writers at boundary tokens (from the tokenizer)


@dataclass
class TandemConfig:
    """``p``: probability that a position (a chunk for ``chunk``) is the hot model's; ``frozen_model``: hub id or
    directory of the frozen model (None: a second copy of the starting model); ``frozen_token_weight``: the loss
    weight of frozen-written tokens (hot ones weigh 1.0); ``max_run_tokens``: frozen tokens proposed per step at most
    (sentence and word selectors); ``frozen_device``: where the frozen model lives (None: the hot model's device;
    else "cpu", "cuda" or "cuda:N": it computes there and only token ids cross); ``frozen_dtype``: the frozen
    model's dtype (None: ``model.dtype``; e.g. ``bfloat16`` beside a hot model trained in float32: half the memory and
    bandwidth, its caches in bfloat16 too)."""

    __pydantic_config__ = {"extra": "forbid"}

    enabled: bool = field(default=False, metadata={
        "description": "tandem rollouts: the trained model and a frozen one write each completion together"})
    frozen_model: str | None = field(default=None, metadata={
        "description": "hub id or directory of the frozen model; unset: a second copy of the starting model"})
    selector: Literal["bernoulli", "chunk", "alternating", "sentence", "word"] = field(default="bernoulli", metadata={
        "description": "whose token is kept where: `bernoulli` (each position is the hot model's with "
                       "probability `tandem.p`), `chunk` (chunks of `tandem.chunk_tokens`), `alternating`, "
                       "`sentence` / `word` (the writer of each sentence / word is drawn)"})
    p: float = field(default=0.5, metadata={
        "description": "probability that a position (a chunk, a sentence, a word) is the hot model's, in "
                       "[0, 1]"})
    chunk_tokens: int = field(default=8, metadata={"description": "`chunk`: tokens per chunk"})
    max_gap_tokens: int = field(default=32, metadata={
        "description": "`sentence` / `word`: a segment ends after this many tokens without a boundary token"})
    frozen_token_weight: float = field(default=0.2, metadata={
        "description": "loss weight of frozen-written tokens (hot ones weigh 1.0)"})
    max_run_tokens: int = field(default=4, metadata={
        "description": "`sentence` / `word`: frozen tokens proposed per engine step at most (the other selectors "
                       "run bursts of 2 x `engine.decode_steps` forwards)"})
    frozen_device: str | None = field(default=None, metadata={
        "description": "where the frozen model lives; unset: the hot model's device; else `cpu`, `cuda` or "
                       "`cuda:N` (it computes there and only token ids cross)"})
    frozen_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = field(default=None, metadata={
        "description": "the frozen model's dtype; unset: `model.dtype` (a CPU frozen model with `auto` loads in "
                       "float32); e.g. `bfloat16` beside a hot model trained in float32: half the memory and "
                       "bandwidth"})

    @property
    def drawn_ahead(self) -> bool:
        """Whether the writers do not depend on the tokens, so a whole burst can be planned ahead (tandem_burst.py)."""
        return self.selector not in BOUNDARY_SELECTORS

    def for_engine(self, tokenizer: Any) -> TandemRollouts:
        """What the engine needs (validated): each request's owner stream; the sentence and word selectors read their
        boundary tokens off ``tokenizer``."""
        self.validate()
        boundaries = None
        if self.selector in BOUNDARY_SELECTORS:
            if tokenizer is None:
                raise ValueError(f"tandem.selector {self.selector!r} needs a tokenizer (its boundary ids)")
            boundaries = boundary_ids(tokenizer, self.selector)
        return TandemRollouts(functools.partial(owner_stream, self, boundaries=boundaries), self.drawn_ahead,
                              self.max_run_tokens)

    def selector_config(self) -> TandemSelectorConfig:
        return TandemSelectorConfig(self.selector, self.p, self.chunk_tokens, self.max_gap_tokens)

    def validate(self) -> None:
        self.selector_config().validate()
        if not 0.0 <= self.frozen_token_weight:
            raise ValueError(f"tandem.frozen_token_weight must be >= 0, got {self.frozen_token_weight}")
        if isinstance(self.max_run_tokens, bool) or not isinstance(self.max_run_tokens, int) or self.max_run_tokens < 1:
            raise ValueError(f"tandem.max_run_tokens must be an integer >= 1, got {self.max_run_tokens!r}")
        if self.frozen_device is not None:
            check_device(self.frozen_device, "tandem.frozen_device")


def check_device(name: str, key: str) -> None:
    """ValueError naming ``key`` unless ``name`` is "cpu", "cuda" or "cuda:N" of a GPU this machine has."""
    import torch  # here: the config loads without torch until a device must be checked

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index):
        raise ValueError(f"{key} = {name!r}: expected 'cpu', 'cuda' or 'cuda:N'")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ValueError(f"{key} = {name!r}: this machine has {count} CUDA device(s)"
                             + ("" if count else "; use 'cpu' or leave it unset (the hot model's device)"))


def owner_stream(config: TandemConfig, request_id: str, seed: int | None,
                 boundaries: frozenset[int] | None = None) -> OwnerStream:
    """The request's owner stream: seeded by its sampling seed and id, so each sample of a group differs and a
    seeded run repeats. ``boundaries``: the tokenizer's boundary ids, for the sentence and word selectors."""
    return make_stream(config.selector_config(), zlib.crc32(f"{seed}:{request_id}".encode()), boundaries)
