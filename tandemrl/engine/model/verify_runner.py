"""Runs a verify step (runner.py's VERIFY): each row's proposals (the plan's feed, or the proposer slot's, drawn in
the same launch), then the target over the row's last token and its proposals in one decode step of a row per token
(decode_plan.py's ``as_one_step`` layout: CUDA graphs apply, and the attention reads a row's K/V once for all its
tokens), then rejection sampling (rejection.py) or, for a tandem segment, the forced run and the target's own token
after it. Nothing waits for the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.model.decode_plan import as_one_step, build_decode_plan
from tandemrl.engine.model.pending import PendingTokens, copy_to_device
from tandemrl.engine.model.placement import move
from tandemrl.engine.model.rejection import RejectionResult
from tandemrl.engine.model.sampler import sample_with_probs
from tandemrl.engine.model.slot import ModelSlot, eval_mode
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.speculative import DRAFT
from tandemrl.engine.step import StepPlan

if TYPE_CHECKING:
    from tandemrl.engine.model.runner import ModelRunner


def launch_verify(runner: ModelRunner, slot: ModelSlot, plan: StepPlan) -> PendingTokens:
    """Each row's proposals (the plan's feed, or the proposer slot's), the target's logits at its last token and at
    its proposals in one forward, then rejection sampling (``runner.accept``), or, for a tandem step, the forced runs
    and the target's own token after them."""
    seqs, planned = plan.seqs, plan.num_tokens
    if any(seq.num_pending for seq in seqs):
        raise RuntimeError("a verify step needs every token of its sequences on the host")
    device = runner.device
    burst = build_decode_plan(seqs, planned, runner.block_size, runner.num_blocks, runner.max_model_len)
    fed = [n - 1 for n in planned]  # proposals the target reads (after each row's last token)
    if plan.feed is None:
        tokens, probs = _propose(runner, seqs, plan.proposals, plan.proposer)
        rows = torch.cat((_index([seq.token_ids[-1] for seq in seqs], device)[:, None], tokens), dim=1)
        ids = rows.reshape(-1)[_index(_packed(fed, tokens.shape[1] + 1), device)]
        run_step, _ = slot.decode_steps(as_one_step(burst, [0] * sum(planned)))
        hidden = run_step(0, ids)
    else:
        tokens, probs = _host_proposals(plan.feed, slot.spec.vocab_size, device)
        inputs = [t for seq, f in zip(seqs, plan.feed) for t in [seq.token_ids[-1], *f]]
        run_step, _ = slot.decode_steps(as_one_step(burst, inputs))
        hidden = run_step(0, None)
    width = tokens.shape[1] + 1
    padded = np.zeros(len(seqs) * width, dtype=np.int64)  # row of each (sequence, position); 0 past the feed
    padded[_packed(fed, width)] = np.arange(sum(planned))
    logits = slot.logits(hidden)[_index(padded.tolist(), device)].view(len(seqs), width, -1)
    if plan.forced is not None:
        result, own = keep_forced(runner, logits, tokens, plan.forced, seqs)
        return PendingTokens(result.tokens, result.logprobs, planned, accepted=result.num_accepted, own=own)
    result = runner.accept(logits, move(probs, device), tokens, _index(plan.proposals, device), seqs)
    return PendingTokens(result.tokens, result.logprobs, planned, accepted=result.num_accepted,
                         kept=result.num_accepted + 1)


def keep_forced(runner: ModelRunner, logits: Tensor, tokens: Tensor, forced: list[int],
                seqs: Seq[Sequence]) -> tuple[RejectionResult, tuple[Tensor, Tensor]]:
    """Tandem: each row keeps its ``forced[i]`` proposals, then the target's own sample at the next position (the
    engine keeps it only where the plan gives the row a target token). Log-probs are the target's, for every
    token, whoever wrote it: the loss needs the trained model's log-prob of each kept token. Also the target's
    own sample at every position, with its log-prob, for a run the selector cuts short."""
    batch, width, vocab = logits.shape
    temperature = runner.sampler.temperatures(seqs)
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))  # greedy rows: raw log-probs
    logp = torch.log_softmax(logits.float() / scale[:, None, None], dim=-1)
    own, _ = sample_with_probs(logits.reshape(-1, vocab), temperature.repeat_interleave(width),
                               runner.sampler.generator(seqs))
    own = own.view(batch, width)
    kept = _index(forced, runner.device)
    position = torch.arange(width, device=logits.device)
    proposals = torch.cat((tokens, tokens[:, :1]), dim=1)[:, :width]  # one column more: where ``own`` goes
    out = torch.where(position < kept[:, None], proposals, own)
    own_logp = logp.gather(-1, own[..., None]).squeeze(-1)
    return RejectionResult(out, logp.gather(-1, out[..., None]).squeeze(-1), kept), (own, own_logp)


def _propose(runner: ModelRunner, seqs: Seq[Sequence], drafts: list[int],
             proposer: str = DRAFT) -> tuple[Tensor, Tensor]:
    """The draft slot's proposals [B, width] and the distributions they were drawn from [B, width, V] (columns
    past a row's count are padding). The first forward feeds each row's last token, and before it the one the
    draft has not computed yet where it is behind (sequence.py); then a burst draws the remaining proposals.
    The draft computes and samples on its own device; the proposals come back to the runner's, the
    distributions stay on the draft's (a tandem step does not read them)."""
    draft = runner.slots.get(proposer)
    if draft is None:
        raise ValueError(f"a verify step without proposals needs a {proposer!r} model slot")
    behind = [seq.draft_behind for seq in seqs]
    first = build_decode_plan(seqs, [2] * len(seqs), runner.block_size, runner.num_blocks, runner.max_model_len,
                              back=1)
    ids = [t for seq, lag in zip(seqs, behind) for t in seq.token_ids[len(seq.token_ids) - 1 - lag:]]
    last_rows = np.cumsum([lag + 1 for lag in behind]) - 1
    width = max(1, max(drafts))
    device = draft.device
    tokens = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
    probs = torch.zeros(len(seqs), width, draft.spec.vocab_size, device=device)
    with eval_mode(draft.modules):
        run_step, _ = draft.decode_steps(as_one_step(first, ids, keep=np.array([behind, [1] * len(seqs)], bool)))
        hidden = run_step(0, None)[_index(last_rows.tolist(), device)]
        tokens[:, 0], probs[:, 0] = _draft_sample(runner, draft, hidden, seqs)
        rows = [i for i, d in enumerate(drafts) if d > 1]  # rows with more to propose
        if rows:
            rest = build_decode_plan([seqs[i] for i in rows], [drafts[i] - 1 for i in rows], runner.block_size,
                                     runner.num_blocks, runner.max_model_len, back=-1)
            run_step, _ = draft.decode_steps(rest)
            index = _index(rows, device)
            last = tokens[index, 0]
            for j in range(rest.num_steps):
                last, p = _draft_sample(runner, draft, run_step(j, last), [seqs[i] for i in rows])
                tokens[index, j + 1], probs[index, j + 1] = last, p
    return move(tokens, runner.device), probs


def _draft_sample(runner: ModelRunner, draft: ModelSlot, hidden: Tensor,
                  seqs: Seq[Sequence]) -> tuple[Tensor, Tensor]:
    sampler = runner.sampler_for(draft)
    with draft.on_device():
        return sample_with_probs(draft.logits(hidden), sampler.temperatures(seqs), sampler.generator(seqs))


def _host_proposals(feed: Seq[Seq[int]], vocab: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Proposals known on the host, padded with -1 to at least one column, as tokens [B, width] and the one-hot
    distributions [B, width, V] a deterministic proposer draws from."""
    width = max(1, max(len(f) for f in feed))
    host = torch.full((len(feed), width), -1, dtype=torch.long)
    for i, f in enumerate(feed):
        host[i, :len(f)] = torch.tensor(list(f), dtype=torch.long)
    tokens = copy_to_device(host, device)
    probs = torch.zeros(len(feed), width, vocab, device=device)
    probs.scatter_(-1, tokens.clamp(min=0).unsqueeze(-1), 1.0)
    return tokens, probs


def _index(values: list[int], device: torch.device) -> Tensor:
    """Host ints as a long tensor on the device (through pinned memory: no wait for the work in flight)."""
    return copy_to_device(torch.tensor(values, dtype=torch.long), device)


def _packed(drafts: list[int], width: int) -> list[int]:
    """Flat index, in a [B, width] layout, of each row's last token and its proposals, row by row."""
    return [i * width + j for i, d in enumerate(drafts) for j in range(d + 1)]
