"""Which rows of a mini-batch share a forward: micro-batches by token budget (first-fit decreasing) or by row count.

The loss does not depend on the grouping (its normalisers are the mini-batch's, see algo/losses.py), so rows may be
grouped for packing alone. Under torchrun every rank must run as many forwards (FSDP gathers per forward, reduces
per backward), so a rank that runs out of micro-batches runs fillers: one of its rows with no loss weight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.config import TrainConfig
from tandemrl.train.batch import TrainBatch


@dataclass(frozen=True)
class MicroBatchLimits:
    """``max_rows`` set: that many rows per micro-batch, in order; unset: rows packed up to ``max_tokens`` each."""

    max_tokens: int
    max_rows: int | None = None


def micro_batch_limits(cfg: TrainConfig) -> MicroBatchLimits:
    return MicroBatchLimits(max_tokens=cfg.max_tokens_per_micro_batch, max_rows=cfg.micro_batch_size)


@dataclass
class MicroBatch:
    rows: Tensor  # [b] long: the mini-batch rows in this micro-batch; empty for a filler
    batch: TrainBatch  # those rows (a filler: the first row with zero loss weight)

    @property
    def is_filler(self) -> bool:
        return self.rows.numel() == 0


def plan_micro_batches(lengths: list[int], limits: MicroBatchLimits) -> list[list[int]]:
    """Row indices of each micro-batch. By tokens: first-fit decreasing over ``lengths`` (prompt + completion
    tokens per row), each micro-batch at most ``max_tokens`` tokens; a longer row gets a micro-batch of its own."""
    if limits.max_rows is not None:
        return [list(range(s, min(s + limits.max_rows, len(lengths)))) for s in range(0, len(lengths), limits.max_rows)]
    bins: list[list[int]] = []
    room: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fit = next((b for b, free in enumerate(room) if free >= lengths[row]), None)
        if fit is None:
            bins.append([row])
            room.append(limits.max_tokens - lengths[row])
        else:
            bins[fit].append(row)
            room[fit] -= lengths[row]
    return [sorted(b) for b in bins]


def micro_batches(
    batch: TrainBatch, limits: MicroBatchLimits, any_rank: Callable[[bool], bool] | None = None,
) -> Iterator[MicroBatch]:
    """The micro-batches of ``batch``; with ``any_rank`` (torchrun: does any rank have one left?) fillers after
    this rank's last one until every rank is done."""
    plan = plan_micro_batches(batch.sequence_lengths().tolist(), limits)
    device = batch.input_ids.device
    index = 0
    while True:
        more = index < len(plan)
        if any_rank is not None:
            if not any_rank(more):
                return
        elif not more:
            return
        if more:
            rows = torch.tensor(plan[index], dtype=torch.long, device=device)
            yield MicroBatch(rows, batch.rows(rows))
        else:
            yield MicroBatch(torch.zeros(0, dtype=torch.long, device=device), _filler(batch))
        index += 1


def _filler(batch: TrainBatch) -> TrainBatch:
    filler = batch.rows(slice(0, 1))
    filler.loss_mask = torch.zeros_like(filler.loss_mask)
    return filler
