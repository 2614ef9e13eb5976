"""Which rows of a mini-batch share a forward: micro-batches by token budget (first-fit decreasing) or by row count.

The loss does not depend on the grouping (its normalisers are the mini-batch's, see algo/losses.py), so rows may be
grouped for packing alone. A micro-batch keeps only its own columns (its longest prompt and longest completion).
Where a forward may run on padded rows (packed_support.py: sdpa/eager keep rows padded when the dense packed mask
would cost more), the budget bounds rows x that width, the positions such a forward computes: counting real tokens
alone let a micro-batch of many short rows compute two to three times the budget (issue 39's out-of-memory). Under
torchrun every rank must run as many forwards (FSDP gathers per forward, reduces per backward), so a rank that runs
out of micro-batches runs fillers: one of its rows with no loss weight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tandemrl.config import TrainConfig
from tandemrl.models.unwrap import unwrap_causal_lm
from tandemrl.train.batch import TrainBatch
from tandemrl.train.packed_support import always_packs


@dataclass(frozen=True)
class MicroBatchLimits:
    """``max_rows`` set: that many rows per micro-batch, in order; unset: rows packed up to ``max_tokens`` each,
    counted as rows x width (prompt + completion columns) when ``padded`` (a forward may run on padded rows)."""

    max_tokens: int
    max_rows: int | None = None
    padded: bool = False


def micro_batch_limits(cfg: TrainConfig, model: nn.Module) -> MicroBatchLimits:
    """The update's limits for ``model``: padding counts where its forwards may run on padded rows."""
    return MicroBatchLimits(max_tokens=cfg.max_tokens_per_micro_batch, max_rows=cfg.micro_batch_size,
                            padded=not always_packs(unwrap_causal_lm(model)))


@dataclass
class MicroBatch:
    rows: Tensor  # [b] long: the mini-batch rows in this micro-batch; empty for a filler
    batch: TrainBatch  # those rows (a filler: the first row with zero loss weight)

    @property
    def is_filler(self) -> bool:
        return self.rows.numel() == 0


@dataclass
class _Bin:
    rows: list[int]
    tokens: int = 0
    prompt: int = 0  # its longest prompt
    completion: int = 0  # its longest completion

    def cost_with(self, tokens: int, prompt: int, padded: bool) -> int:
        """Its tokens, or rows x width when ``padded``, with one more row of ``tokens`` (``prompt`` of them)."""
        if not padded:
            return self.tokens + tokens
        return (len(self.rows) + 1) * (max(self.prompt, prompt) + max(self.completion, tokens - prompt))

    def add(self, row: int, tokens: int, prompt: int) -> None:
        self.rows.append(row)
        self.tokens += tokens
        self.prompt, self.completion = max(self.prompt, prompt), max(self.completion, tokens - prompt)


def plan_micro_batches(lengths: list[int], limits: MicroBatchLimits,
                       prompt_lengths: list[int] | None = None) -> list[list[int]]:
    """Row indices of each micro-batch. By tokens: first-fit decreasing over ``lengths`` (prompt + completion
    tokens per row), each micro-batch at most ``max_tokens`` tokens, or with ``limits.padded`` at most ``max_tokens``
    rows x (longest prompt + longest completion) (``prompt_lengths``: each row's prompt tokens; None: 0); a longer
    row gets a micro-batch of its own."""
    if limits.max_rows is not None:
        return [list(range(s, min(s + limits.max_rows, len(lengths)))) for s in range(0, len(lengths), limits.max_rows)]
    prompts = prompt_lengths if prompt_lengths is not None else [0] * len(lengths)
    bins: list[_Bin] = []
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tokens, prompt = lengths[row], prompts[row]
        fit = next((b for b in bins if b.cost_with(tokens, prompt, limits.padded) <= limits.max_tokens), None)
        if fit is None:
            fit = _Bin(rows=[])
            bins.append(fit)
        fit.add(row, tokens, prompt)
    return [sorted(b.rows) for b in bins]


def micro_batches(
    batch: TrainBatch, limits: MicroBatchLimits, any_rank: Callable[[bool], bool] | None = None,
) -> Iterator[MicroBatch]:
    """The micro-batches of ``batch``, each narrowed to its own columns; with ``any_rank`` (torchrun: does any rank
    have one left?) fillers after this rank's last one until every rank is done."""
    lengths, prompts = batch.sequence_lengths().tolist(), batch.prompt_lengths().tolist()
    plan = plan_micro_batches(lengths, limits, prompts)
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
            picked = plan[index]
            rows = torch.tensor(picked, dtype=torch.long, device=device)
            narrowed = _narrowed(batch.rows(rows), [lengths[r] for r in picked], [prompts[r] for r in picked])
            yield MicroBatch(rows, narrowed)
        else:
            yield MicroBatch(torch.zeros(0, dtype=torch.long, device=device), _filler(batch, lengths[0], prompts[0]))
        index += 1


def _narrowed(batch: TrainBatch, lengths: list[int], prompts: list[int]) -> TrainBatch:
    """``batch`` without the columns that are padding in all its rows (a completion column stays, as in build_batch)."""
    completion = max(1, max(n - p for n, p in zip(lengths, prompts)))
    return batch.narrow(max(prompts), completion)


def _filler(batch: TrainBatch, length: int, prompt: int) -> TrainBatch:
    filler = _narrowed(batch.rows(slice(0, 1)), [length], [prompt])
    filler.loss_mask = torch.zeros_like(filler.loss_mask)
    return filler
