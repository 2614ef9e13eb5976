"""Does the packed update recompile flex_attention for every micro-batch length? Counts torch.compile graphs and
BlockMask builds over updates whose micro-batches pack different token totals (issue 38's suspect 1).

CPU (forward only: FlexAttention has no CPU backward): python -m bench.flex_recompiles
GPU (the training update): python -m bench.flex_recompiles --model qwen2.5-1.5b --rows 64 --budget 16384
On torch 2.13 CPU, tiny: 4 graphs after the first update, 6 after the second (create_block_mask and flex_attention
each: static, then dynamic after one length change, then the 1-block case), none after: bounded, not per length.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import transformers.masking_utils as masking_utils
from torch._dynamo.utils import counters

from bench.grpo_step import build_model
from tandemrl.config import TrainConfig
from tandemrl.train.batch import build_batch
from tandemrl.train.logprobs import batch_logprobs
from tandemrl.train.micro_batches import micro_batch_limits, plan_micro_batches
from tandemrl.train.optim import build_optimizer, build_scheduler
from tandemrl.train.update import policy_update
from tandemrl.types import Rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--max-completion", type=int, default=120)
    parser.add_argument("--budget", type=int, default=200, help="train.max_tokens_per_micro_batch")
    parser.add_argument("--updates", type=int, default=4)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.model, device, dtype, False, "flex_attention")
    cfg = TrainConfig(lr=1e-6, max_steps=args.updates + 1, max_tokens_per_micro_batch=args.budget)
    optimizer, builds = build_optimizer(model, cfg), _count_block_mask_builds()
    scheduler = build_scheduler(optimizer, cfg)
    for update in range(args.updates):
        batch = _batch(update, args, model.config.vocab_size, device)
        lengths = batch.sequence_lengths().tolist()
        totals = [sum(lengths[r] for r in rows) for rows in plan_micro_batches(lengths, micro_batch_limits(cfg, model))]
        start = time.perf_counter()
        if device.type == "cuda":
            policy_update(model, batch, optimizer, scheduler, cfg, 1.0, args.max_completion)
            torch.cuda.synchronize()
        else:
            batch_logprobs(model, batch, 1.0, cfg)
        print(f"update {update}: micro-batch tokens {totals}, {time.perf_counter() - start:.2f} s, "
              f"graphs compiled {counters['stats']['unique_graphs']}, block masks built {builds[0]}", flush=True)


def _count_block_mask_builds() -> list[int]:
    builds, create = [0], masking_utils.create_block_mask

    def counted(*args, **kwargs):
        builds[0] += 1
        return create(*args, **kwargs)

    masking_utils.create_block_mask = counted
    return builds


def _batch(seed: int, args: argparse.Namespace, vocab: int, device: torch.device):
    rng = random.Random(seed)
    rollouts = []
    for i in range(args.rows):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(3, 10))]
        completion = [rng.randrange(vocab) for _ in range(rng.randint(1, args.max_completion))]
        rollouts.append(Rollout(str(i), prompt, completion, [-1.0] * len(completion), "stop"))
    return build_batch(rollouts, torch.randn(args.rows), pad_id=0, device=device)


if __name__ == "__main__":
    main()
