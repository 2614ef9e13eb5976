"""One verify round of speculative decoding with a draft model, as device work only (draft_rounds.py launches
``rounds`` of them back to back; round_graph.py captures one whole in a CUDA graph): the draft reads each row's last
two tokens and proposes ``k``, the target reads the last token and the proposals in one forward, the acceptance keeps
a prefix and adds the target's token after it, and the launch's lengths, budgets and last tokens advance in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import copy_to_device
from tandemrl.engine.model.placement import move
from tandemrl.engine.model.rejection import RejectionResult
from tandemrl.engine.model.slot import ModelSlot
from tandemrl.engine.model.verify_runner import proposal_distributions



@dataclass
class RoundRows:
    """Every forward row of one round, on the device: the draft's first forward (2 rows a sequence), its ``k - 1``
    proposal steps (1 row each) and the target's verify forward (``k + 1`` rows), concatenated in that order."""

    seq: Tensor  # [N] the row's sequence
    offset: Tensor  # [N] its position relative to the sequence's last token
    need: Tensor  # [N] proposals the sequence must make this round for the row to be live
    sizes: list[int]  # rows of each forward, in order

    @classmethod
    def build(cls, k: int, batch: int, device: torch.device) -> RoundRows:
        """The rows of a round of ``batch`` sequences."""
        rows = np.arange(batch)
        parts = [(np.repeat(rows, 2), np.tile([-1, 0], batch), np.zeros(2 * batch, np.int64))]
        parts += [(rows, np.full(batch, j), np.full(batch, j + 1)) for j in range(1, k)]  # feeds proposal j
        offsets = np.tile(np.arange(k + 1), batch)
        parts.append((np.repeat(rows, k + 1), offsets, offsets))  # reads proposal ``offset``
        columns = np.stack([np.concatenate(column) for column in zip(*parts)])
        seq, offset, need = copy_to_device(torch.from_numpy(columns.astype(np.int64)), device)
        return cls(seq, offset, need, [len(p[0]) for p in parts])

    def columns(self, launch: Launch, block_size: int, scratch_slot: int) -> list[Tensor]:
        """Per forward, [3, rows]: positions, KV slots and context lengths, from the sequences' lengths and tokens
        left in their budgets (a sequence proposes ``min(k, left - 1)``, so a row is live while its ``need <
        left``). A dead row writes to the scratch slot at a position its sequence has a block for (its last, at
        most ``cap``: RoPE and the attention stay in range)."""
        last = (launch.length - 1)[self.seq]
        live = self.need < launch.left[self.seq]
        positions = torch.where(live, last + self.offset, torch.minimum(last, launch.cap[self.seq]))
        blocks = launch.table[self.seq, positions // block_size]
        slots = torch.where(live, blocks * block_size + positions % block_size, scratch_slot)
        return list(torch.stack((positions, slots, positions + 1)).split(self.sizes, dim=1))


@dataclass
class Launch:
    """A launch's rows on the device, which every round advances in place: tokens so far, tokens left in the
    budget, the last position each may write, its last two tokens [B, 2] and its block table [B, W]."""

    length: Tensor
    left: Tensor
    cap: Tensor
    last_two: Tensor
    table: Tensor


@dataclass
class RoundInputs:
    """What a round reads besides its launch: the draft and target forwards (``ModelSlot.column_forward``s over
    the launch's table), the draft's sampler (None: greedy, its argmax), and the acceptance's temperatures [B],
    generator and whether every row is greedy."""

    first: Callable
    step: Callable
    verify: Callable
    sample: Callable | None
    temperature: Tensor
    generator: torch.Generator | None
    greedy: bool
    proposer: str

    @classmethod
    def over(cls, draft: ModelSlot, target: ModelSlot, tables: tuple[Tensor, Tensor, Tensor], eager: bool = False,
             **sampling) -> RoundInputs:
        """The forwards over ``tables``: the launch's block table [B, W] with each row repeated twice (the draft's
        first forward), once and k + 1 times (the verify forward); see ``repeated_tables``."""
        twice, once, verify = tables
        first = draft.column_forward(move(twice, draft.device), np.repeat(np.arange(len(once)), 2), eager=eager)
        step = draft.column_forward(move(once, draft.device), eager=eager)
        per_row = len(verify) // len(once)
        verify_forward = target.column_forward(verify, np.repeat(np.arange(len(once)), per_row), eager=eager)
        return cls(first, step, verify_forward, **sampling)


def repeated_tables(table: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """A launch's block table [B, W] as its round's forwards read it: rows twice, once and k + 1 times."""
    return table.repeat_interleave(2, 0), table, table.repeat_interleave(k + 1, 0)


@dataclass
class Round:
    """What one round kept, per row: its tokens and log-probs [B, k + 1], proposals accepted and tokens kept [B]
    (0 for a row whose budget was spent)."""

    tokens: Tensor
    logprobs: Tensor
    accepted: Tensor
    emitted: Tensor


def one_round(context: LaunchContext, draft: ModelSlot, slot: ModelSlot, rows: RoundRows, launch: Launch,
              inputs: RoundInputs, seqs) -> Round:
    """One round (module docstring): the draft's proposals, the target's verify forward, the acceptance; advances
    ``launch`` in place. Only device work, no host sync: a round graph captures it whole (round_graph.py)."""
    batch, k, device = len(launch.length), len(rows.sizes) - 1, context.device
    active, drafts = launch.left > 0, (launch.left - 1).clamp(0, k)
    columns = rows.columns(launch, context.block_size, context.scratch_slot)
    tokens, logits = _propose(draft, inputs.first, inputs.step, inputs.sample, launch.last_two, columns[:-1])
    hidden = inputs.verify(torch.cat((launch.last_two[:, 1:], tokens), dim=1).reshape(-1), columns[-1])
    target_logits = slot.logits(hidden).view(batch, k + 1, -1)
    probs = (_no_probs(tokens, slot) if inputs.greedy
             else move(proposal_distributions(context, seqs, logits, tokens, inputs.proposer), device))
    result = context.accept(target_logits, probs, tokens, drafts, inputs.temperature, inputs.generator,
                           inputs.greedy)
    emitted = torch.where(active, result.num_emitted, 0)
    launch.last_two.copy_(torch.where(active[:, None], _last_two(result, launch.last_two), launch.last_two))
    launch.length.add_(emitted)
    launch.left.sub_(emitted)
    return Round(result.tokens, result.logprobs, result.num_accepted, emitted)


def _no_probs(tokens: Tensor, slot: ModelSlot) -> Tensor:
    """The draft distributions greedy rows never read: an expanded zero of their shape (no memory, no work)."""
    return torch.zeros((), device=tokens.device).expand(*tokens.shape, slot.spec.vocab_size)


def _propose(draft: ModelSlot, first: Callable, step: Callable, sample: Callable | None, last_two: Tensor,
             columns: list[Tensor]) -> tuple[Tensor, Tensor | None]:
    """The draft's proposals [B, k] (on the runner's device) and the logits they were drawn from [B, k, V] (the
    rejection rule reads them when a row samples); without ``sample`` (every row greedy) the argmax and no logits."""
    home = last_two.device
    on_draft = [move(c, draft.device) for c in columns]
    hidden = first(move(last_two.reshape(-1), draft.device), on_draft[0])[1::2]  # the last token's row
    tokens, all_logits = [], []
    for j in range(len(on_draft)):
        if j:
            hidden = step(tokens[-1], on_draft[j])
        with draft.on_device():
            logits = draft.logits(hidden)
            proposal = logits.argmax(-1) if sample is None else sample(logits, slice(None))[0]
        tokens.append(proposal)
        if sample is not None:
            all_logits.append(logits)
    logits = torch.stack(all_logits, dim=1) if sample is not None else None
    return move(torch.stack(tokens, dim=1), home), logits


def _last_two(result: RejectionResult, last_two: Tensor) -> Tensor:
    """[B, 2] each row's last two tokens after a round: the last kept ones (the one before the last is the previous
    last token when the round kept no proposal)."""
    kept = result.num_accepted[:, None]
    last = result.tokens.gather(1, kept)
    before = torch.where(kept > 0, result.tokens.gather(1, (kept - 1).clamp(min=0)), last_two[:, 1:])
    return torch.cat((before, last), dim=1)
