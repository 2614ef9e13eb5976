"""One verify round (rounds.py's steps 1-4) as device work only: the launch's lengths, budgets and last tokens are
advanced in place. rounds.py runs a launch's rounds back to back; round_graph.py captures one whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.acceptance import AcceptanceRule, Verdict
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import copy_to_device
from tandemrl.engine.model.proposers import Proposer, ProposerArgs, make_proposer
from tandemrl.engine.model.rejection import RejectionResult
from tandemrl.engine.model.slot import ModelSlot


@dataclass
class Launch:
    """A launch's rows on the device, which every round advances in place: tokens so far, tokens left in the
    budget, the last position each may write, whether its round ends with a target token (``bonus``), its last two
    tokens [B, 2] and its block table [B, W]."""

    length: Tensor
    left: Tensor
    cap: Tensor
    bonus: Tensor
    last_two: Tensor
    table: Tensor

    @classmethod
    def packed(cls, flat: Tensor, batch: int) -> Launch:
        """The parts of ``flat`` as ``launch_columns`` lays them out."""
        length, left, cap, bonus, last_two, table = flat.split([batch] * 4 + [2 * batch, len(flat) - 6 * batch])
        return cls(length, left, cap, bonus, last_two.view(batch, 2), table.view(batch, -1))


def launch_columns(lengths: np.ndarray, budget: np.ndarray, cap: np.ndarray, bonus: np.ndarray,
                   last_two: np.ndarray, table: np.ndarray) -> np.ndarray:
    """A launch's rows as one flat int64 array (one copy to the device)."""
    return np.concatenate((lengths, budget, cap, bonus, last_two.reshape(-1), table.reshape(-1)))


@dataclass
class RoundRows:
    """Every forward row of one round, on the device: the proposer's first forward (2 rows a sequence) and its
    ``k - 1`` proposal steps (1 row each), if it runs forwards, then the target's verify forward (``k + 1`` rows)."""

    seq: Tensor  # [N] the row's sequence
    offset: Tensor  # [N] its position relative to the sequence's last token
    need: Tensor  # [N] the row is live while ``need < left`` (+ 1 for a proposer row whose round has no bonus)
    proposing: Tensor  # [N] 1 for a proposer's row
    sizes: list[int]  # rows of each forward, in order
    k: int

    @classmethod
    def build(cls, k: int, batch: int, device: torch.device, proposer_forwards: bool = True) -> RoundRows:
        rows = np.arange(batch)
        parts = []
        if proposer_forwards:
            first = (np.repeat(rows, 2), np.tile([-1, 0], batch), np.zeros(2 * batch, np.int64), np.ones(2 * batch))
            parts.append(first)
            parts += [(rows, np.full(batch, j), np.full(batch, j + 1), np.ones(batch)) for j in range(1, k)]
        offsets = np.tile(np.arange(k + 1), batch)
        parts.append((np.repeat(rows, k + 1), offsets, offsets, np.zeros(len(offsets))))  # reads proposal ``offset``
        columns = np.stack([np.concatenate(column) for column in zip(*parts)])
        seq, offset, need, proposing = copy_to_device(torch.from_numpy(columns.astype(np.int64)), device)
        return cls(seq, offset, need, proposing, [len(p[0]) for p in parts], k)

    def columns(self, launch: Launch, block_size: int, scratch_slot: int) -> list[Tensor]:
        """Per forward, [3, rows]: positions, KV slots and context lengths. A dead row writes to the scratch slot at
        a position its sequence has a block for (its last, at most ``cap``: RoPE and the attention stay in range)."""
        last = (launch.length - 1)[self.seq]
        live = self.need < launch.left[self.seq] + self.proposing * (1 - launch.bonus[self.seq])
        positions = torch.where(live, last + self.offset, torch.minimum(last, launch.cap[self.seq]))
        blocks = launch.table[self.seq, positions // block_size]
        slots = torch.where(live, blocks * block_size + positions % block_size, scratch_slot)
        return list(torch.stack((positions, slots, positions + 1)).split(self.sizes, dim=1))


@dataclass
class RoundInputs:
    """What a round reads besides its launch: its forward rows, the proposer, the target's verify forward (a column
    forward over the launch's table, rows k + 1 times), the rule and the rule's temperatures [B], generator and greedy
    flag."""

    rows: RoundRows
    proposer: Proposer
    verify: Callable[[Tensor, Tensor], Tensor]
    rule: AcceptanceRule
    temperature: Tensor
    generator: torch.Generator | None
    greedy: bool


@dataclass
class Round:
    """What one round kept, per row: its tokens and log-probs [B, k + 1], proposals accepted and tokens kept [B]
    (0 for a row whose budget was spent); ``own``: the rule's side output (the target's own samples), if any."""

    tokens: Tensor
    logprobs: Tensor
    accepted: Tensor
    emitted: Tensor
    own: tuple[Tensor, Tensor] | None = None


def one_round(context: LaunchContext, target: ModelSlot, launch: Launch, inputs: RoundInputs) -> Round:
    """One round (module docstring); advances ``launch`` in place. Only device work, no host sync."""
    rows = inputs.rows
    batch, k = len(launch.length), rows.k
    active, proposals = launch.left > 0, (launch.left - launch.bonus).clamp(0, k)
    columns = rows.columns(launch, context.block_size, context.scratch_slot)
    tokens, logits = inputs.proposer.propose(launch.last_two, columns[:-1])
    hidden = inputs.verify(torch.cat((launch.last_two[:, 1:], tokens), dim=1).reshape(-1), columns[-1])
    target_logits = target.logits(hidden).view(batch, k + 1, -1)
    probs = inputs.proposer.distributions(tokens, logits) if inputs.rule.reads_probs and not inputs.greedy else None
    result, own = inputs.rule.accept(Verdict(target_logits, tokens, proposals, probs, inputs.temperature,
                                             inputs.generator, inputs.greedy))
    emitted = torch.where(active, torch.minimum(result.num_emitted, launch.left), 0)
    launch.last_two.copy_(torch.where(active[:, None], _last_two(result, launch.last_two), launch.last_two))
    launch.length.add_(emitted)
    launch.left.sub_(emitted)
    return Round(result.tokens, result.logprobs, result.num_accepted, emitted, own)


def repeated_tables(table: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """A launch's block table [B, W] as its round's forwards read it: rows twice, once and k + 1 times."""
    return table.repeat_interleave(2, 0), table, table.repeat_interleave(k + 1, 0)


def round_inputs(context: LaunchContext, target: ModelSlot, name: str, args: ProposerArgs, verify_table: Tensor,
                 rule: AcceptanceRule) -> RoundInputs:
    """A round's forward rows, proposer, verify forward and acceptance inputs."""
    seqs, sampler, batch = args.seqs, context.sampler, len(args.tables[1])
    verify = target.column_forward(verify_table, np.repeat(np.arange(batch), args.k + 1), eager=args.eager)
    temperature = torch.zeros(batch, device=target.device) if seqs is None else sampler.temperatures(seqs)
    generator = None if seqs is None else sampler.generator(seqs)
    proposer = make_proposer(name, args)
    rows = RoundRows.build(args.k, batch, context.device, proposer.forwards)
    return RoundInputs(rows, proposer, verify, rule, temperature, generator, args.greedy)


def _last_two(result: RejectionResult, last_two: Tensor) -> Tensor:
    """[B, 2] each row's last two tokens after a round: the last kept ones (the one before the last is the previous
    last token when the round kept no proposal)."""
    kept = result.num_accepted[:, None]
    last = result.tokens.gather(1, kept)
    before = torch.where(kept > 0, result.tokens.gather(1, (kept - 1).clamp(min=0)), last_two[:, 1:])
    return torch.cat((before, last), dim=1)
