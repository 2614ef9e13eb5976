"""The LoRA shrink split along K (engine/kernels/lora_shrink.py): its slabs add up to x @ A^T, and the grouped
launches that read them (fused_linear) still compute what peft's modules do when K is split.
Kernel tests run on CUDA, or on the CPU under Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from tandemrl.engine.kernels import fused as fk
from tandemrl.engine.kernels import fused_linear as fl
from tandemrl.engine.kernels import lora_shrink as ls
from tests.engine.kernel_env import DEVICE, DTYPES, needs_kernels
from tests.engine.test_fused_linear import INTER, _lora_layer, _qkv_like_modules, _tols, _x


@pytest.mark.parametrize("rows, ranks, k, max_splits, expected", [
    # Qwen2.5-1.5B down_proj into the expand: 8 programs unsplit, 14 slices of 640 fill the SMs
    (64, (64,), 8960, ls.EXPAND_MAX_SPLITS, ls.ShrinkTiles(16, 14, 640)),
    (64, (64, 64, 64), 1536, ls.EPILOGUE_MAX_SPLITS, ls.ShrinkTiles(16, 2, 768)),  # q/k/v: 24 programs, 2 slices
    (256, (64,), 18944, ls.EXPAND_MAX_SPLITS, ls.ShrinkTiles(16, 5, 3840)),  # 7B down_proj: 32 programs, 5 slices
    (1, (16, 16), 3584, ls.EPILOGUE_MAX_SPLITS, ls.ShrinkTiles(16, 2, 1792)),  # 7B gate/up rank 16, batch 1
    (256, (64, 64, 64), 3584, ls.EXPAND_MAX_SPLITS, ls.ShrinkTiles(16, 2, 1792)),  # 7B q/k/v: 96 programs, 2 slices
    (64, (64,), 700, ls.EXPAND_MAX_SPLITS, ls.ShrinkTiles(16, 1, 768)),  # shorter than two slices of 512: whole
])
def test_shrink_tiles(rows, ranks, k, max_splits, expected):
    assert ls.shrink_tiles(rows, ranks, k, sms=132, max_splits=max_splits) == expected


@needs_kernels
@pytest.mark.parametrize("rows", [1, 17, 100])
@pytest.mark.parametrize("tiles", [{}, {"_BLOCK_M": 32, "_BLOCK_N": 64, "_BLOCK_K": 64},
                                   {"_BLOCK_M": 64, "_BLOCK_N": 16, "_STAGES": 2}])
def test_slabs_add_up_to_the_shrink(monkeypatch, rows, tiles):
    """Three adapters of odd ranks over a K split in uneven slices (the last one short, K not a multiple of the
    tile): the slabs' sum is x @ [A_1; A_2; A_3]^T; each slab holds only its slice's part. The engine's tiles and
    others bench.lora_shrink_sweep --tiles tries (wider than an adapter's rank: masked columns)."""
    for name, value in tiles.items():
        monkeypatch.setattr(ls, name, value)
    monkeypatch.setattr(ls, "MIN_K_PER_SPLIT", 256)
    gen = torch.Generator().manual_seed(0)
    k = 700
    x = torch.randn(rows, k, generator=gen).to(DEVICE)
    a = [torch.randn(r, k, generator=gen).to(DEVICE) for r in (8, 24, 5)]
    partials = ls.lora_shrink(x, a, sms=1024, max_splits=4)
    t = ls.shrink_tiles(rows, (8, 24, 5), k, 1024, max_splits=4)
    assert partials.shape == (t.splits, rows, 37) and t.splits == 2
    expected = x @ torch.cat(a).T
    torch.testing.assert_close(partials.sum(0), expected, atol=1e-4, rtol=1e-4)
    first = x[:, :t.k_per_split] @ torch.cat(a)[:, :t.k_per_split].T
    torch.testing.assert_close(partials[0], first, atol=1e-4, rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [3, 100])
@pytest.mark.parametrize("max_splits, min_k, expected", [
    (4, 32, [2, 2, 2, 4]),  # slices of 48 + 24 (hidden 72) and 64 + 64 + 64 + 8 (intermediate 200)
    (16, 16, [3, 3, 3, 7]),  # many short slices (bench.lora_shrink_sweep tries up to 16): 32 + 32 + 8, 6 x 32 + 8
])
def test_split_shrink_in_both_consumers_matches_peft(monkeypatch, dtype, rows, max_splits, min_k, expected):
    """With K split into several slabs (short splits forced at this layer's small sizes) q/k/v, gate/up (the grouped
    launch's epilogue) and the adapted o_proj / down_proj (lora_expand) still equal peft's modules: each consumer
    adds every slab of its rows."""
    monkeypatch.setattr(ls, "EPILOGUE_MAX_SPLITS", max_splits)
    monkeypatch.setattr(ls, "EXPAND_MAX_SPLITS", max_splits)
    monkeypatch.setattr(ls, "MIN_K_PER_SPLIT", min_k)
    monkeypatch.setattr(ls, "_BLOCK_K", 16)
    monkeypatch.setattr(fl, "_sm_count", lambda device: 1024)
    splits = []
    original = ls.lora_shrink

    def recorded(*args, **kwargs):
        partials = original(*args, **kwargs)
        splits.append(partials.shape[0])
        return partials

    monkeypatch.setattr(ls, "lora_shrink", recorded)
    model, layer = _lora_layer(dtype)
    attn, mlp = layer.self_attn, layer.mlp
    x, act = _x(rows, dtype), _x(rows, dtype, INTER)
    with torch.no_grad():
        _qkv_like_modules(attn, x, dtype)
        torch.testing.assert_close(fl.gate_up_silu(mlp, x), fk.silu_mul_ref(mlp.gate_proj(x), mlp.up_proj(x)),
                                   **_tols(dtype))
        torch.testing.assert_close(fl.lora_projection(attn.o_proj, x), attn.o_proj(x), **_tols(dtype))
        torch.testing.assert_close(fl.lora_projection(mlp.down_proj, act), mlp.down_proj(act), **_tols(dtype))
    assert splits == expected  # q/k/v, gate/up, o, down
