"""Greedy tokens of the engine against Hugging Face ``generate`` on a benchmark architecture (random weights, float32).

python -m bench.greedy_parity --arch smollm2-135m        # GPU (the engine's Triton kernels) or CPU
Prints how many of the prompts give identical tokens; exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.types import Request, SamplingParams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="smollm2-135m", choices=sorted(ARCHITECTURES))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args.arch, device, torch.float32, gradient_checkpointing=False).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size, (args.prompts, args.prompt_len), generator=gen)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    backend = EngineBackend(model, None, EngineConfig(num_blocks=512), device=device)
    engine = [r.completion_ids for r in backend.generate([Request(str(i), p.tolist(), params)
                                                          for i, p in enumerate(prompts)])]
    backend.close()
    with torch.inference_mode():
        ids = prompts.to(device)
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                            min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)[:, ids.shape[1]:]
    same = sum(e == h for e, h in zip(engine, hf.tolist()))
    print(f"{args.arch}: {same}/{args.prompts} prompts give identical greedy tokens ({args.new_tokens} tokens each)")
    return 0 if same == args.prompts else 1


if __name__ == "__main__":
    sys.exit(main())
