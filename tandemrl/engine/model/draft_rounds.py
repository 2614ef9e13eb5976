"""Speculative decoding with a draft model: ``plan.rounds`` verify rounds back to back on the device per launch.

Each round, for every row (L: the row's tokens so far, known on the device only after the first round):
1. the draft reads the row's last two tokens (positions L - 2 and L - 1: when the previous round kept all its
   proposals the draft never read its last one; otherwise it writes the same K/V again) and proposes ``k`` tokens,
   each sampled (temperature only) from its logits and fed back to it;
2. the target reads the last token and the proposals (positions L - 1 .. L - 1 + k) in one forward of a row per
   token (CUDA graphs apply, and the attention reads a sequence's K/V once for all its rows);
3. rejection sampling (``runner.accept``) keeps a prefix of the proposals and adds the target's token after it;
4. L grows by the tokens kept, on the device: the next round's positions and KV slots are computed there from it
   and the launch's block table, which the scheduler reserved for the worst case (every proposal kept).
So the host launches every round without waiting for the device and reads the launch back once: its per-step work
(read-back, postprocess, schedule, staging) is paid once per ``rounds`` rounds. A row with ``d < k`` proposals (its
last tokens: a row keeps at most its ``num_tokens`` in a launch) computes the rest as dead rows, whose K/V go to the
scratch block, never kept; a row whose budget is spent computes only dead rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.decode_plan import block_tables, int64_array
from tandemrl.engine.model.pending import PendingTokens, copy_to_device
from tandemrl.engine.model.placement import move
from tandemrl.engine.model.rejection import PAD_TOKEN, RejectionResult
from tandemrl.engine.model.slot import ModelSlot, eval_mode
from tandemrl.engine.model.verify_runner import proposal_distributions
from tandemrl.engine.step import StepPlan

if TYPE_CHECKING:
    from tandemrl.engine.model.runner import ModelRunner


@dataclass
class _RoundRows:
    """Every forward row of one round, on the device: the draft's first forward (2 rows a sequence), its ``k - 1``
    proposal steps (1 row each) and the target's verify forward (``k + 1`` rows), concatenated in that order."""

    seq: Tensor  # [N] the row's sequence
    offset: Tensor  # [N] its position relative to the sequence's last token
    need: Tensor  # [N] proposals the sequence must make this round for the row to be live
    cap: Tensor  # [N] the last position the sequence may write in this launch
    sizes: list[int]  # rows of each forward, in order

    @classmethod
    def build(cls, k: int, cap: Tensor) -> _RoundRows:
        """The rows of a round for sequences that may write up to position ``cap`` [B] (on the device)."""
        batch = len(cap)
        rows = np.arange(batch)
        parts = [(np.repeat(rows, 2), np.tile([-1, 0], batch), np.zeros(2 * batch, np.int64))]
        parts += [(rows, np.full(batch, j), np.full(batch, j + 1)) for j in range(1, k)]  # feeds proposal j
        offsets = np.tile(np.arange(k + 1), batch)
        parts.append((np.repeat(rows, k + 1), offsets, offsets))  # reads proposal ``offset``
        columns = np.stack([np.concatenate(column) for column in zip(*parts)])
        seq, offset, need = copy_to_device(torch.from_numpy(columns.astype(np.int64)), cap.device)
        return cls(seq, offset, need, cap[seq], [len(p[0]) for p in parts])

    def columns(self, length: Tensor, left: Tensor, table: Tensor, block_size: int, scratch_slot: int
                ) -> list[Tensor]:
        """Per forward, [3, rows]: positions, KV slots and context lengths, from the sequences' lengths and tokens
        left in their budgets ([B] each; a sequence proposes ``min(k, left - 1)``, so a row is live while its
        ``need < left``). A dead row writes to the scratch slot at a position its sequence has a block for (its
        last, at most ``cap``: RoPE and the attention stay in range)."""
        last = (length - 1)[self.seq]
        live = self.need < left[self.seq]
        positions = torch.where(live, last + self.offset, torch.minimum(last, self.cap))
        blocks = table[self.seq, positions // block_size]
        slots = torch.where(live, blocks * block_size + positions % block_size, scratch_slot)
        return list(torch.stack((positions, slots, positions + 1)).split(self.sizes, dim=1))


@dataclass
class _Round:
    """What one round kept, per row: its tokens and log-probs [B, k + 1], proposals accepted and tokens kept [B]
    (0 for a row whose budget was spent)."""

    tokens: Tensor
    logprobs: Tensor
    accepted: Tensor
    emitted: Tensor


def launch_draft_rounds(runner: ModelRunner, slot: ModelSlot, plan: StepPlan) -> PendingTokens:
    """``plan.rounds`` rounds of draft proposals, target verify and rejection sampling (module docstring), launched
    without a host sync; each row returns its kept tokens of every round, in order, ``num_tokens[i]`` at most."""
    seqs, k = plan.seqs, plan.num_proposals
    draft = runner.slots.get(plan.proposer)
    if draft is None:
        raise ValueError(f"a verify step without proposals needs a {plan.proposer!r} model slot")
    if any(seq.num_pending for seq in seqs):
        raise RuntimeError("a verify step needs every token of its sequences on the host")
    device, batch = runner.device, len(seqs)
    lengths, budget = int64_array([seq.num_tokens for seq in seqs]), int64_array(plan.num_tokens)
    cap = lengths - 2 + budget  # the last position a row may write (every proposal kept up to its budget)
    for i in np.flatnonzero((lengths < 2) | (cap >= runner.max_model_len)):
        raise ValueError(f"sequence {seqs[i].seq_id} has {lengths[i]} tokens and plans {budget[i]}: a verify step "
                         f"needs >= 2 tokens and at most max_model_len {runner.max_model_len} after it")
    table = block_tables(seqs, cap, plan.num_tokens, runner.block_size, runner.num_blocks)
    host = np.concatenate((lengths, budget, cap, int64_array([t for seq in seqs for t in seq.token_ids[-2:]]),
                           table.reshape(-1)))
    length, left, cap, last_two, table = copy_to_device(torch.from_numpy(host), device).split(
        [batch, batch, batch, 2 * batch, table.size])
    last_two, table = last_two.view(batch, 2), table.view(batch, -1)
    rows = _RoundRows.build(k, cap)
    first = draft.column_forward(move(table.repeat_interleave(2, 0), draft.device), np.repeat(np.arange(batch), 2))
    step = draft.column_forward(move(table, draft.device))
    verify = slot.column_forward(table.repeat_interleave(k + 1, 0), np.repeat(np.arange(batch), k + 1))
    greedy = runner.sampler.all_greedy(seqs)  # the draft proposes its argmax: no random draw, no logits kept
    sample = None if greedy else runner.sampler_for(draft).for_subsets(seqs, temperature_only=True)
    rounds = []
    with eval_mode(draft.modules):
        for _ in range(plan.rounds):
            active, drafts = left > 0, (left - 1).clamp(0, k)
            columns = rows.columns(length, left, table, runner.block_size, runner.num_blocks * runner.block_size)
            tokens, logits = _propose(draft, first, step, sample, last_two, columns[:-1])
            hidden = verify(torch.cat((last_two[:, 1:], tokens), dim=1).reshape(-1), columns[-1])
            target_logits = slot.logits(hidden).view(batch, k + 1, -1)
            probs = proposal_distributions(runner, seqs, logits, tokens, plan.proposer)
            result = runner.accept(target_logits, move(probs, device), tokens, drafts, seqs)
            emitted = torch.where(active, result.num_emitted, 0)
            rounds.append(_Round(result.tokens, result.logprobs, result.num_accepted, emitted))
            last_two = torch.where(active[:, None], _last_two(result, last_two), last_two)
            length, left = length + emitted, left - emitted
    tokens, logprobs, kept = _compact(rounds)
    accepted = torch.stack([r.accepted for r in rounds], dim=1)
    return PendingTokens(tokens, logprobs, plan.num_tokens, accepted=accepted, kept=kept)


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


def _compact(rounds: list[_Round]) -> tuple[Tensor, Tensor, Tensor]:
    """Each row's kept tokens of every round, side by side ([B, rounds * (k + 1)], padded with ``PAD_TOKEN``), their
    log-probs, and how many each row kept [B]."""
    tokens = torch.stack([r.tokens for r in rounds], dim=1)  # [B, R, k + 1]
    logprobs = torch.stack([r.logprobs for r in rounds], dim=1)
    emitted = torch.stack([r.emitted for r in rounds], dim=1)  # [B, R]
    batch, num_rounds, width = tokens.shape
    column = torch.arange(width, device=tokens.device)
    start = (emitted.cumsum(1) - emitted)[:, :, None]
    trash = num_rounds * width  # one column past the end takes every token not kept
    where = torch.where(column < emitted[:, :, None], start + column, trash).view(batch, -1)
    out_tokens = tokens.new_full((batch, trash + 1), PAD_TOKEN).scatter_(1, where, tokens.view(batch, -1))
    out_logprobs = logprobs.new_zeros(batch, trash + 1).scatter_(1, where, logprobs.view(batch, -1))
    return out_tokens[:, :trash], out_logprobs[:, :trash], emitted.sum(1)
