"""Decode throughput: tandemrl's engine vs Hugging Face `generate`, in one run, plus the memory-bandwidth floor.

Random weights of a real architecture, EOS ignored so every sequence decodes exactly --new-tokens tokens.
GPU:  python bench/engine_throughput.py --arch qwen2.5-0.5b            (batches 1, 8, 64, 256; HF at 256)
      python -m bench.engine_throughput --arch qwen2.5-7b --batches 32 --prompt-len 1024 --new-tokens 4096 --skip-hf
      ... --lora-rank 64 (a peft adapter on every linear layer), --kv-cache-dtype fp8_e4m3 (with --logprob-drift:
      the same requests on a model-dtype cache, log-prob differences reported)
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
from tandemrl.models.lora import LoraSettings, apply_lora
from tandemrl.models.unwrap import unwrap_causal_lm
from tandemrl.types import Request, Rollout, SamplingParams


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


def engine_run(backend: EngineBackend, prompts: list[list[int]], new_tokens: int) -> list[Rollout]:
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=0)
    rollouts = backend.generate([Request(str(i), p, params) for i, p in enumerate(prompts)])
    assert all(len(r.completion_ids) == new_tokens for r in rollouts), "a sequence stopped early"
    return rollouts


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


def decode_floor_s(model, batch: int, prompt_len: int, new_tokens: int, bandwidth: float,
                   kv_element_size: int) -> float:
    """Per decode step, the bytes a step must read at the measured bandwidth: every weight once (adapters
    included), except an untied input embedding, of which a step reads only its rows, plus the K/V the attention
    reads: each sequence's context at the average decode step (prompt + (new_tokens - 1) / 2 + 1 tokens), every
    layer, in the cache's element size."""
    lm = unwrap_causal_lm(model)
    cfg = lm.config
    params = {id(p): p for p in model.parameters()}
    embed = lm.get_input_embeddings().weight
    if lm.get_output_embeddings().weight is not embed:  # untied: the step gathers `batch` rows of it
        params.pop(id(embed))
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    weight_bytes += batch * embed.shape[1] * embed.element_size()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * kv_element_size
    mean_context = prompt_len + (new_tokens - 1) / 2 + 1
    return (weight_bytes + batch * mean_context * kv_per_token) / bandwidth


def logprob_drift(runs: list[list[Rollout]]) -> dict:
    """Two rollouts of the same seeded requests (a cache dtype against the model's): over each completion's
    tokens up to where the two first differ, the log-prob differences; and the share of tokens in those prefixes."""
    diffs, total = [], 0
    for a, b in zip(*runs):
        total += len(a.completion_ids)
        for tok_a, tok_b, lp_a, lp_b in zip(a.completion_ids, b.completion_ids, a.logprobs, b.logprobs):
            if tok_a != tok_b:
                break
            diffs.append(abs(lp_a - lp_b))
    d = torch.tensor(diffs or [float("nan")], dtype=torch.float64)
    return {"tokens_compared": len(diffs), "share_before_divergence": len(diffs) / max(1, total),
            "mean_abs_logprob_diff": d.mean().item(), "p99_abs_logprob_diff": d.quantile(0.99).item(),
            "max_abs_logprob_diff": d.max().item()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--hf-batch", type=int, default=256, help="batch for the HF generate comparison")
    parser.add_argument("--skip-hf", action="store_true", help="engine only (A/B runs of the engine)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--kv-gib", type=float, default=8.0)
    parser.add_argument("--warmup-tokens", type=int, default=None,
                        help="new tokens of each batch's warm-up run (default --new-tokens; the Triton attention's "
                             "graphs have one table width, so a short warm-up compiles and captures all)")
    parser.add_argument("--decode-steps", type=int, default=EngineConfig.decode_steps,
                        help="decode steps per engine step (EngineConfig.decode_steps)")
    parser.add_argument("--sync", action="store_true", help="EngineConfig.async_scheduling off (for an A/B)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="wrap the model in a peft LoRA adapter of this rank on every linear layer (0: none)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="EngineConfig.kv_cache_dtype")
    parser.add_argument("--logprob-drift", action="store_true",
                        help="with --kv-cache-dtype other than auto: rerun the first batch's timed requests on a "
                             "model-dtype cache and report the log-prob differences")
    parser.add_argument("--out", type=Path, default=Path("bench/out/engine_throughput.json"))
    return parser.parse_args(argv)


def make_backend(model: torch.nn.Module, args: argparse.Namespace, device: torch.device,
                 kv_cache_dtype: str) -> EngineBackend:
    """An engine with a KV pool of --kv-gib, sized by a one-block probe."""
    probe = EngineBackend(model, None, EngineConfig(num_blocks=1, kv_cache_dtype=kv_cache_dtype), device=device)
    num_blocks = int(args.kv_gib * 2**30 // probe.runner.bytes_per_block(16))
    probe.close()
    return EngineBackend(model, None, EngineConfig(num_blocks=num_blocks, max_num_seqs=max(args.batches),
                                                   decode_steps=args.decode_steps, kv_cache_dtype=kv_cache_dtype,
                                                   async_scheduling=not args.sync), device=device)


def time_batch(backend: EngineBackend, model: torch.nn.Module, args: argparse.Namespace, batch: int, vocab: int,
               device: torch.device, bandwidth: float) -> tuple[dict, list, list]:
    """One batch's row (tok/s, prefill, decode step against the floor), its timed prompts and their outputs."""
    # Warm-up at the full shape, so every kernel is compiled and every graph captured before timing (Triton's
    # one-off compiles otherwise added up to 1.5 s, H100 2026-11-22). The timed runs use prompts of their own:
    # the prefix cache holds none of them, so the engine prefills every prompt, as HF generate does.
    warmup = random_prompts(batch, args.prompt_len, vocab, seed=batch)
    engine_run(backend, warmup, args.warmup_tokens or args.new_tokens)
    prompts = random_prompts(batch, args.prompt_len, vocab, seed=batch + 1)
    outputs = []
    total = timed(device, lambda: outputs.append(engine_run(backend, prompts, args.new_tokens)))
    fresh = random_prompts(batch, args.prompt_len, vocab, seed=batch + 2)
    prefill = timed(device, lambda: engine_run(backend, fresh, 1))
    step = (total - prefill) / (args.new_tokens - 1)
    kv_element_size = backend.runner.slots[next(iter(backend.runner.slots))].k_caches[0].element_size()
    floor = decode_floor_s(model, batch, args.prompt_len, args.new_tokens, bandwidth, kv_element_size)
    row = {"batch": batch, "engine_s": total, "prefill_s": prefill, "engine_tok_s": batch * args.new_tokens / total,
           "decode_step_ms": step * 1e3, "floor_ms": floor * 1e3, "step_over_floor": step / floor,
           "stats": backend.stats()}
    print(f"engine batch {batch}: {row['engine_tok_s']:.0f} tok/s, prefill {prefill * 1e3:.0f} ms, "
          f"step {step * 1e3:.2f} ms, floor {floor * 1e3:.2f} ms, ratio {step / floor:.2f}", flush=True)
    return row, prompts, outputs[0]


def hf_seconds(model: torch.nn.Module, args: argparse.Namespace, vocab: int, device: torch.device) -> float:
    """HF generate's time at --hf-batch, after the same full-shape warm-up."""
    hf_prompts = random_prompts(args.hf_batch, args.prompt_len, vocab, seed=args.hf_batch)
    hf_run(model, hf_prompts, args.new_tokens, device)
    return timed(device, lambda: hf_run(model, hf_prompts, args.new_tokens, device))


def print_summary(result: dict, rows: list[dict], bandwidth: float, hf_tok_s: float | None, hf_batch: int) -> None:
    print(f"measured bandwidth {bandwidth / 1e9:.0f} GB/s; HF generate batch {hf_batch}: "
          + (f"{hf_tok_s:.0f} tok/s" if hf_tok_s else "skipped"))
    print("| batch | engine tok/s | decode step ms | floor ms | step/floor |")
    for r in rows:
        print(f"| {r['batch']} | {r['engine_tok_s']:.0f} | {r['decode_step_ms']:.2f} | {r['floor_ms']:.2f} | "
              f"{r['step_over_floor']:.2f} |")
    if result["speedup_vs_hf"]:
        print(f"engine / HF generate at batch {hf_batch}: {result['speedup_vs_hf']:.1f}x")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, gradient_checkpointing=False, init_on_device=True).eval()
    if args.lora_rank:  # peft's defaults: float32 adapters on a bf16 model, B zero (the compute is the same)
        model = apply_lora(model, LoraSettings(rank=args.lora_rank, alpha=2 * args.lora_rank)).eval()
    vocab = unwrap_causal_lm(model).config.vocab_size

    backend = make_backend(model, args, device, args.kv_cache_dtype)
    bandwidth = measured_bandwidth(device)
    rows, drift_input = [], None
    for batch in args.batches:
        row, prompts, output = time_batch(backend, model, args, batch, vocab, device, bandwidth)
        rows.append(row)
        drift_input = drift_input or (prompts, output)
    backend.close()
    drift = None
    if args.logprob_drift and args.kv_cache_dtype != "auto":
        reference = make_backend(model, args, device, "auto")
        drift = logprob_drift([drift_input[1], engine_run(reference, drift_input[0], args.new_tokens)])
        reference.close()
        print(f"log-prob drift of the {args.kv_cache_dtype} cache against {dtype}: {drift}", flush=True)
    hf_s = None if args.skip_hf else hf_seconds(model, args, vocab, device)
    hf_tok_s = args.hf_batch * args.new_tokens / hf_s if hf_s else None
    engine_at_hf = next((r for r in rows if r["batch"] == args.hf_batch), None) if hf_tok_s else None
    result = {
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "arch": args.arch, "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens, "decode_steps": args.decode_steps, "async_scheduling": not args.sync,
        "lora_rank": args.lora_rank, "kv_cache_dtype": args.kv_cache_dtype, "logprob_drift": drift,
        "bandwidth_gb_s": bandwidth / 1e9, "engine": rows,
        "hf": {"batch": args.hf_batch, "seconds": hf_s, "tok_s": hf_tok_s},
        "speedup_vs_hf": engine_at_hf["engine_tok_s"] / hf_tok_s if engine_at_hf else None,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result, rows, bandwidth, hf_tok_s, args.hf_batch)


if __name__ == "__main__":
    main()
