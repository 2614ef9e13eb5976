"""Speculative decoding with a draft model: ``plan.rounds`` verify rounds back to back on the device per launch.

Each round, for every row (L: the row's tokens so far, known on the device only after the first round):
1. the draft reads the row's last two tokens (positions L - 2 and L - 1: when the previous round kept all its
   proposals the draft never read its last one; otherwise it writes the same K/V again) and proposes ``k`` tokens,
   each sampled (temperature only) from its logits and fed back to it;
2. the target reads the last token and the proposals (positions L - 1 .. L - 1 + k) in one forward of a row per
   token (CUDA graphs apply, and the attention reads a sequence's K/V once for all its rows);
3. rejection sampling (``context.accept``) keeps a prefix of the proposals and adds the target's token after it;
4. L grows by the tokens kept, on the device: the next round's positions and KV slots are computed there from it
   and the launch's block table, which the scheduler reserved for the worst case (every proposal kept).
So the host launches every round without waiting for the device and reads the launch back once: its per-step work
(read-back, postprocess, schedule, staging) is paid once per ``rounds`` rounds. A row with ``d < k`` proposals (its
last tokens: a row keeps at most its ``num_tokens`` in a launch) computes the rest as dead rows, whose K/V go to the
scratch block, never kept; a row whose budget is spent computes only dead rows.
"""

from __future__ import annotations


import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.decode_plan import block_tables, int64_array
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import PendingTokens, copy_to_device
from tandemrl.engine.model.rejection import PAD_TOKEN
from tandemrl.engine.model.round_graph import round_graph
from tandemrl.engine.model.slot import ModelSlot, eval_mode
from tandemrl.engine.model.verify_round import (Launch, Round, RoundInputs, RoundRows, one_round,
                                                 repeated_tables)
from tandemrl.engine.step import StepPlan



def launch_draft_rounds(context: LaunchContext, slot: ModelSlot, plan: StepPlan) -> PendingTokens:
    """``plan.rounds`` rounds of draft proposals, target verify and rejection sampling (module docstring), launched
    without a host sync; each row returns its kept tokens of every round, in order, ``num_tokens[i]`` at most."""
    seqs, k = plan.seqs, plan.num_proposals
    draft = context.slots.get(plan.proposer)
    if draft is None:
        raise ValueError(f"a verify step without proposals needs a {plan.proposer!r} model slot")
    if any(seq.num_pending for seq in seqs):
        raise RuntimeError("a verify step needs every token of its sequences on the host")
    lengths, budget = int64_array([seq.num_tokens for seq in seqs]), int64_array(plan.num_tokens)
    cap = lengths - 2 + budget  # the last position a row may write (every proposal kept up to its budget)
    for i in np.flatnonzero((lengths < 2) | (cap >= context.max_model_len)):
        raise ValueError(f"sequence {seqs[i].seq_id} has {lengths[i]} tokens and plans {budget[i]}: a verify step "
                         f"needs >= 2 tokens and at most max_model_len {context.max_model_len} after it")
    table = block_tables(seqs, cap, plan.num_tokens, context.block_size, context.num_blocks)
    last_two = int64_array([t for seq in seqs for t in seq.token_ids[-2:]])
    greedy = context.sampler.all_greedy(seqs)  # the draft proposes its argmax: no random draw, no logits kept
    with eval_mode(draft.modules):
        graph = round_graph(context, draft, slot, k, len(seqs), table.shape[1]) if greedy else None
        if graph is not None:  # a replay a round
            graph.load(lengths, budget, cap, last_two, table)
            rounds = [graph.run() for _ in range(plan.rounds)]
            draft.stats.forwards += k * plan.rounds  # what the eager rounds count
            slot.stats.forwards += plan.rounds
        else:
            launch = launch_state(context.device, lengths, budget, cap, last_two, table)
            sample = None if greedy else context.sampler_for(draft).for_subsets(seqs, temperature_only=True)
            inputs = RoundInputs.over(draft, slot, repeated_tables(launch.table, k), sample=sample,
                                      temperature=context.sampler.temperatures(seqs),
                                      generator=context.sampler.generator(seqs), greedy=greedy, proposer=plan.proposer)
            rows = RoundRows.build(k, len(seqs), context.device)
            rounds = [one_round(context, draft, slot, rows, launch, inputs, seqs) for _ in range(plan.rounds)]
    tokens, logprobs, kept = _compact(rounds)
    accepted = torch.stack([r.accepted for r in rounds], dim=1)
    return PendingTokens(tokens, logprobs, plan.num_tokens, accepted=accepted, kept=kept)


def launch_state(device: torch.device, lengths: np.ndarray, budget: np.ndarray, cap: np.ndarray,
                 last_two: np.ndarray, table: np.ndarray) -> Launch:
    """A launch's rows on the device, in one copy."""
    batch = len(lengths)
    host = np.concatenate((lengths, budget, cap, last_two, table.reshape(-1)))
    length, left, cap_d, last_two_d, table_d = copy_to_device(torch.from_numpy(host), device).split(
        [batch, batch, batch, 2 * batch, table.size])
    return Launch(length, left, cap_d, last_two_d.view(batch, 2), table_d.view(batch, -1))


def _compact(rounds: list[Round]) -> tuple[Tensor, Tensor, Tensor]:
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
