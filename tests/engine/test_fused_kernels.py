"""The fused Triton kernels (engine/fused.py) against their torch references, the references against HF's own
modules, and the runner with fused kernels against HF. Kernel tests run on CUDA, or on the CPU under Triton's
interpreter (TRITON_INTERPRET=1, float32/float16 only: the interpreter's bfloat16 rounding is not torch's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm, apply_rotary_pos_emb

from tandemrl.engine.kernels import fused as fk
from tandemrl.engine.kernels.paged_kv import store_kv
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine.config import EngineConfig
from tests.engine.kernel_env import DEVICE, DTYPES, HAS_CUDA, needs_kernels

needs_cuda = pytest.mark.skipif(not HAS_CUDA or fk.triton is None, reason="needs a CUDA device and Triton")

ROWS_HIDDEN = [(1, 64), (3, 896), (17, 1000), (300, 1024), (64, 4096)]
# (tokens, q heads, kv heads, head dim): Qwen2.5-0.5B, Qwen3-0.6B/8B, an odd small one
ROPE_SHAPES = [(1, 14, 2, 64), (37, 14, 2, 64), (300, 16, 8, 128), (5, 32, 8, 128), (4, 3, 1, 6)]


def _tols(dtype: torch.dtype) -> dict:
    return {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
            torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2)}[dtype]


def _poison_allocator() -> None:
    """Fill freed device memory with NaN so an output element the kernel never writes shows up."""
    if HAS_CUDA:
        junk = torch.full((1 << 24,), float("nan"), device="cuda")
        del junk


# ---------------------------------------------------------------------------------------------- kernels

@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", ROWS_HIDDEN)
def test_add_rmsnorm_matches_reference(dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * hidden)
    x, res = (torch.randn(rows, hidden, generator=g).to(DEVICE, dtype) for _ in range(2))
    weight = (torch.rand(hidden, generator=g) + 0.5).to(DEVICE, dtype)
    wide = torch.randn(rows, hidden + 8, generator=g).to(DEVICE, dtype)  # a strided x (row stride != hidden)
    for xi, ri in ((x, res), (x, None), (wide[:, :hidden], None), (wide[:, :hidden], res)):
        _poison_allocator()
        out, new_res = fk.add_rmsnorm(xi, ri, weight, 1e-6)
        ref, ref_res = fk.add_rmsnorm_ref(xi, ri, weight, 1e-6)
        assert out.dtype == ref.dtype and out.shape == ref.shape
        assert torch.equal(new_res, ref_res)  # one rounding of a float32 sum: exact
        torch.testing.assert_close(out, ref, **_tols(dtype))
    # a float32 weight with 16-bit activations promotes the output, as HF's `weight * h.to(dtype)` does
    out, _ = fk.add_rmsnorm(x, res, weight.float(), 1e-5)
    ref, _ = fk.add_rmsnorm_ref(x, res, weight.float(), 1e-5)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, **_tols(dtype))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hq,hkv,d", ROPE_SHAPES)
def test_rope_qk_matches_reference_in_place(dtype, n, hq, hkv, d):
    g = torch.Generator().manual_seed(n * hq + d)
    # q and k are views into wider buffers: the padding heads beside them must stay untouched
    qbuf = torch.randn(n, hq + 3, d, generator=g).to(DEVICE, dtype)
    kbuf = torch.randn(n, hkv + 2, d, generator=g).to(DEVICE, dtype)
    angles = (torch.rand(n, d // 2, generator=g) * 100).repeat(1, 2)
    cos, sin = angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)
    q_ref, k_ref = qbuf[:, :hq].clone(), kbuf[:, :hkv].clone()
    q_before, k_before = qbuf.clone(), kbuf.clone()
    fk.rope_qk_(qbuf[:, :hq], kbuf[:, :hkv], cos, sin)
    fk.rope_qk_ref_(q_ref, k_ref, cos, sin)
    # The kernel rounds once per element; the reference rounds each product first (as HF does): the two may
    # differ by one unit in the last place of a 16-bit format (fp32: FMA contraction).
    tols = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(qbuf[:, :hq], q_ref, **tols)
    torch.testing.assert_close(kbuf[:, :hkv], k_ref, **tols)
    assert torch.equal(qbuf[:, hq:], q_before[:, hq:]) and torch.equal(kbuf[:, hkv:], k_before[:, hkv:])


def _qkv_views(buf: Tensor, hq: int, hkv: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as head views of one [n, (hq + 2 hkv + 1) * d] buffer, as a grouped q/k/v projection returns them."""
    n = buf.shape[0]
    cut = [0, hq * d, (hq + hkv) * d, (hq + 2 * hkv) * d]
    return tuple(buf[:, a:b].view(n, -1, d) for a, b in zip(cut, cut[1:]))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hq,hkv,d", [(1, 14, 2, 64), (37, 14, 2, 64), (300 if HAS_CUDA else 160, 16, 8, 128),
                                        (4, 3, 1, 6)])  # a prefill-sized N: fewer tokens for the slow interpreter
def test_rope_qk_store_matches_rope_then_store_kv(dtype, n, hq, hkv, d):
    """Bit for bit rope_qk_ on q and k, and exactly store_kv's cache writes, at slots in arbitrary order."""
    g = torch.Generator().manual_seed(n * hq + d + 1)
    buf = torch.randn(n, (hq + 2 * hkv + 1) * d, generator=g).to(DEVICE, dtype)
    angles = (torch.rand(n, d // 2, generator=g) * 100).repeat(1, 2)
    cos, sin = angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)
    block_size, blocks = 16, -(-n // 16) + 3
    slots = torch.randperm(blocks * block_size, generator=g)[:n].to(DEVICE)  # shuffled, some slots left unused
    k_cache = torch.full((blocks, block_size, hkv, d), float("nan"), dtype=dtype, device=DEVICE)
    v_cache = torch.full_like(k_cache, float("nan"))
    ref_buf, hf_buf = buf.clone(), buf.clone()
    k_cache_ref, v_cache_ref = k_cache.clone(), v_cache.clone()
    q_ref, k_ref, v_ref = _qkv_views(ref_buf, hq, hkv, d)
    fk.rope_qk_(q_ref, k_ref, cos, sin)
    store_kv(k_ref, v_ref, k_cache_ref, v_cache_ref, slots)
    q, k, v = _qkv_views(buf, hq, hkv, d)
    fk.rope_qk_store_(q, k, v, cos, sin, k_cache, v_cache, slots)
    assert torch.equal(buf, ref_buf)  # q, k rotated as rope_qk_ does; v and the padding column untouched
    assert torch.equal(k_cache.nan_to_num(7.0), k_cache_ref.nan_to_num(7.0))  # written slots exact, others NaN
    assert torch.equal(v_cache.nan_to_num(7.0), v_cache_ref.nan_to_num(7.0))
    assert int(k_cache.isnan().all(-1).all(-1).sum()) == blocks * block_size - n
    q_hf, k_hf, _ = _qkv_views(hf_buf, hq, hkv, d)
    fk.rope_qk_ref_(q_hf, k_hf, cos, sin)
    tols = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(buf, hf_buf, **tols)  # HF's rounding, within the kernel's (see the rope test)


@needs_kernels
def test_rope_qk_store_casts_to_the_cache_dtype():
    g = torch.Generator().manual_seed(11)
    n, hq, hkv, d = 5, 4, 2, 16
    q, k, v = (torch.randn(n, h, d, generator=g).to(DEVICE) for h in (hq, hkv, hkv))
    angles = torch.rand(n, d // 2, generator=g).repeat(1, 2).to(DEVICE)
    k_cache = torch.full((2, 4, hkv, d), float("nan"), dtype=torch.float16, device=DEVICE)
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = torch.tensor([7, 0, 3, 6, 1], device=DEVICE)
    q_ref, k_ref = fk.rope_qk_(q.clone(), k.clone(), angles.cos(), angles.sin())
    fk.rope_qk_store_(q, k, v, angles.cos(), angles.sin(), k_cache, v_cache, slots)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert torch.equal(k_cache.view(-1, hkv, d)[slots], k_ref.half())
    assert torch.equal(v_cache.view(-1, hkv, d)[slots], v.half())


@needs_kernels
def test_rope_qk_store_saturates_an_fp8_cache_as_store_kv():
    """engine.kv_cache_dtype fp8_e4m3: values beyond +-448 saturate (a plain cast gives NaN), the rest round as
    torch's cast; the fused store and store_kv write the same bytes."""
    g = torch.Generator().manual_seed(12)
    n, hq, hkv, d = 5, 4, 2, 16
    q, k, v = (torch.randn(n, h, d, generator=g).to(DEVICE) * 100 for h in (hq, hkv, hkv))
    angles = torch.rand(n, d // 2, generator=g).repeat(1, 2).to(DEVICE)
    if not HAS_CUDA:  # the interpreter's float8 cast mis-rounds at binade edges (31.9 -> 16): exact values, no turn
        k, v, angles = k.to(torch.float8_e4m3fn).float(), v.to(torch.float8_e4m3fn).float(), angles * 0
    v[0, 0, :3] = torch.tensor([1e4, -1e4, 500.0])
    caches = [torch.zeros(2, 4, hkv, d, dtype=torch.float8_e4m3fn, device=DEVICE) for _ in range(4)]
    slots = torch.tensor([7, 0, 3, 6, 1], device=DEVICE)
    q_ref, k_ref = fk.rope_qk_(q.clone(), k.clone(), angles.cos(), angles.sin())
    fk.rope_qk_store_(q, k, v, angles.cos(), angles.sin(), caches[0], caches[1], slots)
    store_kv(k_ref, v, caches[2], caches[3], slots)
    for fused, ref in zip(caches[:2], caches[2:]):
        assert torch.equal(fused.view(torch.uint8), ref.view(torch.uint8))
    stored_v = caches[1].view(-1, hkv, d)[slots].float()
    assert not stored_v.isnan().any() and stored_v[0, 0, :3].tolist() == [448.0, -448.0, 448.0]
    assert (stored_v - v).abs().max() > 0  # rounded: the test sees the cast


def test_rope_qk_store_rejects_mismatched_shapes():
    q, k, v = torch.zeros(3, 4, 8), torch.zeros(3, 2, 8), torch.zeros(3, 2, 8)
    cos = sin = torch.zeros(3, 8)
    cache = torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match="rope_qk_store_"):
        fk.rope_qk_store_(q, k, v, cos, sin, cache, cache.clone(), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="rope_qk_store_"):
        fk.rope_qk_store_(q, k, v[:, :1], cos, sin, cache, cache.clone(), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="rope_qk_store_"):
        fk.rope_qk_store_(q, k, v, cos, sin, cache[:, :, :1], cache[:, :, :1], torch.zeros(3, dtype=torch.long))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 64), (7, 1000), (256, 4864), (300, 3072)])
def test_silu_mul_matches_reference(dtype, rows, inter):
    g = torch.Generator().manual_seed(rows + inter)
    gate, up = ((torch.randn(rows, inter, generator=g) * 4).to(DEVICE, dtype) for _ in range(2))
    _poison_allocator()
    out = fk.silu_mul(gate, up)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out, fk.silu_mul_ref(gate, up), **_tols(dtype))


# ---------------------------------------------------------------------------------------------- references vs HF

def test_references_match_hf_modules_exactly():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        norm = Qwen2RMSNorm(96, eps=1e-6)
        norm.weight.data = torch.rand(96) + 0.5
        norm = norm.to(dtype)
        x, res = torch.randn(5, 96).to(dtype), torch.randn(5, 96).to(dtype)
        out, new_res = fk.add_rmsnorm_ref(x, res, norm.weight, norm.variance_epsilon)
        assert torch.equal(new_res, res + x) and torch.equal(out, norm(res + x))
        q, k = torch.randn(6, 4, 32).to(dtype), torch.randn(6, 2, 32).to(dtype)
        angles = torch.randn(6, 16).repeat(1, 2)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        # HF's layout: [batch, heads, seq, dim] with cos [batch, seq, dim]
        hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
        fk.rope_qk_ref_(q, k, cos, sin)
        assert torch.equal(q, hq[0].transpose(0, 1)) and torch.equal(k, hk[0].transpose(0, 1))
        mlp = Qwen2MLP(Qwen2Config(hidden_size=32, intermediate_size=64)).to(dtype)
        h = torch.randn(3, 32).to(dtype)
        fused = mlp.down_proj(fk.silu_mul_ref(mlp.gate_proj(h), mlp.up_proj(h)))
        assert torch.equal(fused, mlp(h))


def test_module_predicates():
    assert fk.is_plain_rmsnorm(Qwen2RMSNorm(8))
    assert not fk.is_plain_rmsnorm(nn.LayerNorm(8))

    class GemmaRMSNorm(Qwen2RMSNorm):  # Gemma's (1 + weight): must not take the plain path
        pass

    assert not fk.is_plain_rmsnorm(GemmaRMSNorm(8))
    hooked = Qwen2RMSNorm(8)
    hooked.register_forward_hook(lambda *a: None)
    assert not fk.is_plain_rmsnorm(hooked)
    assert fk.is_silu_mlp(Qwen2MLP(Qwen2Config(hidden_size=8, intermediate_size=16)))
    assert not fk.is_silu_mlp(Qwen2MLP(Qwen2Config(hidden_size=8, intermediate_size=16, hidden_act="gelu")))


def test_cpu_runner_keeps_torch_ops():
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64))
    assert ModelRunner(model, EngineConfig(block_size=16), "cpu").fused_kernels is False
    assert fk.fused_available("cpu") is False


# ---------------------------------------------------------------------------------------------- whole runner

def _qwen05b_like(dtype: torch.dtype) -> nn.Module:
    """Qwen2.5-0.5B's widths and heads (14 q / 2 kv heads of 64), two layers, random weights."""
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=896, num_hidden_layers=2, num_attention_heads=14,
                      num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=512)
    model = Qwen2ForCausalLM(cfg).to(device="cuda", dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def _generate(model: nn.Module, fused: bool, enforce_eager: bool = False) -> list:
    sys.path.insert(0, str(Path(__file__).parent))  # tiny helpers from the sibling test module
    try:
        from test_model_runner import BLOCK, Blocks, generate, make_seq, prompts_of
    finally:
        sys.path.pop(0)

    runner = ModelRunner(model, EngineConfig(block_size=BLOCK, fused_kernels=fused, cuda_graphs=not enforce_eager), "cuda")
    assert runner.fused_kernels is fused
    runner.allocate_kv_cache(64)
    blocks = Blocks(64)
    seqs = [make_seq(i, p, blocks.take(4)) for i, p in enumerate(prompts_of([5, 17, 40]))]
    generate(runner, seqs, 8)
    return seqs


@needs_cuda
def test_fused_runner_close_to_hf_in_bf16():
    model = _qwen05b_like(torch.bfloat16)
    for seq in _generate(model, fused=True):
        with torch.no_grad():
            logits = model(torch.tensor([seq.token_ids], device="cuda")).logits[0].float()
        for j, lp in enumerate(seq.logprobs):
            pos = seq.num_prompt_tokens + j
            assert lp == pytest.approx(torch.log_softmax(logits[pos - 1], -1)[seq.token_ids[pos]].item(), abs=5e-2)


@needs_cuda
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_fused_runner_matches_unfused_in_fp32(enforce_eager):
    model = _qwen05b_like(torch.float32)
    fused, plain = _generate(model, True, enforce_eager), _generate(model, False, enforce_eager)
    for a, b in zip(fused, plain):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
