"""Greedy tokens of the engine against Hugging Face ``generate``: a benchmark architecture with random weights, or a
real model on GSM8K prompts rendered as its recipe renders them.

python -m bench.greedy_parity --arch smollm2-135m        # random weights, float32; GPU (Triton kernels) or CPU
python -m bench.greedy_parity --config examples/qwen-coder-0.5b-gsm8k.toml --data runs/data/gsm8k --prompts 16
    # the config's model (a GGUF too), its chat template and system prompt, the first N GSM8K test questions;
    # both sides stop at the model's end-of-sequence tokens, HF generates one prompt at a time (no padding)
Prints how many of the prompts give identical tokens (and, for each that differs, the first differing position);
``--json FILE`` writes the same; exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.backends.hf_backend import eos_token_ids
from tandemrl.engine.config import EngineConfig
from tandemrl.types import Request, SamplingParams


def random_weights(args: argparse.Namespace, device: torch.device) -> tuple[torch.nn.Module, None, list[list[int]]]:
    from bench.grpo_step import build_model

    model = build_model(args.arch, device, torch.float32, gradient_checkpointing=False).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size, (args.prompts, args.prompt_len), generator=gen)
    return model, None, prompts.tolist()


def gsm8k_prompts(args: argparse.Namespace, device: torch.device) -> tuple[torch.nn.Module, object, list[list[int]]]:
    """The config's model and tokenizer, and the first ``--prompts`` GSM8K test questions as training renders them."""
    from tandemrl.config import load_config
    from tandemrl.data.tasks import format_prompt, load_task
    from tandemrl.models.load import load_model, load_tokenizer

    cfg = load_config(args.config, [f'data.path="{args.data}"'] if args.data else [])
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    model = load_model(cfg.model.name_or_path, dtype=args.dtype, device=device).eval()
    samples = load_task("gsm8k", "test", path=cfg.data.path, limit=args.prompts)
    texts = [format_prompt(s, tokenizer, cfg.data.use_chat_template, cfg.data.system_prompt) for s in samples]
    return model, tokenizer, [tokenizer(t, add_special_tokens=False).input_ids for t in texts]


def hf_greedy(model: torch.nn.Module, prompt: list[int], new_tokens: int, eos: list[int] | None,
              device: torch.device) -> list[int]:
    """One prompt alone (no padding), greedy; with ``eos`` None it runs the full ``new_tokens``."""
    ids = torch.tensor([prompt], device=device)
    fixed = {"min_new_tokens": new_tokens, "eos_token_id": None} if eos is None else {"eos_token_id": eos}
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0, **fixed)
    tokens = out[0, len(prompt):].tolist()
    if eos is not None:  # up to and including the first eos, as the engine returns it
        cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
        tokens = tokens[:cut]
    return tokens


def first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="smollm2-135m", help="random-weight architecture (bench.grpo_step)")
    parser.add_argument("--config", type=Path, help="a recipe: its model and prompts instead of --arch")
    parser.add_argument("--data", help="GSM8K folder (train.jsonl / test.jsonl) for --config; default its data.path")
    parser.add_argument("--dtype", default="float32", help="model dtype with --config (float32: no near-tie flips)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, help="write the result here as JSON")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer, prompts = (gsm8k_prompts if args.config else random_weights)(args, device)
    eos = eos_token_ids(model, tokenizer) if tokenizer is not None else None
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=eos is None)
    backend = EngineBackend(model, tokenizer, EngineConfig(num_blocks=2048), device=device)
    engine = [r.completion_ids for r in backend.generate([Request(str(i), p, params) for i, p in enumerate(prompts)])]
    backend.close()
    hf = [hf_greedy(model, p, args.new_tokens, eos, device) for p in prompts]
    diffs = {i: first_difference(e, h) for i, (e, h) in enumerate(zip(engine, hf))}
    differing = {i: d for i, d in diffs.items() if d is not None}
    name = str(args.config) if args.config else args.arch
    print(f"{name}: {len(prompts) - len(differing)}/{len(prompts)} prompts give identical greedy tokens "
          f"(up to {args.new_tokens} tokens each, mean {sum(map(len, hf)) / len(hf):.0f})")
    for i, at in differing.items():
        print(f"  prompt {i}: first difference at token {at} (engine {len(engine[i])}, HF {len(hf[i])} tokens)")
    if args.json:
        args.json.write_text(json.dumps({"model": name, "prompts": len(prompts), "identical": len(prompts) -
                                         len(differing), "first_difference": differing, "device": str(device),
                                         "hf_tokens": [len(h) for h in hf]}, indent=1))
    if tokenizer is not None and hf:
        print("first completion (HF):", json.dumps(tokenizer.decode(hf[0])))
    return 0 if not differing else 1


if __name__ == "__main__":
    sys.exit(main())
