"""A tandem burst: the schedule of forwards by which a hot and a frozen model write a batch of rows together.

With a selector that does not read the tokens (bernoulli, chunk, alternating) every position's writer is known
before anything is sampled, so the host plans a whole burst and the device runs it with no sync: a list of
*forwards*, each of one model over the rows whose next position it owns, reading every token it has not read yet
(the other model's run since its last turn, and its own last sample) and sampling the next. The model owning more
rows' next positions runs next, each row weighted by 1 + the forwards it has waited (simulated: about 1.6 forwards
per position for 64 rows at p = 0.5, 1.5 at p = 0.8, against 2 when both run at every position). With both models
on GPUs the burst runs in *paired ticks* instead: each tick a forward of both models at once, on two streams of one
GPU (a decode forward's short kernels leave most of it idle) or on two GPUs: 2 forwards per position, but a tick
costs little more than one.

A burst ends with a *catch-up* forward of each model over the tokens it has not read but the last, without
sampling: the loss needs the hot model's log-prob of every kept token, the next burst then starts like a plain
decode step, and a prefix-cache block always holds both models' K/V.

Coordinates: per row, token k is the burst's k-th new token; k = -1 is the row's last token before it, which
neither model has read. A row's buffer holds tokens -1, 0, 1, ...
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HOT, FROZEN = True, False


@dataclass
class BurstForward:
    """One forward of one model over the batch rows ``rows``, packed one entry per token read: ``row`` (batch row) and
    ``token`` (k) of each. ``sample``: False for a catch-up (its reads only score tokens already written)."""

    hot: bool
    rows: np.ndarray  # [R]
    counts: np.ndarray  # [R] tokens each row reads
    row: np.ndarray  # [N]
    token: np.ndarray  # [N]
    sample: bool = True
    beside: bool = False  # may run beside the forward before it (the other model's, over other rows): two streams

    @property
    def last(self) -> np.ndarray:
        """[R] index, among the tokens read, of each row's last one (its logits sample the next token)."""
        return np.cumsum(self.counts) - 1


@dataclass
class TandemBurst:
    forwards: list[BurstForward]
    num_tokens: np.ndarray  # [B] new tokens per row
    owners: list[list[bool]]  # per row, the writer of each new token (True = hot)

    @property
    def width(self) -> int:
        """Buffer columns per row: token -1, then the new ones."""
        return int(self.num_tokens.max()) + 1

    def column(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Flat buffer index of token k of each row."""
        return rows * self.width + tokens + 1


def plan_tandem_burst(owners: list[list[bool]], max_forwards: int, paired: bool = False) -> TandemBurst:
    """The burst for rows whose next positions belong to ``owners[i]`` (True = hot; a row moves at most that many
    positions): at most ``max_forwards`` forwards, one more of a model for rows that have not moved, then the
    catch-ups. ``paired``: in ticks instead, each a forward of both models over the rows each owns next: every row
    moves once per tick, and the two forwards of a tick may run at once (``beside``: on two streams of one GPU)."""
    if not owners or any(not o for o in owners):
        raise ValueError("a tandem burst needs at least one position per row")
    rows_n = len(owners)
    limit = np.array([len(o) for o in owners])
    table = np.zeros((rows_n, int(limit.max()) + 1), dtype=bool)
    for i, o in enumerate(owners):
        table[i, :len(o)] = o
    read = {HOT: np.full(rows_n, -1), FROZEN: np.full(rows_n, -1)}  # each model's first token not read yet
    position = np.zeros(rows_n, dtype=np.int64)
    waited = np.zeros(rows_n, dtype=np.int64)  # forwards since the row last moved
    everyone = np.arange(rows_n)
    forwards: list[BurstForward] = []

    def run(hot: bool, served: np.ndarray, beside: bool = False) -> None:
        forwards.append(_reading(hot, served, read[hot][served], position[served]))
        forwards[-1].beside = beside
        read[hot][served] = position[served]
        position[served] += 1
        waited[:] += 1
        waited[served] = 0

    for _ in range(max_forwards // 2 if paired else max_forwards):
        active = position < limit
        if not active.any():
            break
        next_hot = table[everyone, position]
        if paired:
            hot_rows, frozen_rows = np.flatnonzero(active & next_hot), np.flatnonzero(active & ~next_hot)
            if len(hot_rows):
                run(HOT, hot_rows)
            if len(frozen_rows):
                run(FROZEN, frozen_rows, beside=bool(len(hot_rows)))
            continue
        weight = (1 + waited) * active  # a row that waits gains weight: no row starves behind the majority
        hot = bool(weight[next_hot].sum() >= weight[~next_hot].sum())
        run(hot, np.flatnonzero(active & (next_hot == hot)))
    for model in (HOT, FROZEN):  # every row moves at least once
        stuck = np.flatnonzero((position == 0) & (table[:, 0] == model))
        if len(stuck):
            run(model, stuck)
    for model in (HOT, FROZEN):  # read every token but the last
        behind = np.flatnonzero(read[model] < position - 1)
        if len(behind):
            forwards.append(_reading(model, behind, read[model][behind], position[behind] - 1, sample=False))
    return TandemBurst(forwards, position, [o[:n] for o, n in zip(owners, position.tolist())])


def _reading(hot: bool, rows: np.ndarray, start: np.ndarray, stop: np.ndarray, sample: bool = True) -> BurstForward:
    """A forward over ``rows``, each reading its tokens ``start[i] .. stop[i] - 1``."""
    counts = stop - start
    row = np.repeat(rows, counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return BurstForward(hot, rows, counts, row, np.repeat(start, counts) + offsets, sample)
