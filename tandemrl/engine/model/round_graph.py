"""A whole verify round of speculative decoding in one CUDA graph: the draft's proposals, the target's verify
forward, the acceptance and the launch's bookkeeping (round.py's ``one_round``) replayed as one launch.

Round by round the eager path launches each forward's graph plus ~100 small kernels, and the device idles between
them: 17-19 % of a run at batch 8 against 9 % in plain decoding (bench/RESULTS.md). Here a launch of R rounds is one
copy in, R replays and a copy of each round's results out. Greedy rows only: their acceptance draws no random
numbers (a benchmark's rule may, from the default generator, which graphs replay correctly), so every replay
computes what the eager round would. The batch is padded to its bucket with dead rows (no budget: they write only
the scratch block), the table to a power of two columns. The graphs are kept with the target's decode graphs and
dropped with them; one whose proposer's graphs were dropped since (a new pool, new weights) is captured again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.acceptance import acceptance_rule
from tandemrl.engine.model.cuda_graphs import DecodeGraphs, batch_bucket
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import copy_to_device
from tandemrl.engine.model.proposers import HOST, ProposerArgs, host_tokens
from tandemrl.engine.model.round import Launch, Round, launch_columns, one_round, round_inputs
from tandemrl.engine.model.slot import ModelSlot


@dataclass
class RoundGraph:
    """One captured round over a static padded launch (``packed``: its parts, as ``load`` writes them)."""

    graph: torch.cuda.CUDAGraph
    packed: Tensor
    launch: Launch
    out: tuple[Tensor, Tensor, Tensor, Tensor]  # tokens, log-probs, proposals accepted, tokens kept [bucket, ...]
    proposer_graphs: DecodeGraphs | None  # a model proposer's graphs when this was captured
    scratch_block: int
    k: int
    body: Callable[[], object]  # holds what the graph reads by address (the rows' columns, query groups) alive
    rows: int = 0  # the loaded launch's real rows

    def load(self, lengths: np.ndarray, budget: np.ndarray, cap: np.ndarray, bonus: np.ndarray,
             last_two: np.ndarray, table: np.ndarray, feed: Seq[Seq[int]] | None = None) -> None:
        """A launch's rows into the static tensors (one copy); the padding rows are dead: no budget, one token,
        the scratch block for a table. The table goes in as the round's forwards read it (``repeated_tables``);
        ``feed``: a host proposer's proposals per row."""
        bucket, width = self.launch.table.shape
        batch, used = table.shape
        padded = np.full((bucket, width), self.scratch_block, dtype=np.int64)
        padded[:batch, :used] = table
        columns = np.zeros((6, bucket), dtype=np.int64)  # length, left, cap, bonus, the last two tokens
        columns[0] = columns[3] = 1  # a dead row: one token, a bonus (no proposer row of it is live)
        columns[:4, :batch] = lengths, budget, cap, bonus
        columns[4:, :batch] = last_two.reshape(batch, 2).T
        proposals = host_tokens(feed or [], self.k, bucket)
        host = np.concatenate((launch_columns(*columns[:4], columns[4:].T, padded), np.repeat(padded, 2, 0).reshape(-1),
                               np.repeat(padded, self.k + 1, 0).reshape(-1), proposals.reshape(-1)))
        self.packed.copy_(copy_to_device(torch.from_numpy(host), self.packed.device))
        self.rows = batch

    def run(self) -> Round:
        """One round over the loaded launch (which it advances): what the launch's rows kept."""
        self.graph.replay()
        return Round(*(t[:self.rows].clone() for t in self.out))


def round_graph(context: LaunchContext, name: str, target: ModelSlot, k: int, batch: int, width: int,
                rule: str) -> RoundGraph | None:
    """The round graph for ``batch`` greedy rows of ``width`` table columns, ``k`` proposals of the proposer ``name``
    (a model slot, or ``host``) and the rule ``rule``, captured on first use; None where graphs do not apply (eager
    slots, the proposer on another device, a batch past the buckets)."""
    bucket = batch_bucket(batch)
    proposer = context.slots.get(name)
    model_off = proposer is not None and (proposer.enforce_eager or proposer.device != target.device)
    if target.enforce_eager or model_off or bucket is None or (proposer is None and name != HOST):
        return None
    graphs = target.decode_graphs()
    # a power of two, not the decode graphs' one width under Triton (every column up to max_model_len): each launch
    # copies the padded table k + 4 times over, so a few more captures cost less than megabytes a launch
    width = min(1 << max(0, width - 1).bit_length(), graphs.max_width)
    key = (bucket, width, k, name, rule)
    found = graphs.rounds.get(key)
    proposer_graphs = proposer.decode_graphs() if proposer is not None else None
    if isinstance(found, RoundGraph) and found.proposer_graphs is proposer_graphs:
        return found
    found = graphs.rounds[key] = _capture(context, name, target, graphs, k, bucket, width, rule, proposer_graphs)
    return found


def _capture(context: LaunchContext, name: str, target: ModelSlot, graphs: DecodeGraphs, k: int, bucket: int,
             width: int, rule: str, proposer_graphs: DecodeGraphs | None) -> RoundGraph:
    """Captured over a launch of dead rows: the warm-up run before the capture writes only the scratch block."""
    launch_size = bucket * (6 + width)
    packed = torch.zeros(launch_size + bucket * width * (k + 3) + bucket * k, dtype=torch.long, device=target.device)
    launch = Launch.packed(packed[:launch_size], bucket)
    twice, per_token, proposals = packed[launch_size:].split([2 * bucket * width, (k + 1) * bucket * width, bucket * k])
    launch.length.fill_(1)
    launch.bonus.fill_(1)
    packed[6 * bucket:launch_size + bucket * width * (k + 3)].fill_(graphs.scratch_block)  # every table
    args = ProposerArgs(context, None, k, None, (twice.view(2 * bucket, width), launch.table), True, eager=True,
                        host_tokens=proposals.view(bucket, k))
    inputs = round_inputs(context, target, name, args, per_token.view((k + 1) * bucket, width), acceptance_rule(rule))

    def body() -> tuple[Tensor, Tensor, Tensor, Tensor]:
        done = one_round(context, target, launch, inputs)
        return done.tokens, done.logprobs, done.accepted, done.emitted

    graph, out = graphs.capture(body)
    return RoundGraph(graph, packed, launch, out, proposer_graphs, graphs.scratch_block, k, body)
