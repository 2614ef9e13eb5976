"""The one round loop of VERIFY steps: ``rounds`` rounds of a proposer (proposers.py) and an acceptance rule
(acceptance.py) back to back on the device, launched without a host sync and read back once.

Each round, for every row (L: its tokens so far, known on the device only after the first round):
1. the proposer proposes up to ``k`` tokens (a model slot on the device, or tokens known on the host);
2. the target reads the last token and the proposals (positions L - 1 .. L - 1 + k) in one forward of a row per
   token (CUDA graphs apply, and the attention reads a sequence's K/V once for all its rows);
3. the rule keeps a prefix of the proposals and adds the target's token after it (``bonus``: unless the row is a
   tandem one whose frozen run goes on);
4. L grows by the tokens kept, on the device, and with it the next round's positions and KV slots (the scheduler
   reserved the launch's blocks for every proposal kept).
A row with ``d < k`` proposals, or with its budget spent, computes dead rows, whose K/V go to the scratch block.
Where the round is graph-safe (greedy rows, a model proposer on the target's device, a rule with no side outputs) a
round graph replays it whole (round_graph.py).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.acceptance import acceptance_rule
from tandemrl.engine.model.decode_plan import block_tables, int64_array
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import PendingTokens, copy_to_device
from tandemrl.engine.model.proposers import ProposerArgs
from tandemrl.engine.model.rejection import PAD_TOKEN
from tandemrl.engine.model.round import Launch, Round, launch_columns, one_round, repeated_tables, round_inputs
from tandemrl.engine.model.round_graph import round_graph
from tandemrl.engine.model.slot import ModelSlot, eval_mode
from tandemrl.engine.step import VerifyStep


def launch_rounds(context: LaunchContext, target: ModelSlot, plan: VerifyStep) -> PendingTokens:
    """The plan's rounds (module docstring), launched without a host sync; each row returns its kept tokens of
    every round, in order, ``num_tokens[i]`` at most."""
    seqs = plan.seqs
    name, rule_name, k = plan.proposer, plan.rule or context.acceptance, plan.k  # no rule named: the runner's
    bonus = (np.ones(len(seqs), np.int64) if plan.forced is None  # a tandem row whose frozen run goes on has none
             else int64_array([int(n > f) for n, f in zip(plan.num_tokens, plan.forced)]))
    if any(seq.num_pending for seq in seqs):
        raise RuntimeError("a verify step needs every token of its sequences on the host")
    lengths, budget = int64_array([seq.num_tokens for seq in seqs]), int64_array(plan.num_tokens)
    cap = lengths - 2 + budget  # the last position a row may write (every proposal kept up to its budget)
    for i in np.flatnonzero((lengths < 2) | (cap >= context.max_model_len)):
        raise ValueError(f"sequence {seqs[i].seq_id} has {lengths[i]} tokens and plans {budget[i]}: a verify step "
                         f"needs >= 2 tokens and at most max_model_len {context.max_model_len} after it")
    table = block_tables(seqs, cap, context.block_size, context.num_blocks)
    last_two = int64_array([t for seq in seqs for t in seq.token_ids[-2:]])
    host = launch_columns(lengths, budget, cap, bonus, last_two, table)
    greedy = all(seq.params.temperature <= 0 for seq in seqs)  # known on the host: no random draws
    rule = acceptance_rule(rule_name)
    proposer_slot = context.slots.get(name)
    with eval_mode(proposer_slot.modules if proposer_slot is not None else []):
        graph = (round_graph(context, name, target, k, len(seqs), table.shape[1], rule_name)
                 if greedy and not rule.side_output else None)
        if graph is not None:  # a replay a round
            graph.load(lengths, budget, cap, bonus, last_two, table, plan.feed)
            rounds = [graph.run() for _ in range(plan.rounds)]
            if proposer_slot is not None:
                proposer_slot.stats.forwards += k * plan.rounds  # what the eager rounds count
            target.stats.forwards += plan.rounds
        else:
            launch = Launch.packed(copy_to_device(torch.from_numpy(host), context.device), len(seqs))
            twice, once, per_token = repeated_tables(launch.table, k)
            args = ProposerArgs(context, seqs, k, plan.feed, (twice, once), greedy)
            inputs = round_inputs(context, target, name, args, per_token, rule)
            rounds = [one_round(context, target, launch, inputs) for _ in range(plan.rounds)]
    tokens, logprobs, kept = _compact(rounds)
    accepted = torch.stack([r.accepted for r in rounds], dim=1)
    return PendingTokens(tokens, logprobs, plan.num_tokens, accepted=accepted, kept=kept, own=rounds[-1].own)


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
