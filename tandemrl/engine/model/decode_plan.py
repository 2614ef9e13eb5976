"""The host-side inputs of a decode burst: K steps for B sequences, computed at once with numpy.

Step j of row i feeds the token at position ``n_i - 1 + j`` (n_i: the sequence's tokens before the burst; for
j > 0 the token is the one sampled at step j - 1, known only on the device) and writes its K/V into that
position's slot. Row i runs ``steps[i]`` live steps; the burst runs ``max(steps)``, so a row's later steps are
dead: they repeat the row's last live position but write to the scratch slot (owned by no sequence), and
their samples are dropped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence as Seq

import numpy as np

from tandemrl.engine.sequence import Sequence


@dataclass
class DecodePlan:
    ids: np.ndarray  # [B] the last token of each sequence (step 0's input)
    positions: np.ndarray  # [K, B]
    slots: np.ndarray  # [K, B] flat KV slot written by each step (the scratch slot for dead steps)
    context_lens: np.ndarray  # [K, B] tokens attended to, the step's own included
    tables: np.ndarray  # [B, W] block ids covering every live position, padded with the scratch block
    steps: list[int]
    # [B], one-step plans whose rows are several tokens of one sequence side by side (verify, tandem): the
    # sequence of each row, so the attention reads a sequence's K/V once for all its rows (None: a row each)
    row_of: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return self.positions.shape[0]


def build_decode_plan(seqs: Seq[Sequence], steps: Seq[int], block_size: int, num_blocks: int,
                      max_model_len: int) -> DecodePlan:
    """The plan for ``seqs`` decoding ``steps[i]`` tokens each; ValueError (naming the sequence) for what would
    otherwise be an out-of-bounds access on the device. Block ``num_blocks`` is the scratch block."""
    n = int64_array([len(s.token_ids) for s in seqs])
    live_steps = int64_array(steps)
    last = n - 2 + live_steps  # the last position a row writes
    for i in np.flatnonzero((n < 1) | (live_steps < 1) | (last >= max_model_len)):
        raise ValueError(f"sequence {seqs[i].seq_id} has {n[i]} tokens and {live_steps[i]} decode steps: "
                         f"needs 1 <= tokens, 1 <= steps and tokens - 1 + steps <= max_model_len {max_model_len}")
    tables = block_tables(seqs, last, block_size, num_blocks)
    step = np.arange(int(live_steps.max()))[:, None]
    live = step < live_steps
    positions = np.minimum(n - 1 + step, last)  # a dead step repeats the row's last position (RoPE stays in range)
    block_index = positions // block_size
    blocks = tables[np.arange(len(seqs)), block_index]
    slots = np.where(live, blocks * block_size + (positions - block_index * block_size), num_blocks * block_size)
    context_lens = positions + 1
    ids = int64_array([s.token_ids[-1] for s in seqs])
    return DecodePlan(ids, positions, slots, context_lens, tables, list(steps))


def block_tables(seqs: Seq[Sequence], last: np.ndarray, block_size: int, num_blocks: int) -> np.ndarray:
    """[B, W] the block ids of each sequence up to the one holding position ``last[i]``, padded with the scratch
    block (id ``num_blocks``); ValueError naming a sequence with too few blocks or an id out of range."""
    widths = last // block_size + 1
    held = np.arange(int(widths.max())) < widths[:, None]
    tables = np.full(held.shape, num_blocks, dtype=np.int64)  # the scratch block pads every row
    concatenated: list[int] = []
    for seq, width in zip(seqs, widths.tolist()):
        table = seq.block_table
        concatenated += table if len(table) == width else table[:width]  # usually exact: no copy
    flat = int64_array(concatenated)
    if len(flat) != int(widths.sum()) or ((flat < 0) | (flat >= num_blocks)).any():  # find the culprit
        for seq, width, pos in zip(seqs, widths.tolist(), last.tolist()):
            if len(seq.block_table) < width:  # the steps of a decode writing up to ``pos`` (a prefill: 1)
                raise ValueError(f"sequence {seq.seq_id} has {seq.num_tokens} tokens and {pos - seq.num_tokens + 2} "
                                 f"decode steps but only {len(seq.block_table)} blocks of {block_size}")
            if any(not 0 <= b < num_blocks for b in seq.block_table[:width]):
                raise ValueError(f"sequence {seq.seq_id} has block ids outside [0, {num_blocks}): {seq.block_table}")
    tables[held] = flat
    return tables


def int64_array(values: Seq[int]) -> np.ndarray:
    """``np.array(values, dtype=np.int64)`` for Python ints, about twice as fast: struct converts them in C without
    numpy's per-element type dispatch (this runs on every block id of every decode burst)."""
    out = np.empty(len(values), dtype=np.int64)
    struct.pack_into(f"{len(values)}q", out, 0, *values)
    return out
