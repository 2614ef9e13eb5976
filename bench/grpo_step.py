"""One GRPO step (rollout + update) on a random-weight model of a real architecture; prints a table, writes JSON.

Speed does not depend on the weights' values, so random weights and a fixed output length (EOS ignored) give the
real cost. Usage (GPU): python bench/grpo_step.py --arch qwen2.5-0.5b --out bench/out/grpo_step.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from tandemrl.algo.advantages import ADVANTAGES
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.backends.hf_backend import HFBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.config import TrainConfig
from tandemrl.models.compile import compile_decoder_layers
from tandemrl.models.varlen_attention import VARLEN, register_varlen_attention
from tandemrl.train.batch import build_batch
from tandemrl.train.optim import build_optimizer, build_scheduler
from tandemrl.train.update import policy_update
from tandemrl.types import Request, SamplingParams

ARCHITECTURES = {
    # Qwen2.5-0.5B's published configuration.
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Qwen2.5-1.5B's published configuration (a speculative-decoding target for the 0.5B draft: same vocabulary).
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Qwen2.5-7B's published configuration (engine_throughput's large rows; multi_gpu builds it on the CPU).
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # Qwen3-0.6B's published configuration (tandem's benchmark pair: two of them).
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # SmolLM2-135M(-Instruct)'s published configuration (Llama; issue 17's real model has these shapes).
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100_000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "tiny-qwen3": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048),
    # Small ones for a quick CPU check of the scripts themselves.
    "tiny-draft": dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048),
    # Qwen2.5-0.5B's tied embeddings at the tiny size (bench/serve.py's CPU smoke: the weight pushes see the tie).
    "tiny-tied": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      tie_word_embeddings=True),
}


@dataclass
class StepTiming:
    rollout_s: float
    train_s: float
    peak_gib: float
    tokens: int
    allocated_before_sleep_gib: float  # GPU memory held by tensors around the backend's sleep/wake
    allocated_after_sleep_gib: float
    allocated_after_wake_gib: float
    wake_s: float = 0.0  # of train_s: the backend's wake (KV pools allocated again, parked graphs checked)


def build_model(arch: str, device: torch.device, dtype: torch.dtype, gradient_checkpointing: bool,
                attn_implementation: str | None = None, init_on_device: bool = False, layers: int | None = None):
    """Random weights of `arch`; init_on_device: drawn on `device` (a 7B model's CPU init takes a minute; other
    values than a CPU init's); layers: that many decoder layers instead of the architecture's."""
    torch.manual_seed(0)
    config_class = Qwen3Config if "qwen3" in arch else LlamaConfig if arch.startswith("smollm2") else Qwen2Config
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if attn_implementation == VARLEN:
        register_varlen_attention()
    config = config_class(**{**ARCHITECTURES[arch], **({"num_hidden_layers": layers} if layers else {})})
    with torch.device(device if init_on_device else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **extra)
    model = model.to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def one_step(model, backend, optimizer, scheduler, cfg, args, device, seed: int) -> StepTiming:
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (args.prompts, args.prompt_len), generator=gen).tolist()
    params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, seed=seed)
    requests = [Request(f"{i}-{j}", p, params) for i, p in enumerate(prompts) for j in range(args.group)]
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device) if device.type == "cuda" else None
    start = time.perf_counter()
    rollouts = backend.generate(requests)
    _sync(device)
    rollout_s = time.perf_counter() - start
    rewards = torch.rand(len(rollouts), generator=gen)
    advantages = ADVANTAGES.get("grpo")(rewards, torch.ones_like(rewards, dtype=torch.bool), args.group)
    start = time.perf_counter()
    before_sleep = _allocated_gib(device)
    backend.sleep()
    after_sleep = _allocated_gib(device)
    batch = build_batch(rollouts, advantages, pad_id=0, device=device)
    policy_update(model, batch, optimizer, scheduler, cfg, temperature=1.0, max_completion_length=args.new_tokens)
    _sync(device)
    woken = time.perf_counter()
    backend.wake()
    _sync(device)
    train_s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return StepTiming(rollout_s, train_s, peak, sum(len(r.completion_ids) for r in rollouts),
                      before_sleep, after_sleep, _allocated_gib(device), time.perf_counter() - woken)


def make_backend(args: argparse.Namespace, model, device: torch.device):
    if args.backend == "hf":
        return HFBackend(model, None, max_batch_size=args.prompts * args.group, device=device)
    per_block = 2 * model.config.num_hidden_layers * 16 * model.config.num_key_value_heads * \
        (model.config.hidden_size // model.config.num_attention_heads) * model.dtype.itemsize
    num_blocks = int(args.kv_gib * 2**30 // per_block)
    return EngineBackend(model, None, EngineConfig(num_blocks=num_blocks), device=device)


def _allocated_gib(device: torch.device) -> float:
    return torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def add_step_shape_args(parser: argparse.ArgumentParser, arch: str = "qwen2.5-0.5b", repeats: int = 2,
                        prompts_help: str | None = None) -> None:
    """The GRPO step's shape (8 prompts x 8 samples x 512 new tokens after 128-token prompts by default), shared
    by the benches that time a step."""
    parser.add_argument("--arch", default=arch, choices=sorted(ARCHITECTURES))
    parser.add_argument("--prompts", type=int, default=8, help=prompts_help)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_step_shape_args(parser)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--backend", choices=["hf", "engine"], default="hf")
    parser.add_argument("--kv-gib", type=float, default=1.0, help="engine KV cache size")
    parser.add_argument("--attn", default=None, help="model.attn_implementation (default: transformers' choice)")
    parser.add_argument("--compile", action="store_true", help="model.compile: the decoder layers compiled for the "
                        "update (the warm-up step pays the compile: cold_train_s)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/grpo_step.json"))
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, args.gradient_checkpointing, args.attn)
    if args.compile:
        compile_decoder_layers(model)
    backend = make_backend(args, model, device)
    cfg = TrainConfig(lr=1e-6, micro_batch_size=args.micro_batch, max_steps=args.repeats + 1)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg)
    # Warm-up at full shape: allocator pools, kernels and the optimizer state are all in place before timing.
    warm_up = one_step(model, backend, optimizer, scheduler, cfg, args, device, seed=1000)
    timings = [one_step(model, backend, optimizer, scheduler, cfg, args, device, seed=s) for s in range(args.repeats)]
    # The median step (not the best): machines and runs vary by 10-30 % in the update's time.
    median = sorted(timings, key=lambda t: t.rollout_s + t.train_s)[len(timings) // 2]
    result = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "arch": args.arch, "backend": args.backend, "prompts": args.prompts, "group": args.group, "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens, "micro_batch": args.micro_batch,
        "attn_implementation": model.config._attn_implementation,
        "gradient_checkpointing": args.gradient_checkpointing, "compile": args.compile,
        "cold_train_s": warm_up.train_s,  # the warm-up step's update: with --compile, the cold compile's time too
        "runs": [t.__dict__ for t in timings],
        "rollout_s": median.rollout_s, "train_s": median.train_s, "step_s": median.rollout_s + median.train_s,
        "peak_gib": max(t.peak_gib for t in timings),
        "rollout_tokens_per_s": median.tokens / median.rollout_s,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    last = timings[-1]
    print(f"memory allocated: before sleep {last.allocated_before_sleep_gib:.2f} GiB, after sleep "
          f"{last.allocated_after_sleep_gib:.2f} GiB, after wake {last.allocated_after_wake_gib:.2f} GiB")
    print(f"| device | backend | arch | attention | shape | rollout s | train s | step s | peak GiB | rollout tok/s |")
    print(f"| {result['device']} | {args.backend} | {args.arch} | {result['attn_implementation']} | "
          f"{args.prompts}x{args.group}x{args.new_tokens} | "
          f"{median.rollout_s:.2f} | {median.train_s:.2f} | {result['step_s']:.2f} | {result['peak_gib']:.1f} | "
          f"{result['rollout_tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main()
