"""Runs one verify step (runner.py's VERIFY) of proposals known on the host (the plan's feed: n-gram) or of a
tandem segment (the proposer slot's forced run, drawn in the same launch; a draft's speculative proposals run in
rounds: draft_rounds.py): each row's proposals, then the target over the row's last token and its proposals in one
decode step of a row per token (decode_plan.py's ``as_one_step`` layout: CUDA graphs apply, and the attention reads a
row's K/V once for all its tokens), then rejection sampling (rejection.py) or, for a tandem segment, the forced run
and the target's own token after it. Nothing waits for the device.
"""

from __future__ import annotations

from typing import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.decode_plan import as_one_step, build_decode_plan
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import PendingTokens, copy_to_device
from tandemrl.engine.model.placement import move
from tandemrl.engine.model.rejection import RejectionResult
from tandemrl.engine.model.sampler import sample_with_probs
from tandemrl.engine.model.slot import ModelSlot, eval_mode
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.step import StepPlan



def launch_verify(context: LaunchContext, slot: ModelSlot, plan: StepPlan) -> PendingTokens:
    """Each row's proposals (the plan's feed, or the proposer slot's), the target's logits at its last token and at
    its proposals in one forward, then rejection sampling (``context.accept``), or, for a tandem step, the forced runs
    and the target's own token after them."""
    seqs, planned = plan.seqs, plan.num_tokens
    if any(seq.num_pending for seq in seqs):
        raise RuntimeError("a verify step needs every token of its sequences on the host")
    device = context.device
    if plan.feed is None:  # the proposer's first forward goes first: the device starts while the host plans the rest
        tokens = _propose(context, seqs, plan.proposals, plan.proposer)
    burst = build_decode_plan(seqs, planned, context.block_size, context.num_blocks, context.max_model_len)
    fed = [n - 1 for n in planned]  # proposals the target reads (after each row's last token)
    width = max(1, max(len(f) for f in plan.feed) if plan.feed is not None else max(plan.proposals)) + 1
    padded = np.zeros(len(seqs) * width, dtype=np.int64)  # row of each (sequence, position); 0 past the feed
    padded[_packed(fed, width)] = np.arange(sum(planned))
    if plan.feed is None:
        last_ids, ids_index, rows, num_draft = _to_device(
            device, [seq.token_ids[-1] for seq in seqs], _packed(fed, width), padded, plan.proposals)
        ids = torch.cat((last_ids[:, None], tokens), dim=1).reshape(-1)[ids_index]
        run_step, _ = slot.decode_steps(as_one_step(burst, [0] * sum(planned)))
        hidden = run_step(0, ids)
    else:
        rows, num_draft = _to_device(device, padded, plan.proposals)
        tokens = _host_proposals(plan.feed, width - 1, device)
        inputs = [t for seq, f in zip(seqs, plan.feed) for t in [seq.token_ids[-1], *f]]
        run_step, _ = slot.decode_steps(as_one_step(burst, inputs))
        hidden = run_step(0, None)
    logits = slot.logits(hidden[rows]).view(len(seqs), width, -1)  # the hidden states gathered: fewer bytes
    if plan.forced is not None:
        result, own = keep_forced(context, logits, tokens, plan.forced, seqs)
        return PendingTokens(result.tokens, result.logprobs, planned, accepted=result.num_accepted, own=own)
    probs = proposal_distributions(context, seqs, None, tokens, plan.proposer)  # proposals from the host: one-hots
    result = context.accept(logits, move(probs, device), tokens, num_draft, context.sampler.temperatures(seqs),
                           context.sampler.generator(seqs), context.sampler.all_greedy(seqs))
    return PendingTokens(result.tokens, result.logprobs, planned, accepted=result.num_accepted,
                         kept=result.num_accepted + 1)


def keep_forced(context: LaunchContext, logits: Tensor, tokens: Tensor, forced: list[int],
                seqs: Seq[Sequence]) -> tuple[RejectionResult, tuple[Tensor, Tensor]]:
    """Tandem: each row keeps its ``forced[i]`` proposals, then the target's own sample at the next position (the
    engine keeps it only where the plan gives the row a target token). Log-probs are the target's, for every
    token, whoever wrote it: the loss needs the trained model's log-prob of each kept token. Also the target's
    own sample at every position, with its log-prob, for a run the selector cuts short."""
    batch, width, vocab = logits.shape
    temperature = context.sampler.temperatures(seqs)
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))  # greedy rows: raw log-probs
    logp = torch.log_softmax(logits.float() / scale[:, None, None], dim=-1)
    own, _ = sample_with_probs(logits.reshape(-1, vocab), temperature.repeat_interleave(width),
                               context.sampler.generator(seqs))
    own = own.view(batch, width)
    kept = _index(forced, context.device)
    position = torch.arange(width, device=logits.device)
    proposals = torch.cat((tokens, tokens[:, :1]), dim=1)[:, :width]  # one column more: where ``own`` goes
    out = torch.where(position < kept[:, None], proposals, own)
    own_logp = logp.gather(-1, own[..., None]).squeeze(-1)
    return RejectionResult(out, logp.gather(-1, out[..., None]).squeeze(-1), kept), (own, own_logp)


def _propose(context: LaunchContext, seqs: Seq[Sequence], drafts: list[int], proposer: str) -> Tensor:
    """The proposer slot's proposals [B, width] (a tandem segment's frozen run; on the runner's device; columns past
    a row's count are padding). The first forward feeds each row's last token, and before it the one the proposer
    has not computed yet where it is behind (sequence.py); then a burst draws the remaining proposals, each from
    ``softmax(logits / T)`` (top-k and top-p ignored)."""
    draft = context.slots.get(proposer)
    if draft is None:
        raise ValueError(f"a verify step without proposals needs a {proposer!r} model slot")
    behind = [seq.draft_behind for seq in seqs]
    first = build_decode_plan(seqs, [2] * len(seqs), context.block_size, context.num_blocks, context.max_model_len,
                              back=1)
    ids = [t for seq, lag in zip(seqs, behind) for t in seq.token_ids[len(seq.token_ids) - 1 - lag:]]
    with eval_mode(draft.modules):
        run_step, _ = draft.decode_steps(as_one_step(first, ids, keep=np.array([behind, [1] * len(seqs)], bool)))
        hidden = run_step(0, None)
        rows = [i for i, d in enumerate(drafts) if d > 1]  # rows with more to propose
        device = draft.device
        last_rows, index = _to_device(device, np.cumsum([lag + 1 for lag in behind]) - 1, rows)
        hidden = hidden[last_rows]
        width = max(1, max(drafts))
        sampler = context.sampler_for(draft)
        sample = sampler.for_subsets(seqs, temperature_only=True)
        tokens = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
        with draft.on_device():
            tokens[:, 0], _ = sample(draft.logits(hidden), slice(None))
        if rows:
            subset = [seqs[i] for i in rows]
            rest = build_decode_plan(subset, [drafts[i] - 1 for i in rows], context.block_size, context.num_blocks,
                                     context.max_model_len, back=-1)
            last = tokens[index, 0]
            burst = draft.sampled_burst(rest, last, lambda: sampler.graph_sampling(subset, rest.num_steps))
            if burst is not None:  # every step in one graph replay
                tokens[index, 1:] = burst[0]
            else:
                run_step, _ = draft.decode_steps(rest)
                for j in range(rest.num_steps):
                    hidden = run_step(j, last)
                    with draft.on_device():
                        last, _ = sample(draft.logits(hidden), index)
                    tokens[index, j + 1] = last
    return move(tokens, context.device)


def proposal_distributions(context: LaunchContext, seqs: Seq[Sequence], logits: Tensor | None, tokens: Tensor,
                           proposer: str) -> Tensor:
    """[B, width, V] float32: the distribution each proposal was drawn from, for the rejection rule: the draft's
    ``softmax(logits / T)``, or, for proposals known on the host (``logits`` None), one-hots. Greedy rows read
    none of it: a batch of greedy rows gets an expanded zero (no memory, no work)."""
    shape = (*tokens.shape, context.target.spec.vocab_size)
    if context.sampler.all_greedy(seqs):
        return torch.zeros((), device=tokens.device).expand(shape)
    if logits is None:
        return torch.zeros(shape, device=tokens.device).scatter_(-1, tokens.clamp(min=0).unsqueeze(-1), 1.0)
    temperature = context.sampler_for(context.slots[proposer]).temperatures(seqs)
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    return (logits.float() / scale[:, None, None]).softmax(dim=-1)


def _host_proposals(feed: Seq[Seq[int]], width: int, device: torch.device) -> Tensor:
    """Proposals known on the host as tokens [B, width] on the device, padded with -1."""
    host = torch.full((len(feed), width), -1, dtype=torch.long)
    for i, f in enumerate(feed):
        host[i, :len(f)] = torch.tensor(list(f), dtype=torch.long)
    return copy_to_device(host, device)


def _to_device(device: torch.device, *arrays: Seq[int] | np.ndarray) -> list[Tensor]:
    """Host int arrays as long tensors on the device, in one copy through pinned memory (no wait for the work in
    flight)."""
    host = np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays])
    return list(copy_to_device(torch.from_numpy(host), device).split([len(a) for a in arrays]))


def _index(values: list[int], device: torch.device) -> Tensor:
    """Host ints as a long tensor on the device (through pinned memory: no wait for the work in flight)."""
    return copy_to_device(torch.tensor(values, dtype=torch.long), device)


def _packed(drafts: list[int], width: int) -> list[int]:
    """Flat index, in a [B, width] layout, of each row's last token and its proposals, row by row."""
    return [i * width + j for i, d in enumerate(drafts) for j in range(d + 1)]
