"""A PREFILL step (runner.py): every model slot ingests the rows' uncached tokens in one packed forward (each model's
cache holds every token of the sequence, whoever samples from it), and each row gets one token after its last: the
target's sample, or, in a tandem prefill, the frozen model's where the row's first position is its (the ``forced``
acceptance rule, acceptance.py, with the target's log-prob of it).
"""

from __future__ import annotations

from typing import Sequence as Seq

import numpy as np
import torch
from torch import Tensor

from tandemrl.engine.kernels.paged_kv import PrefillMeta
from tandemrl.engine.model.acceptance import Verdict, keep_forced
from tandemrl.engine.model.attention import build_prefill_meta
from tandemrl.engine.model.decode_plan import block_tables, int64_array
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import PendingTokens, copy_to_device
from tandemrl.engine.model.placement import move
from tandemrl.engine.model.sampler import sample_with_probs
from tandemrl.engine.model.slot import ModelSlot, eval_mode
from tandemrl.engine.sequence import Sequence
from tandemrl.engine.step import PrefillStep


def launch_prefill(context: LaunchContext, slot: ModelSlot, plan: PrefillStep) -> tuple[PendingTokens, Tensor]:
    """The step's pending tokens, and its tokens [B, 1] on the device (the next launch may feed on them)."""
    hidden = _prefill(context, plan.seqs)
    if plan.forced is None:
        tokens, logprobs = context.sampler.for_subsets(plan.seqs)(slot.logits(hidden[slot.name]), slice(None))
        return PendingTokens(tokens[:, None], logprobs[:, None], plan.num_tokens), tokens[:, None]
    proposer = context.slots[plan.proposer]
    sampler = context.sampler_for(proposer)  # on the proposer's device: only its tokens cross
    with proposer.on_device():
        frozen, _ = sample_with_probs(proposer.logits(hidden[plan.proposer]), sampler.temperatures(plan.seqs),
                                      sampler.generator(plan.seqs))
    frozen = move(frozen, context.device)
    forced = copy_to_device(torch.tensor(plan.forced, dtype=torch.long), context.device)
    result, own = keep_forced(Verdict(slot.logits(hidden[slot.name])[:, None], frozen[:, None], forced, None,
                                      context.sampler.temperatures(plan.seqs), context.sampler.generator(plan.seqs),
                                      False))
    pending = PendingTokens(result.tokens, result.logprobs, plan.num_tokens, accepted=result.num_accepted, own=own)
    return pending, result.tokens


def _prefill(context: LaunchContext, seqs: Seq[Sequence]) -> dict[str, Tensor]:
    """Per slot, the hidden states of each row's last token after every slot ingested the uncached tokens."""
    ids: list[int] = []
    query_lens, context_lens = [], []
    for seq in seqs:
        if seq.num_pending:
            raise RuntimeError(f"sequence {seq.seq_id} cannot be prefilled with {seq.num_pending} tokens pending")
        # A fully cached sequence still recomputes its last token: we need that position's logits.
        start = min(seq.num_cached_tokens, seq.num_tokens - 1)
        ids += seq.token_ids[start:]
        query_lens.append(seq.num_tokens - start)
        context_lens.append(seq.num_tokens)
    last = int64_array(context_lens) - 1
    for i in np.flatnonzero((last < 0) | (last >= context.max_model_len)):
        raise ValueError(f"sequence {seqs[i].seq_id} has {last[i] + 1} tokens: a prefill needs 1 to max_model_len "
                         f"{context.max_model_len}")
    # rows padded with the scratch block (a valid id nobody owns); ValueError for a short table or a bad block id
    tables = torch.from_numpy(block_tables(seqs, last, context.block_size, context.num_blocks))
    host_ids = torch.tensor(ids, dtype=torch.long)
    inputs: dict[tuple[torch.device, bool], tuple[Tensor, PrefillMeta]] = {}  # staged once per device
    hidden = {}
    for name, other in context.slots.items():
        key = (other.device, other.use_triton)
        if key not in inputs:
            inputs[key] = (copy_to_device(host_ids, other.device),
                           build_prefill_meta(query_lens, context_lens, tables, context.block_size, other.device,
                                              use_triton=other.use_triton))
        input_ids, meta = inputs[key]
        with eval_mode(other.modules):
            hidden[name] = other.forward(input_ids, meta, rows=meta.last_rows)
    return hidden
