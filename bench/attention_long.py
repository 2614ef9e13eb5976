"""Decode attention at long contexts: microseconds per layer and the bandwidth its K/V reads reach, for the split
count the engine picks against fixed ones (1: the single pass these shapes ran before the long-context split), with
bf16 and fp8 caches. GPU only; one CUDA graph per variant, the cache far larger than L2.

python -m bench.attention_long --out $OUT/attention_long.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from bench.kernel_sweep import per_layer_us
from tandemrl.engine.kernels import attention_tiles
from tandemrl.engine.kernels import triton_attention as ta

# (name, query heads, KV heads, head_dim, rows, context): the long rows and a short one (no regression)
SHAPES = [
    ("1.5b b64 ctx 5120", 12, 2, 128, 64, 5120),  # mean context of 1024 + 8192
    ("7b b32 ctx 3072", 28, 4, 128, 32, 3072),  # mean context of 1024 + 4096
    ("1.5b b64 ctx 640", 12, 2, 128, 64, 640),  # 128 + 512: one partition, written directly
    ("0.5b b64 ctx 640", 14, 2, 64, 64, 640),
    ("1.5b b256 ctx 640", 12, 2, 128, 256, 640),
]
BLOCK = 16


def measure(name: str, heads: int, kv_heads: int, head_dim: int, rows: int, context: int,
            kv_dtype: torch.dtype) -> dict:
    width = -(-context // BLOCK) + 8  # padded wider than the context, as graphs are
    blocks = rows * width + 1
    k_cache = torch.randn(blocks, BLOCK, kv_heads, head_dim, device="cuda").to(kv_dtype)
    v_cache = torch.randn_like(k_cache, dtype=torch.float32).to(kv_dtype)
    tables = torch.randperm(blocks - 1, device="cuda")[:rows * width].view(rows, width)
    ctx = torch.full((rows,), context, device="cuda")
    q = torch.randn(rows, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    kv_bytes = 2 * rows * context * kv_heads * head_dim * k_cache.element_size()
    sms = attention_tiles.device_sm_count(q.device)
    picked = attention_tiles.decode_splits(rows, kv_heads, 32768 // BLOCK, BLOCK, sms)  # the engine's table
    variants = {"engine": dict(num_splits=picked), "single": dict(num_splits=1)}
    for splits in (2, 4, 8):
        variants[f"splits {splits}"] = dict(num_splits=splits)
    # single-pass tiles of twice the default's bytes: 128 tokens at head_dim 128, what ran before kv_tile_tokens
    variants["engine, tiles x2"] = dict(num_splits=picked,
                                        tiles=replace(attention_tiles.DEFAULT_DECODE_TILES, single_pass_block_n=256))
    row = {"shape": name, "kv_dtype": str(kv_dtype), "engine_splits": picked, "kv_mib": kv_bytes / 2**20}
    for label, kwargs in variants.items():
        us = per_layer_us(lambda _: ta.triton_paged_decode(q, k_cache, v_cache, tables, ctx, 0.1, None, **kwargs),
                          range(4))
        row[label] = {"us": round(us, 2), "gb_s": round(kv_bytes / us / 1e3, 1)}
    del k_cache, v_cache
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/out/attention_long.json"))
    args = parser.parse_args()
    rows = [measure(*shape, kv_dtype) for shape in SHAPES for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn)
            if kv_dtype == torch.bfloat16 or shape[-1] > 1024]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=2) + "\n")
    for r in rows:
        cells = ", ".join(f"{k} {v['us']} us ({v['gb_s']} GB/s)" for k, v in r.items() if isinstance(v, dict))
        print(f"{r['shape']} {r['kv_dtype']} (engine: {r['engine_splits']} splits): {cells}", flush=True)


if __name__ == "__main__":
    main()
