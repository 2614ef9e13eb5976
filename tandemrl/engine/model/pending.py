"""What lets the model runner launch a step without waiting for the device (asynchronous scheduling, engine.py):
its tokens copied to pinned host memory behind its kernels (``PendingTokens``), and a sequence's last token, still
pending, fed from the previous launch on the device (``link_pending`` / ``resolve_pending``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.sequence import Sequence
from tandemrl.engine.step import StepOutput


class PendingTokens:
    """[B, K] tokens and log-probs of a launched step on their way to the host: row i keeps its first ``steps[i]``,
    or ``kept[i]`` when that is given (a verify step: known on the device only). ``accepted``: proposals kept, [B]
    or [B, R] (R <= K verify rounds)."""

    def __init__(self, tokens: Tensor, logprobs: Tensor, steps: Seq[int], accepted: Tensor | None = None,
                 kept: Tensor | None = None, own: tuple[Tensor, Tensor] | None = None) -> None:
        planes = {"tokens": tokens, "logprobs": logprobs}  # one [B, K] float64 plane each: it holds every id exactly
        if accepted is not None:
            accepted = accepted.view(len(tokens), -1)
            self._rounds = accepted.shape[1]
            planes["accepted"] = torch.nn.functional.pad(accepted, (0, tokens.shape[1] - self._rounds))
        if kept is not None:
            planes["kept"] = kept[:, None].expand_as(tokens)
        if own is not None:  # tandem: [B, K] samples of the target at every position, and their log-probs
            planes["own_ids"], planes["own_logprobs"] = own
        self._planes = list(planes)
        packed = torch.stack([plane.double() for plane in planes.values()])
        self._copied: torch.cuda.Event | None = None
        if packed.device.type == "cuda":
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        else:
            self._host = packed
        self.steps = list(steps)

    def result(self) -> StepOutput:
        """Per row: its tokens and their log-probs (waits for the device to get there)."""
        if self._copied is not None:
            self._copied.synchronize()
        host = dict(zip(self._planes, self._host))
        counts = host["kept"][:, 0].long().tolist() if "kept" in host else self.steps
        token_rows, logprob_rows = host["tokens"].long().tolist(), host["logprobs"].tolist()
        out = StepOutput([row[:k] for row, k in zip(token_rows, counts)],
                         [row[:k] for row, k in zip(logprob_rows, counts)])
        if "accepted" in host:
            out.num_accepted = host["accepted"][:, :self._rounds].long().tolist()
        if "own_ids" in host:
            out.own_ids, out.own_logprobs = host["own_ids"].long().tolist(), host["own_logprobs"].tolist()
        return out


@dataclass
class LastSamples:
    """The runner's latest launch: its tokens, flat on the device, and where each sequence's last one is."""

    tokens: Tensor
    index: dict[int, int]  # seq_id -> flat index of the sequence's last live token

    @classmethod
    def of(cls, seqs: Seq[Sequence], steps: Seq[int], tokens: Tensor) -> LastSamples:
        width = tokens.shape[1]
        return cls(tokens.reshape(-1), {s.seq_id: i * width + k - 1 for i, (s, k) in enumerate(zip(seqs, steps))})


def link_pending(ids: np.ndarray, seqs: Seq[Sequence], last: LastSamples | None) -> bool:
    """Stage row i's input id as the reference ``-1 - j`` when sequence i's last token is pending at flat index j of
    ``last``; returns whether any row is. RuntimeError if a pending token is not in ``last`` (only the previous
    launch can still be in flight)."""
    linked = False
    for i, seq in enumerate(seqs):
        if seq.num_pending:
            j = last.index.get(seq.seq_id) if last is not None else None
            if j is None:
                raise RuntimeError(f"sequence {seq.seq_id} waits for {seq.num_pending} tokens the previous launch "
                                   f"did not sample")
            ids[i] = -1 - j
            linked = True
    return linked


def resolve_pending(ids: Tensor, last: LastSamples) -> Tensor:
    """``ids`` with every reference ``-1 - j`` replaced by ``last.tokens[j]``, on the device: no host sync."""
    return torch.where(ids < 0, last.tokens[(-1 - ids).clamp(min=0)].to(ids.dtype), ids)


def copy_to_device(host: Tensor, device: torch.device) -> Tensor:
    """``host.to(device)`` without waiting for the work in flight: through pinned memory on CUDA (from pageable
    memory CUDA may make the copy wait for the whole step in flight, which would undo the overlap)."""
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
