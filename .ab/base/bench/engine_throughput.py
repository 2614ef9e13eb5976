"""Decode throughput: tandemrl's engine vs Hugging Face `generate`, in one run, plus the memory-bandwidth floor.

Random weights of a real architecture, EOS ignored so every sequence decodes exactly --new-tokens tokens.
GPU:  python bench/engine_throughput.py --arch qwen2.5-0.5b            (batches 1, 8, 64, 256; HF at 256)
CPU:  python bench/engine_throughput.py --arch tiny --batches 8 --new-tokens 32 --prompt-len 16 --hf-batch 8
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import torch

from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.types import Request, SamplingParams


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).tolist()


def timed(device: torch.device, fn) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def engine_run(backend: EngineBackend, prompts: list[list[int]], new_tokens: int) -> None:
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=0)
    rollouts = backend.generate([Request(str(i), p, params) for i, p in enumerate(prompts)])
    assert all(len(r.completion_ids) == new_tokens for r in rollouts), "a sequence stopped early"


def hf_run(model, prompts: list[list[int]], new_tokens: int, device: torch.device) -> None:
    ids = torch.tensor(prompts, device=device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=True, top_k=0, pad_token_id=0)
    assert out.shape[1] == ids.shape[1] + new_tokens


def measured_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy (read + write), the ceiling the floor is computed against."""
    if device.type != "cuda":
        return float("nan")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = min(timed(device, lambda: dst.copy_(src)) for _ in range(10))
    return 2 * src.numel() / seconds


def decode_floor_s(model, batch: int, prompt_len: int, new_tokens: int, bandwidth: float) -> float:
    """Per decode step: every weight byte once plus the KV cache read at the average context length."""
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * model.dtype.itemsize
    mean_context = prompt_len + new_tokens / 2
    return (weight_bytes + batch * mean_context * kv_per_token) / bandwidth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--hf-batch", type=int, default=256, help="batch for the HF generate comparison")
    parser.add_argument("--skip-hf", action="store_true", help="engine only (A/B runs of the engine)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--kv-gib", type=float, default=8.0)
    parser.add_argument("--decode-steps", type=int, default=EngineConfig.decode_steps,
                        help="decode steps per engine step (EngineConfig.decode_steps)")
    parser.add_argument("--sync", action="store_true", help="EngineConfig.async_scheduling off (for an A/B)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/engine_throughput.json"))
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, gradient_checkpointing=False).eval()
    vocab = model.config.vocab_size
    probe = EngineBackend(model, None, EngineConfig(num_blocks=1), device=device)
    num_blocks = int(args.kv_gib * 2**30 // probe.runner.bytes_per_block(16))
    probe.close()
    backend = EngineBackend(model, None, EngineConfig(num_blocks=num_blocks, max_num_seqs=max(args.batches),
                                                          decode_steps=args.decode_steps,
                                                          async_scheduling=not args.sync),
                            device=device)
    bandwidth = measured_bandwidth(device)
    rows = []
    for batch in args.batches:
        # Warm-up at the full shape, so every kernel is compiled and every graph captured before timing (Triton's
        # one-off compiles otherwise added up to 1.5 s, H100 2026-11-22). The timed runs use prompts of their own:
        # the prefix cache holds none of them, so the engine prefills every prompt, as HF generate does.
        engine_run(backend, random_prompts(batch, args.prompt_len, vocab, seed=batch), args.new_tokens)
        prompts = random_prompts(batch, args.prompt_len, vocab, seed=batch + 1)
        total = timed(device, lambda: engine_run(backend, prompts, args.new_tokens))
        fresh = random_prompts(batch, args.prompt_len, vocab, seed=batch + 2)
        prefill = timed(device, lambda: engine_run(backend, fresh, 1))
        step = (total - prefill) / (args.new_tokens - 1)
        floor = decode_floor_s(model, batch, args.prompt_len, args.new_tokens, bandwidth)
        rows.append({"batch": batch, "engine_s": total, "prefill_s": prefill,
                     "engine_tok_s": batch * args.new_tokens / total, "decode_step_ms": step * 1e3,
                     "floor_ms": floor * 1e3, "step_over_floor": step / floor, "stats": backend.stats()})
        print(f"engine batch {batch}: {rows[-1]['engine_tok_s']:.0f} tok/s, prefill {prefill * 1e3:.0f} ms, "
              f"step {step * 1e3:.2f} ms, floor {floor * 1e3:.2f} ms, ratio {step / floor:.2f}", flush=True)
    backend.close()
    hf_s = hf_tok_s = None
    if not args.skip_hf:
        hf_prompts = random_prompts(args.hf_batch, args.prompt_len, vocab, seed=args.hf_batch)
        hf_run(model, hf_prompts, args.new_tokens, device)  # the same full-shape warm-up
        hf_s = timed(device, lambda: hf_run(model, hf_prompts, args.new_tokens, device))
        hf_tok_s = args.hf_batch * args.new_tokens / hf_s
    engine_at_hf = next((r for r in rows if r["batch"] == args.hf_batch), None) if hf_tok_s else None
    result = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "arch": args.arch, "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens, "decode_steps": args.decode_steps, "async_scheduling": not args.sync,
        "bandwidth_gb_s": bandwidth / 1e9, "engine": rows,
        "hf": {"batch": args.hf_batch, "seconds": hf_s, "tok_s": hf_tok_s},
        "speedup_vs_hf": engine_at_hf["engine_tok_s"] / hf_tok_s if engine_at_hf else None,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"measured bandwidth {bandwidth / 1e9:.0f} GB/s; HF generate batch {args.hf_batch}: "
          + (f"{hf_tok_s:.0f} tok/s" if hf_tok_s else "skipped"))
    print("| batch | engine tok/s | decode step ms | floor ms | step/floor |")
    for r in rows:
        print(f"| {r['batch']} | {r['engine_tok_s']:.0f} | {r['decode_step_ms']:.2f} | {r['floor_ms']:.2f} | "
              f"{r['step_over_floor']:.2f} |")
    if result["speedup_vs_hf"]:
        print(f"engine / HF generate at batch {args.hf_batch}: {result['speedup_vs_hf']:.1f}x")


if __name__ == "__main__":
    main()
