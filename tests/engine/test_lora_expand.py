"""The LoRA expand on its own (engine/kernels/lora_expand.py) against torch, and the route it serves in
fused_linear (adapted groups above the grouped launch's range: cuBLAS base projections + shrink + expand) against
peft's modules. Kernel tests run on CUDA, or on the CPU under Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from tandemrl.engine.kernels import fused as fk
from tandemrl.engine.kernels import fused_linear as fl
from tandemrl.engine.kernels import linear_dispatch as ld
from tandemrl.engine.kernels import lora_expand as le
from tests.engine.kernel_env import DEVICE, DTYPES, needs_kernels
from tests.engine.test_fused_linear import INTER, _lora_layer, _qkv_like_modules, _tols, _x

WIDTHS = (72, 24, 40)  # odd widths: the last column tile of each output is masked


def _product_tols(dtype: torch.dtype) -> dict:
    """Tolerances for a product of two rounded projections: twice a single projection's in 16 bits."""
    return {key: 2 * value for key, value in _tols(dtype).items()} if dtype != torch.float32 else _tols(dtype)


def _peft_reference(base: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """peft's ``result + lora_B(xa) * scaling`` (xa lora_A's output in B's dtype), cast back to base's dtype."""
    return (base + (xa.to(b.dtype) @ b.T) * scaling).to(base.dtype)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank, rows, outputs, splits, views", [
    (8, 65, 1, 1, False), (16, 200, 2, 2, False), (64, 256, 3, 3, True), (64, 65, 2, 1, True),
    (8, 256, 3, 4, False), (16, 65, 3, 1, True), (100, 70, 1, 2, False)])  # 100: two rank steps, the second masked
def test_expand_matches_torch(dtype, rank, rows, outputs, splits, views):
    """outs[i] += scaling_i * (sum of slabs) @ B_i^T: separate outputs or column views of one buffer (the columns
    of no output untouched), adapters in float32 (peft's default on a 16-bit model) and in the model's dtype."""
    gen = torch.Generator().manual_seed(rank + rows)
    widths, ranks = WIDTHS[:outputs], (rank, max(1, rank // 2), rank)[:outputs]
    xa = torch.randn(splits, rows, sum(ranks), generator=gen).to(DEVICE)
    scalings = [2.0, 0.5, 1.0][:outputs]
    for adapter_dtype in {torch.float32, dtype}:
        bs = [torch.randn(n, r, generator=gen).to(DEVICE, adapter_dtype) * 0.2 for n, r in zip(widths, ranks)]
        buffer = torch.randn(rows, sum(widths) + 8, generator=gen).to(DEVICE, dtype)
        if views:
            starts = [sum(widths[:i]) for i in range(outputs)]
            outs = [buffer[:, s:s + n] for s, n in zip(starts, widths)]
        else:
            outs = [torch.randn(rows, n, generator=gen).to(DEVICE, dtype) for n in widths]
        before = [o.clone() for o in outs]
        untouched = buffer[:, sum(widths):].clone()
        le.lora_expand_(outs, xa, bs, scalings, sms=1)
        col = 0
        for got, base, b, s, r in zip(outs, before, bs, scalings, ranks):
            expected = _peft_reference(base, xa.sum(0)[:, col:col + r], b, s)
            torch.testing.assert_close(got, expected, **_tols(dtype))
            assert not torch.allclose(got, base, **_tols(dtype))  # the adapter mattered
            col += r
        assert torch.equal(buffer[:, sum(widths):], untouched)


@needs_kernels
def test_expand_refuses_mismatched_operands():
    xa = torch.zeros(1, 70, 8, device=DEVICE)
    b = torch.zeros(24, 8, device=DEVICE)
    with pytest.raises(ValueError):
        le.lora_expand_([torch.zeros(70, 25, device=DEVICE)], xa, [b], [1.0], sms=1)
    with pytest.raises(ValueError):
        le.lora_expand_([torch.zeros(70, 24, device=DEVICE)] * 4, xa, [b] * 4, [1.0] * 4, sms=1)


def test_expand_tiles():
    """Every SM busy: the widest column tiles that still give about one program per SM."""
    assert le.expand_tiles(256, (3584, 512, 512), 132) == (64, 128)  # Qwen2.5-7B q/k/v: 4 x 36 programs
    assert le.expand_tiles(256, (1536, 256, 256), 132) == (64, 32)  # 1.5B q/k/v: 4 x 64 (at 64 columns, 128)
    assert le.expand_tiles(256, (8960, 8960), 132) == (64, 128)  # 1.5B gate/up: 4 x 140
    assert le.expand_tiles(100, (1536,), 132) == (64, 32)  # 1.5B o_proj at 100 rows: 2 x 48
    assert le.expand_tiles(3, (72,), 1) == (16, 128)


@pytest.fixture
def expand_route(monkeypatch):
    """Every adapted group on the cuBLAS + shrink + expand route (as above the grouped range with long
    reductions), its launches counted; plain groups keep the rule."""
    original_rule, original_expand = ld.grouped_launch_wins, fl.lora_expand_
    launches = []

    def expand(outs, *args, **kwargs):
        launches.append(len(outs))
        return original_expand(outs, *args, **kwargs)

    monkeypatch.setattr(ld, "grouped_launch_wins", lambda op, rows, k, adapted: not adapted and original_rule(
        op, rows, k, adapted))
    monkeypatch.setattr(fl, "lora_expand_", expand)
    return launches


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [65, 200])
@pytest.mark.parametrize("targets", [None, ["q_proj", "v_proj", "up_proj"]])
def test_expand_route_matches_peft(expand_route, dtype, rows, targets):
    """q/k/v, gate/up + SiLU and o_proj / down_proj on the expand route equal peft's modules; one expand launch
    per group, over the adapted projections only (a plain member is its cuBLAS output alone)."""
    model, layer = _lora_layer(dtype, rank=16, targets=targets)
    attn, mlp = layer.self_attn, layer.mlp
    x, act = _x(rows, dtype), _x(rows, dtype, INTER)
    with torch.no_grad():
        q, k, v = _qkv_like_modules(attn, x, dtype)
        # SiLU(gate) * up multiplies two 16-bit roundings (base, then base + adapter, as peft rounds them): where
        # TF32's adapter product tips one of them to the next value, the product moves by up to two units more
        torch.testing.assert_close(fl.gate_up_silu(mlp, x), fk.silu_mul_ref(mlp.gate_proj(x), mlp.up_proj(x)),
                                   **_product_tols(dtype))
        o, down = fl.lora_projection(attn.o_proj, x), fl.lora_projection(mlp.down_proj, act)
        if targets is None:
            torch.testing.assert_close(o, attn.o_proj(x), **_tols(dtype))
            torch.testing.assert_close(down, mlp.down_proj(act), **_tols(dtype))
            assert expand_route == [3, 2, 1, 1]
        else:  # plain o_proj / down_proj stay the module calls
            assert o is None and down is None and expand_route == [2, 1]
        with model.disable_adapter():  # the adapters matter
            assert not torch.allclose(attn.q_proj(x), q, **_tols(dtype))


@needs_kernels
def test_expand_route_keeps_leading_dims_and_empty_inputs(expand_route):
    model, layer = _lora_layer(torch.float32)
    attn = layer.self_attn
    x = _x(6, torch.float32).view(2, 3, -1)
    with torch.no_grad():
        q, k, v = fl.qkv_projection(attn, x)
        assert q.shape == (2, 3, attn.q_proj.out_features)
        torch.testing.assert_close(v, attn.v_proj(x), **_tols(torch.float32))
        torch.testing.assert_close(fl.lora_projection(attn.o_proj, x), attn.o_proj(x), **_tols(torch.float32))
        empty = fl.qkv_projection(attn, x[:, :0])
        assert [t.shape[:2] for t in empty] == [(2, 0)] * 3
        assert fl.qkv_projection(attn, _x(ld.GROUPED_LINEAR_MAX_ROWS + 1, torch.float32)) is None  # prefill: peft
