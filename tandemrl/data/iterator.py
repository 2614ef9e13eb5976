"""Batches of prompts, shuffled per epoch, with exact resume through state_dict / load_state_dict."""

from __future__ import annotations

import json
import random
import zlib
from typing import Any

from tandemrl.types import Sample


class PromptIterator:
    """Endless batches of ``batch_size`` distinct samples.

    Each epoch is a permutation drawn from (seed, epoch) (or the original order when ``shuffle`` is False). An
    epoch yields ``len(samples) // batch_size`` batches; the leftover samples of an epoch are skipped, and since
    every epoch has a new order, no sample is skipped for good. ``epoch`` is the (0-based) epoch of the batch
    last returned.
    """

    def __init__(self, samples: list[Sample], batch_size: int, seed: int, shuffle: bool = True) -> None:
        if not samples:
            raise ValueError("PromptIterator needs at least one sample, got an empty list")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_size > len(samples):
            raise ValueError(f"batch_size={batch_size} is larger than the number of samples ({len(samples)})")
        self.samples = samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self._epoch = 0
        self._position = 0  # index into the epoch's order of the next sample to serve
        self._batches_served = 0
        self._order = self._epoch_order(0)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def batches_per_epoch(self) -> int:
        return len(self.samples) // self.batch_size

    @property
    def epoch_complete(self) -> bool:
        """True when the batch last returned was the last of its epoch (the next one starts a new epoch)."""
        return self._batches_served > 0 and self._position + self.batch_size > len(self.samples)

    @property
    def batches_served(self) -> int:
        return self._batches_served

    @property
    def progress(self) -> float:
        """Passes over the samples so far, where the next batch starts (1.5: half way through the second epoch)."""
        return epoch_progress(self._epoch, self._position, self.batch_size, len(self.samples))

    def next_batch(self) -> list[Sample]:
        if self._position + self.batch_size > len(self.samples):
            self._epoch += 1
            self._position = 0
            self._order = self._epoch_order(self._epoch)
        idx = self._order[self._position : self._position + self.batch_size]
        self._position += self.batch_size
        self._batches_served += 1
        return [self.samples[i] for i in idx]

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(f"tandemrl-prompts:{self.seed}:{epoch}").shuffle(order)
        return order

    def _fingerprint(self) -> int:
        crc = 0
        for s in self.samples:
            text = s.prompt if isinstance(s.prompt, str) else json.dumps(s.prompt, sort_keys=True)  # chat messages
            crc = zlib.crc32(text.encode("utf-8", "replace") + b"\0", crc)
        return crc

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "position": self._position,
            "batches_served": self._batches_served,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "num_samples": len(self.samples),
            "fingerprint": self._fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved position. The samples, batch size, seed and shuffle flag must be the saved ones."""
        missing = [k for k in ("epoch", "position") if k not in state]
        if missing:
            raise ValueError(f"invalid prompt iterator state: missing {', '.join(missing)} (got keys {sorted(state)})")
        mine = self.state_dict()
        for key in ("num_samples", "batch_size", "seed", "shuffle", "fingerprint"):
            if key in state and state[key] != mine[key]:
                what = "the prompts differ" if key == "fingerprint" else f"saved {state[key]!r}, now {mine[key]!r}"
                raise ValueError(
                    f"cannot resume the prompt iterator: {key} does not match ({what}); "
                    "resume with the same data, batch size and seed"
                )
        if not 0 <= state["position"] <= len(self.samples) or state["epoch"] < 0:
            raise ValueError(f"invalid prompt iterator state: epoch={state['epoch']}, position={state['position']}")
        self._epoch = int(state["epoch"])
        self._position = int(state["position"])
        self._batches_served = int(state.get("batches_served", 0))
        self._order = self._epoch_order(self._epoch)


def epoch_progress(epoch: int, position: int, batch_size: int, num_samples: int) -> float:
    """``PromptIterator.progress`` from the numbers its ``state_dict`` saves: the epoch plus the share of its
    batches served; a finished epoch counts whole (the next batch starts the following one)."""
    batches = num_samples // batch_size
    if position + batch_size > num_samples:
        return float(epoch + 1)
    return epoch + (position // batch_size) / batches
