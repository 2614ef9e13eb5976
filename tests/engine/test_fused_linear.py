"""Grouped projections (engine/fused_linear.py) against the modules they replace: q/k/v in one launch, gate/up
with the SiLU product in the epilogue, weights read in place, None wherever the modules must run (LoRA, hooks).
Kernel tests run on CUDA, or on the CPU under Triton's interpreter (TRITON_INTERPRET=1, float32/float16 only)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

from tandemrl.engine.kernels import fused as fk
from tandemrl.engine.kernels import fused_linear as fl
from tandemrl.engine.kernels import linear_dispatch as ld
from tandemrl.engine.kernels import linear_tiles as lt
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.model import runner as mr
from tandemrl.models.lora import LoraSettings, apply_lora, unwrap_causal_lm
from tests.engine.kernel_env import DEVICE, DTYPES, HAS_CUDA, INTERPRET, needs_kernels


ROWS = [1, 3, 16, 17, 64]
HIDDEN, HEAD, INTER = 72, 24, 200  # odd sizes: 3 q heads and 1 kv head of 24, no block size divides them all
BIASES = [(False, False, False), (True, False, True)]  # each bias on its own (all three: the Qwen2 runner test)


def _tols(dtype: torch.dtype) -> dict:
    """float32: 1e-5; 16-bit: a unit or two in the last place (summation order differs from the module's GEMM)."""
    return {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
            torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}[dtype]


@pytest.fixture(autouse=True)
def _nan_outputs(monkeypatch):
    """Every output buffer starts as NaN, so an element the kernel never writes shows up."""
    def poisoned(rows, cols, like):
        return torch.full((rows, cols), float("nan"), dtype=like.dtype, device=like.device)

    monkeypatch.setattr(fl, "_new_output", poisoned)
    if INTERPRET:  # the interpreter pays per program: widest tiles unless a test asks for the narrowest
        monkeypatch.setattr(fl, "_sm_count", lambda device: 1)


def _attn(dtype, biases=(True, True, True), hidden=HIDDEN, widths=(3 * HEAD, HEAD, HEAD), seed=0) -> nn.Module:
    torch.manual_seed(seed)
    attn = nn.Module()
    for name, n, bias in zip(("q_proj", "k_proj", "v_proj"), widths, biases):
        setattr(attn, name, nn.Linear(hidden, n, bias=bias))
    attn = attn.to(DEVICE, dtype)
    with torch.no_grad():  # biases as large as the products, so a missing or misplaced one shows
        for p in (attn.q_proj, attn.k_proj, attn.v_proj):
            if p.bias is not None:
                p.bias.normal_()
    return attn


def _mlp(dtype, bias=False, hidden=HIDDEN, inter=INTER, seed=0) -> nn.Module:
    torch.manual_seed(seed)
    mlp = Qwen2MLP(Qwen2Config(hidden_size=hidden, intermediate_size=inter))
    if bias:  # Qwen/Llama MLPs have none; the kernel must still add one where a model has it
        mlp.gate_proj, mlp.up_proj = nn.Linear(hidden, inter), nn.Linear(hidden, inter)
    return mlp.to(DEVICE, dtype)


def _x(rows, dtype, hidden=HIDDEN, seed=1) -> torch.Tensor:
    return torch.randn(rows, hidden, generator=torch.Generator().manual_seed(seed + rows)).to(DEVICE, dtype)


def _qkv_like_modules(attn: nn.Module, x: torch.Tensor, dtype) -> tuple[torch.Tensor, ...]:
    """fl.qkv_projection's q, k, v, each checked against its module's own output."""
    q, k, v = fl.qkv_projection(attn, x)
    for got, module in ((q, attn.q_proj), (k, attn.k_proj), (v, attn.v_proj)):
        torch.testing.assert_close(got, module(x), **_tols(dtype))
    return q, k, v


def _mlp_ref(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return fk.silu_mul_ref(mlp.gate_proj(x), mlp.up_proj(x))


# ---------------------------------------------------------------------------------------------- tiles (no kernel)

def test_pick_tiles_reads_weights_once_in_wide_column_tiles():
    # Qwen2.5-0.5B decode at batch 1: q/k/v 896/128/128 columns, gate/up 4864 each, hidden 896
    qkv = lt.pick_tiles(1, (896, 128, 128), 896, 2)
    assert (qkv.block_m, qkv.block_n) == (16, 16) and sum(n // 16 for n in (896, 128, 128)) >= 132 // 3
    mlp = lt.pick_tiles(1, (4864,), 896, 2, weights_per_tile=2)
    assert (mlp.block_m, mlp.block_n) == (16, 32) and 4864 // 32 >= 132 // 3
    for rows, block_m in ((1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64)):
        for widths, per in (((896, 128, 128), 1), ((4864,), 2)):
            t = lt.pick_tiles(rows, widths, 896, 2, per)
            assert t.block_m == block_m and all(w % t.block_n == 0 for w in widths)  # no tile straddles
            assert t.block_n >= block_m // 4 and 896 % t.block_k == 0
            assert 2 <= t.num_stages <= 4
            assert t.num_stages * (block_m + per * t.block_n) * t.block_k * 2 <= 128 * 1024
    assert lt.pick_tiles(3, (24,), 20, 4).block_k == 32  # short reductions: one masked K step
    # decode batches of 128 and 256 (and anything larger) take the measured tiles of their bucket
    for rows, bucket in ((65, 128), (128, 128), (129, 256), (256, 256), (300, 256)):
        for per in (1, 2):
            assert lt.pick_tiles(rows, (896,), 896, 2, per) == lt._LARGE_BATCH_TILES[(per, bucket)]


def test_tile_defaults_are_the_measured_values():
    """What the engine launches above the GEMV range (it passes no tiles): the H100 sweeps' winners. Changing one
    is a tuning decision, made here too."""
    T = lt.LinearTiles
    assert lt._LARGE_BATCH_TILES == {(1, 128): T(64, 32, 128, 4, 4), (1, 256): T(64, 64, 128, 4, 3),
                                     (2, 128): T(128, 64, 64, 8, 4), (2, 256): T(128, 32, 64, 4, 3)}
    assert lt._TMA_GATE_UP_TILES == {128: T(128, 64, 64, 4, 4), 256: T(128, 64, 64, 4, 3)}
    for fn, names in ((fl.qkv_projection, ("tiles",)), (fl.gate_up_silu, ("tiles", "tma"))):
        assert all(inspect.signature(fn).parameters[n].default is None for n in names)


def test_tma_choice():
    """tma None: descriptors above the GEMV range where they apply; an explicit choice is kept, or refused."""
    if not (INTERPRET or (HAS_CUDA and torch.cuda.get_device_capability()[0] >= 9)):
        pytest.skip("tensor descriptors need Hopper or the interpreter")
    x, w = torch.empty(100, 64, device=DEVICE), torch.empty(32, 64, device=DEVICE)
    assert fl._use_tma(100, None, x, w) and not fl._use_tma(64, None, x, w)
    assert fl._use_tma(64, True, x, w) and not fl._use_tma(100, False, x, w)
    odd = torch.empty(100, 66, device=DEVICE)[:, :64]  # rows 264 bytes apart: not 16-byte aligned
    assert not fl._use_tma(100, None, odd, w)
    with pytest.raises(ValueError, match="tma=True"):
        fl._use_tma(100, True, odd, w)


# ---------------------------------------------------------------------------------------------- q/k/v

@needs_kernels
@pytest.mark.parametrize("biases", BIASES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_projection_matches_modules(dtype, rows, biases):
    attn, x = _attn(dtype, biases), _x(rows, dtype)
    with torch.no_grad():
        out = fl.qkv_projection(attn, x)
        refs = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    assert out is not None
    for got, ref in zip(out, refs):
        assert got.shape == ref.shape and got.dtype == dtype
        torch.testing.assert_close(got, ref, **_tols(dtype))
    q, k, v = out  # column views of one [rows, Nq + Nk + Nv] buffer
    size = q.element_size()
    assert q.stride() == k.stride() == v.stride() == (5 * HEAD, 1)
    assert k.data_ptr() == q.data_ptr() + 3 * HEAD * size and v.data_ptr() == k.data_ptr() + HEAD * size


@needs_kernels
@pytest.mark.skipif(not HAS_CUDA, reason="slow under the interpreter; the next test covers the same tiles there")
def test_qkv_projection_at_qwen05b_widths():
    """896 -> 896/128/128 at batch 1: the tiles Qwen2.5-0.5B decodes with (BLOCK_N 8, 144 programs)."""
    attn, x = _attn(torch.float32, hidden=896, widths=(896, 128, 128)), _x(1, torch.float32, hidden=896)
    with torch.no_grad():
        out = fl.qkv_projection(attn, x)
        for got, proj in zip(out, (attn.q_proj, attn.k_proj, attn.v_proj)):
            torch.testing.assert_close(got, proj(x), **_tols(torch.float32))


@needs_kernels
@pytest.mark.parametrize("rows", [1, 40])
def test_whole_k_steps_and_smallest_column_tiles(monkeypatch, rows):
    """A reduction of whole K blocks (256 = 2 x 128, the unmasked loop) and, as on a big GPU, the narrowest
    column tiles, with the last tile of each weight partly masked (widths 100/36/36, 200)."""
    monkeypatch.setattr(fl, "_sm_count", lambda device: 10 ** 6)
    dtype = DTYPES[0]
    attn, mlp = _attn(dtype, hidden=256, widths=(100, 36, 36)), _mlp(dtype, hidden=256)
    x = _x(rows, dtype, hidden=256)
    with torch.no_grad():
        for got, proj in zip(fl.qkv_projection(attn, x), (attn.q_proj, attn.k_proj, attn.v_proj)):
            torch.testing.assert_close(got, proj(x), **_tols(dtype))
        torch.testing.assert_close(fl.gate_up_silu(mlp, x), _mlp_ref(mlp, x), **_tols(dtype))


@needs_kernels
@pytest.mark.parametrize("hidden,tma", [(HIDDEN, True), (HIDDEN + 4, False)])
@pytest.mark.parametrize("rows", [100, 200])
def test_large_batch_tiles(rows, hidden, tma):
    """Decode batches above 64 rows: the measured 128-/256-row tiles, with masked rows and column tiles; gate/up
    through tensor descriptors where rows are 16-byte aligned (HIDDEN), with plain loads where not (HIDDEN + 4)."""
    dtype = DTYPES[0]
    attn, x = _attn(dtype, (True, False, True), hidden=hidden), _x(rows, dtype, hidden=hidden)
    mlp = _mlp(dtype, bias=True, hidden=hidden)
    hopper = HAS_CUDA and torch.cuda.get_device_capability()[0] >= 9
    assert fl._tma_ready(x, mlp.gate_proj.weight, mlp.up_proj.weight) == (tma and (hopper or INTERPRET))
    with torch.no_grad():
        for got, proj in zip(fl.qkv_projection(attn, x), (attn.q_proj, attn.k_proj, attn.v_proj)):
            torch.testing.assert_close(got, proj(x), **_tols(dtype))
        torch.testing.assert_close(fl.gate_up_silu(mlp, x), _mlp_ref(mlp, x), **_tols(dtype))


@needs_kernels
@pytest.mark.parametrize("rows", [3, 100])
def test_explicit_tiles_match_modules(rows):
    """Tiles a benchmark passes instead of the picked ones (masked K steps, masked last tiles), for q/k/v and for
    both gate/up kernels where descriptors apply: the modules' results."""
    dtype = DTYPES[0]
    tiles = lt.LinearTiles(32, 16, 32, num_warps=4, num_stages=2)
    attn, mlp, x = _attn(dtype, (True, False, True)), _mlp(dtype, bias=True), _x(rows, dtype)
    tma_choices = [False] + ([True] if fl._tma_ready(x, mlp.gate_proj.weight, mlp.up_proj.weight) else [])
    with torch.no_grad():
        for got, proj in zip(fl.qkv_projection(attn, x, tiles=tiles), (attn.q_proj, attn.k_proj, attn.v_proj)):
            torch.testing.assert_close(got, proj(x), **_tols(dtype))
        for tma in tma_choices:
            torch.testing.assert_close(fl.gate_up_silu(mlp, x, tiles=tiles, tma=tma), _mlp_ref(mlp, x), **_tols(dtype))


@needs_kernels
def test_qkv_projection_keeps_leading_dims_and_row_limit():
    attn = _attn(torch.float32)
    x = _x(6, torch.float32).view(2, 3, HIDDEN)
    with torch.no_grad():
        q, k, v = fl.qkv_projection(attn, x)
        assert q.shape == (2, 3, 3 * HEAD) and v.shape == (2, 3, HEAD)
        torch.testing.assert_close(v, attn.v_proj(x), **_tols(torch.float32))
        big = _x(ld.GROUPED_LINEAR_MAX_ROWS + 1, torch.float32)
        assert fl.qkv_projection(attn, big) is None  # prefill-size input: the caller uses cuBLAS
        assert fl.qkv_projection(attn, x, max_rows=5) is None
        q, _, _ = fl.qkv_projection(attn, big, max_rows=1 << 30)  # the 256-row tiles, a masked last row tile
        torch.testing.assert_close(q, attn.q_proj(big), **_tols(torch.float32))
        empty = fl.qkv_projection(attn, big[:0])
        assert [t.shape for t in empty] == [(0, 3 * HEAD), (0, HEAD), (0, HEAD)]


# ---------------------------------------------------------------------------------------------- gate/up + SiLU

@needs_kernels
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_up_silu_matches_module_path(dtype, rows, bias):
    mlp, x = _mlp(dtype, bias), _x(rows, dtype)
    with torch.no_grad():
        out = fl.gate_up_silu(mlp, x)
        ref = _mlp_ref(mlp, x)
        if not bias:  # the reference is HF's own MLP, less its down projection
            torch.testing.assert_close(mlp.down_proj(ref), mlp(x), atol=0, rtol=0)
    assert out is not None and out.shape == (rows, INTER) and out.dtype == dtype
    torch.testing.assert_close(out, ref, **_tols(dtype))


# ---------------------------------------------------------------------------------------------- in place / None

@needs_kernels
def test_weights_are_read_in_place():
    attn, mlp, x = _attn(torch.float32), _mlp(torch.float32), _x(3, torch.float32)
    with torch.no_grad():
        before_k = fl.qkv_projection(attn, x)[1].clone()
        before_mlp = fl.gate_up_silu(mlp, x).clone()
        attn.k_proj.weight.mul_(-2.0)  # an optimizer step writes the parameter tensor in place
        mlp.up_proj.weight.add_(0.5)
        after_k, after_mlp = fl.qkv_projection(attn, x)[1], fl.gate_up_silu(mlp, x)
        assert not torch.allclose(after_k, before_k) and not torch.allclose(after_mlp, before_mlp)
        torch.testing.assert_close(after_k, attn.k_proj(x), **_tols(torch.float32))
        torch.testing.assert_close(after_mlp, _mlp_ref(mlp, x), **_tols(torch.float32))


def _lora_layer(dtype, rank=8, targets=None):
    """One Qwen2 layer wrapped by peft (all linear layers by default), lora_B drawn so the adapters matter. A
    16-bit model gets float32 adapters (peft's autocast_adapter_dtype), as the trainer's LoRA models do."""
    from tandemrl.models.lora import DEFAULT_TARGET_MODULES

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=3,
                      num_key_value_heads=1, intermediate_size=INTER)
    model = apply_lora(Qwen2ForCausalLM(cfg).to(DEVICE, dtype),
                       LoraSettings(rank=rank, alpha=2 * rank, target_modules=targets or DEFAULT_TARGET_MODULES))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    return model, unwrap_causal_lm(model).model.layers[0]


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 17, 100])
@pytest.mark.parametrize("targets", [None, ["q_proj", "v_proj", "up_proj"]])
def test_lora_projections_match_peft(dtype, rows, targets):
    """Adapters on all or some projections of a group: the grouped launches compute what peft's modules do
    (base + B A x * scaling), and o_proj / down_proj with adapters through cuBLAS + the shrink and expand; above the
    GEMV range too (100 rows: the large-batch tiles and the shrink's own)."""
    model, layer = _lora_layer(dtype, targets=targets)
    attn, mlp = layer.self_attn, layer.mlp
    x = _x(rows, dtype)
    with torch.no_grad():
        q, k, v = fl.qkv_projection(attn, x)
        torch.testing.assert_close(q, attn.q_proj(x), **_tols(dtype))
        torch.testing.assert_close(k, attn.k_proj(x), **_tols(dtype))
        torch.testing.assert_close(v, attn.v_proj(x), **_tols(dtype))
        torch.testing.assert_close(fl.gate_up_silu(mlp, x), _mlp_ref(mlp, x), **_tols(dtype))
        for module, inp in ((attn.o_proj, x), (mlp.down_proj, _x(rows, dtype, INTER))):
            out = fl.lora_projection(module, inp)
            if targets is None:
                torch.testing.assert_close(out, module(inp), **_tols(dtype))
            else:  # a plain nn.Linear stays the module call
                assert out is None
        with model.disable_adapter():  # the adapters matter: without them the outputs differ
            assert not torch.allclose(attn.q_proj(x), q, **_tols(dtype))


@needs_kernels
def test_lora_updates_are_read_in_place_and_other_states_use_the_modules():
    model, layer = _lora_layer(torch.float32)
    attn, mlp = layer.self_attn, layer.mlp
    x = _x(3, torch.float32)
    with torch.no_grad():
        before = fl.qkv_projection(attn, x)[0].clone()
        attn.q_proj.lora_B["default"].weight.mul_(2)  # an optimizer step on the adapter
        after = fl.qkv_projection(attn, x)[0]
        torch.testing.assert_close(after, attn.q_proj(x), **_tols(torch.float32))
        assert not torch.allclose(after, before)
        model.merge_adapter()  # merged into the base weights: the module computes it; the launch must not
        assert fl.qkv_projection(attn, x) is None and fl.lora_projection(attn.o_proj, x) is None
        model.unmerge_adapter()
        with model.disable_adapter():
            assert fl.gate_up_silu(mlp, x) is None
        attn.q_proj.lora_dropout["default"] = nn.Dropout(0.1).eval()  # dropout: identity in eval mode
        assert fl.qkv_projection(attn, x) is not None
        attn.q_proj.lora_dropout["default"].train()  # while training: peft draws a random mask
        assert fl.qkv_projection(attn, x) is None
    # a grad-recording call (LoRA weights are trainable) must run the modules
    assert fl.lora_projection(attn.o_proj, x) is None


@needs_kernels
def test_dora_adapters_use_the_modules():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=3,
                      num_key_value_heads=1, intermediate_size=INTER)
    model = get_peft_model(Qwen2ForCausalLM(cfg).to(DEVICE), LoraConfig(r=4, use_dora=True,
                                                                         target_modules=["q_proj", "o_proj"]))
    attn = unwrap_causal_lm(model).model.layers[0].self_attn
    with torch.no_grad():
        assert fl.qkv_projection(attn, _x(2, torch.float32)) is None
        assert fl.lora_projection(attn.o_proj, _x(2, torch.float32)) is None


@needs_kernels
def test_none_for_hooks_and_what_the_kernel_cannot_read():
    x = _x(2, torch.float32)

    def hooked(fn):
        attn, mlp = _attn(torch.float32), _mlp(torch.float32)
        handles = [fn(attn.v_proj), fn(mlp.gate_proj)]
        with torch.no_grad():
            result = fl.qkv_projection(attn, x), fl.gate_up_silu(mlp, x)
        for h in handles:
            h.remove()
        return result

    assert hooked(lambda m: m.register_forward_hook(lambda *a: None)) == (None, None)
    assert hooked(lambda m: m.register_forward_pre_hook(lambda *a: None)) == (None, None)
    handle = nn.modules.module.register_module_forward_hook(lambda *a: None)  # global: applies to every module
    try:
        with torch.no_grad():
            assert fl.qkv_projection(_attn(torch.float32), x) is None
            assert fl.gate_up_silu(_mlp(torch.float32), x) is None
    finally:
        handle.remove()

    class Scaled(nn.Linear):  # a subclass with its own forward computes something else
        def forward(self, inp):
            return 2 * super().forward(inp)

    class Renamed(nn.Linear):  # a subclass that keeps nn.Linear's forward is plain
        pass

    with torch.no_grad():
        attn = _attn(torch.float32)
        attn.q_proj = Renamed(HIDDEN, 3 * HEAD).to(DEVICE)
        assert fl.qkv_projection(attn, x) is not None
        attn.q_proj = Scaled(HIDDEN, 3 * HEAD).to(DEVICE)
        assert fl.qkv_projection(attn, x) is None
        attn = _attn(torch.float32)
        assert fl.qkv_projection(attn, x.half()) is None  # dtype mismatch
        attn.k_proj.weight = nn.Parameter(torch.randn(HIDDEN, HEAD, device=DEVICE).t())  # not contiguous
        assert fl.qkv_projection(attn, x) is None
        del attn.v_proj
        assert fl.qkv_projection(attn, x) is None
        gelu = Qwen2MLP(Qwen2Config(hidden_size=HIDDEN, intermediate_size=INTER, hidden_act="gelu")).to(DEVICE)
        assert fl.gate_up_silu(gelu, x) is None
    # autograd wants a graph the kernel does not record: the modules must run
    assert fl.qkv_projection(_attn(torch.float32), x) is None
    assert fl.gate_up_silu(_mlp(torch.float32), x) is None
    with torch.inference_mode():
        assert fl.gate_up_silu(_mlp(torch.float32), x) is not None


# ---------------------------------------------------------------------------------------------- whole runner

@needs_kernels
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_runner_grouped_path_matches_unfused(monkeypatch, arch):
    """The runner's fused forward (grouped q/k/v and gate/up) against its torch path, float32, greedy."""
    sys.path.insert(0, str(Path(__file__).parent))  # tiny helpers from the sibling test module
    try:
        from test_model_runner import BLOCK, Blocks, build, generate, make_seq, prompts_of
    finally:
        sys.path.pop(0)
    if INTERPRET:  # the fused path is CUDA-only in production; the interpreter runs the same kernels on the CPU
        monkeypatch.setattr(fk, "fused_available", lambda device: True)
        monkeypatch.setattr(mr, "fused_available", lambda device: True, raising=False)
    calls = {"qkv": 0, "mlp": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            calls[name] += out is not None
            return out
        return wrapper

    monkeypatch.setattr(fl, "qkv_projection", counted("qkv", fl.qkv_projection))
    monkeypatch.setattr(fl, "gate_up_silu", counted("mlp", fl.gate_up_silu))
    model = build(arch, device=DEVICE)
    results = []
    for fused in (True, False):
        runner = mr.ModelRunner(model, EngineConfig(block_size=BLOCK, fused_kernels=fused, cuda_graphs=False), DEVICE)
        assert runner.fused_kernels is fused
        runner.allocate_kv_cache(16)
        blocks = Blocks(16)
        seqs = [make_seq(i, p, blocks.take(2)) for i, p in enumerate(prompts_of([3, 9, 20]))]
        generate(runner, seqs, 3)  # a 32-row prefill and two 3-row decode steps, all grouped
        results.append(seqs)
        if fused:
            layers = len(model.model.layers)
            assert calls["qkv"] == calls["mlp"] and calls["qkv"] >= 3 * layers and calls["qkv"] % layers == 0
    for a, b in zip(*results):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@needs_kernels
@pytest.mark.parametrize("graphs", [False, pytest.param(True, marks=pytest.mark.skipif(
    not HAS_CUDA, reason="CUDA graphs need a GPU"))])
@pytest.mark.parametrize("route", ["grouped", "expand"])
def test_lora_runner_greedy_equals_the_merged_model(monkeypatch, graphs, route):
    """A peft model (adapters on every linear layer) decodes on the fused path, adapters in the grouped launches,
    and generates what the same model with its adapters merged into the base weights generates; an in-place step
    on the adapter is seen by the same runner's next rollout (its graphs, if any, read peft's tensors).
    route "expand": every adapted group as above the grouped range with long reductions (cuBLAS base
    projections + lora_shrink + lora_expand), at this test's small batches."""
    import copy

    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_model_runner import BLOCK, Blocks, build, generate, make_seq, prompts_of
    finally:
        sys.path.pop(0)
    if INTERPRET:
        monkeypatch.setattr(fk, "fused_available", lambda device: True)
        monkeypatch.setattr(mr, "fused_available", lambda device: True, raising=False)
    served = {"lora": 0}
    original = fl.lora_projection

    def counted(*args, **kwargs):
        out = original(*args, **kwargs)
        served["lora"] += out is not None
        return out

    monkeypatch.setattr(fl, "lora_projection", counted)
    expands = []
    if route == "expand":
        rule, expand = ld.grouped_launch_wins, fl.lora_expand_
        monkeypatch.setattr(ld, "grouped_launch_wins", lambda op, rows, k, adapted: not adapted and rule(
            op, rows, k, adapted))
        monkeypatch.setattr(fl, "lora_expand_", lambda *args, **kwargs: expands.append(1) or expand(*args, **kwargs))

    def runner_for(model):
        runner = mr.ModelRunner(model, EngineConfig(block_size=BLOCK, cuda_graphs=graphs), DEVICE)
        runner.allocate_kv_cache(16)
        return runner

    def rollout(runner):
        blocks = Blocks(16)
        seqs = [make_seq(i, p, blocks.take(2)) for i, p in enumerate(prompts_of([3, 9, 20]))]
        generate(runner, seqs, 4)
        return seqs

    def assert_same(got, expected):
        for a, b in zip(got, expected):
            assert a.completion_ids == b.completion_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)

    model = apply_lora(build("qwen2", device=DEVICE), LoraSettings(rank=8, alpha=16))
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    with torch.no_grad():
        for p in lora_b:
            p.normal_(0, 0.2)
    runner = runner_for(model)
    adapted = rollout(runner)
    assert served["lora"] >= 2 * len(unwrap_causal_lm(model).model.layers)  # o and down, at least the prefill
    assert bool(expands) == (route == "expand")
    assert_same(adapted, rollout(runner_for(copy.deepcopy(model).merge_and_unload())))
    with torch.no_grad():  # an optimizer step that zeroes the adapters: the base model's generation again
        for p in lora_b:
            p.zero_()
    again = rollout(runner)
    assert_same(again, rollout(runner_for(build("qwen2", device=DEVICE))))
    assert any(a.completion_ids != b.completion_ids or a.logprobs != pytest.approx(b.logprobs, abs=1e-4)
               for a, b in zip(adapted, again))  # the adapters mattered


def test_float32_tiles_above_the_gemv_range_fit_the_shared_memory_of_the_bfloat16_ones():
    """The measured large-batch tiles are for 2-byte inputs; float32 ones of the same shape needed 262,144 bytes of
    shared memory for the 128-row gate/up (an H100 has 232,448): BLOCK_K halves instead."""
    for rows in (65, 128, 256):
        for per in (1, 2):
            bf16, fp32 = (lt.pick_tiles(rows, (1536,), 576, size, per) for size in (2, 4))
            smem = [(t.block_m + per * t.block_n) * t.block_k * size * t.num_stages for t, size in ((bf16, 2), (fp32, 4))]
            assert smem[1] == smem[0] and fp32.block_k == bf16.block_k // 2
    tma = lt.for_element_size(lt._TMA_GATE_UP_TILES[128], 4)
    assert (tma.block_m + 2 * tma.block_n) * tma.block_k * 4 * tma.num_stages <= 232_448
