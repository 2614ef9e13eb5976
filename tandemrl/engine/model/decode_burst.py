"""A DECODE step of the target alone (runner.py): a burst of steps, each step's sampled tokens the next step's input
on the device, so the burst syncs with the host once, when its tokens are read back; on CUDA it replays CUDA graphs
per batch bucket (cuda_graphs.py). A row's first input, if still pending, is fed from the previous launch
(pending.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tandemrl.engine.model.decode_plan import build_decode_plan
from tandemrl.engine.model.launch_context import LaunchContext
from tandemrl.engine.model.pending import LastSamples, link_pending, resolve_pending
from tandemrl.engine.model.slot import ModelSlot
from tandemrl.engine.step import DecodeStep


def launch_decode_burst(context: LaunchContext, slot: ModelSlot, step: DecodeStep,
                        last: LastSamples | None) -> tuple[Tensor, Tensor]:
    """[B, K] tokens and log-probs of the burst, left on the device (no host sync)."""
    seqs = step.seqs
    plan = build_decode_plan(seqs, step.num_tokens, context.block_size, context.num_blocks, context.max_model_len)
    linked = link_pending(plan.ids, seqs, last)
    run_step, staged_ids = slot.decode_steps(plan)
    tokens = resolve_pending(staged_ids, last) if linked else None
    sample, every_row = context.sampler.for_subsets(seqs), slice(None)
    all_tokens, all_logprobs = [], []
    for j in range(plan.num_steps):
        tokens, logprobs = sample(slot.logits(run_step(j, tokens)), every_row)
        all_tokens.append(tokens)  # stacked once after the loop: no extra launches per step
        all_logprobs.append(logprobs)
    return torch.stack(all_tokens, 1), torch.stack(all_logprobs, 1)
