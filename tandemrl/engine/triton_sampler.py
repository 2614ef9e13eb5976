"""One-pass Triton sampler for the decode step: the sampled token and its log-probability from one read of the logits.

Same results as ``backends.sampler.sample_tokens(..., apply_filters=False)`` (temperature only, no top-k/top-p):
sampled rows draw from ``softmax(logits / T)`` and report ``log_softmax(logits / T)[token]``; rows with ``T <= 0``
are greedy: ``argmax(logits)`` (first index of the maximum, as torch) with ``log_softmax(logits)`` at it.

Method (one pass, float32 inside): each program walks its columns in [QUAD, 4] tiles of consecutive columns.
Every tile slot keeps its own running max and sum of ``exp((x - max) / T)`` (an online log-sum-exp: one exp per
element) and its best Gumbel race key ``x + T * g`` (``argmax(x/T + g)`` with ``g ~ Gumbel(0, 1)`` draws from
``softmax(x/T)``; scaling the key by T keeps the argmax and saves a multiply); greedy rows race the raw logits.
Slots are reduced once at the end; the log-prob is ``(x[token] - max) / T - log(sum)``, x[token] read again.
The noise is counter-based Philox keyed by the seed: the call for counter (row, column // 4) gives four 32-bit
words, one per column of a tile row, so the noise is a pure function of (seed, row, column, V).

Rows are split over several programs until about four run per SM (one program per row cannot use the GPU at
batch 1, and even at batch 256 more programs hide more latency): the programs write (max, sum, best key, best
column) partials to a small workspace and a second kernel merges them.
The split never changes the sampled tokens (same noise per column), only float rounding of the log-probs.
"""

from __future__ import annotations

import functools
import numbers
import os

import torch
from torch import Tensor

try:  # optional: without Triton (or off CUDA) callers keep the torch sampler
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - missing or broken install
    triton = None

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_QUAD = 512  # a chunk is a [QUAD, 4] tile of consecutive columns: 2048 for a 151936 vocabulary
_MIN_QUAD = 16
# rows are split until about this many programs per SM run (H100, B=256: 4 splits 96 us, 1 split 111 us)
_PROGRAMS_PER_SM = 4
_SEED_MASK = (1 << 31) - 1


def fused_sample_available(device: torch.device | str) -> bool:
    """Whether ``fused_sample`` can run here: Triton importable and a CUDA device."""
    return triton is not None and torch.device(device).type == "cuda"


def fused_sample(
    logits: Tensor, temperature: Tensor, seed: int | Tensor, *, splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample one token per row of ``logits`` [B, V] (bf16/fp16/fp32, unit column stride) in one pass.

    temperature: [B] float32 on the same device, ``<= 0`` means greedy. seed: a Python int (only its low 62 bits
    are used), or an int64 tensor with one element on the same device, read by the kernel: a CUDA graph captures
    the tensor's address, so write a fresh value into it before each replay (a Python int is frozen at capture).
    splits: programs per row (None: picked from the batch size and the SM count; 1: one program per row, no
    workspace). Returns (tokens [B] int64, logprobs [B] float32), as ``sample_tokens(..., apply_filters=False)``.
    """
    _check_inputs(logits, temperature, seed)
    batch, vocab = logits.shape
    device = logits.device
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    logprobs = torch.empty(batch, dtype=torch.float32, device=device)
    if batch == 0:
        return tokens, logprobs
    quad = _quad_size(vocab)
    n_chunks = triton.cdiv(vocab, 4 * quad)
    per_split = triton.cdiv(n_chunks, _pick_splits(batch, n_chunks, device, splits))
    n_splits = triton.cdiv(n_chunks, per_split)  # no empty program
    if isinstance(seed, Tensor):
        seed_ptr, seed_lo, seed_hi = seed, 0, 0
    else:  # two non-negative int32 halves: one kernel signature whatever the seed's size
        seed = int(seed)
        seed_ptr, seed_lo, seed_hi = temperature, seed & _SEED_MASK, (seed >> 31) & _SEED_MASK
    split = n_splits > 1
    # the partials: (max, sum of exp, best key, best column) per program, as raw 32-bit words
    work = torch.empty((batch, n_splits, 4), dtype=torch.int32, device=device) if split else tokens
    _sample_kernel[(batch, n_splits)](
        logits, temperature, seed_ptr, seed_lo, seed_hi, tokens, logprobs, work,
        logits.stride(0), vocab, n_chunks, per_split,
        QUAD=quad, SEED_FROM_PTR=isinstance(seed, Tensor), SPLIT=split, FAST=device.type == "cuda",
        num_warps=_warps(quad))
    if split:
        _combine_kernel[(batch,)](
            logits, temperature, work, tokens, logprobs, logits.stride(0), n_splits,
            BLOCK_S=triton.next_power_of_2(n_splits), num_warps=1)
    return tokens, logprobs


def _check_inputs(logits: Tensor, temperature: Tensor, seed: int | Tensor) -> None:
    if triton is None:
        raise RuntimeError("fused_sample: Triton is not installed")
    if not isinstance(logits, Tensor) or logits.dim() != 2:
        raise ValueError(f"fused_sample: logits must be a 2-D tensor [B, V], got {_describe(logits)}")
    if logits.dtype not in _DTYPES:
        raise ValueError(f"fused_sample: logits dtype {logits.dtype} is not one of {_DTYPES}")
    batch, vocab = logits.shape
    if vocab == 0 or vocab >= 2**30:  # int32 column indices, with room for the last chunk's padding
        raise ValueError(f"fused_sample: vocabulary size {vocab} must be in [1, 2**30)")
    if logits.stride(1) != 1 and vocab > 1:
        raise ValueError(f"fused_sample: logits need a unit column stride, got strides {logits.stride()}")
    if not isinstance(temperature, Tensor) or temperature.shape != (batch,):
        raise ValueError(f"fused_sample: temperature must be a tensor of shape ({batch},), got "
                         f"{_describe(temperature)}")
    if temperature.dtype != torch.float32:
        raise ValueError(f"fused_sample: temperature must be float32, got {temperature.dtype}")
    if temperature.device != logits.device:
        raise ValueError(f"fused_sample: temperature is on {temperature.device}, logits on {logits.device}")
    if isinstance(seed, Tensor):
        if seed.dtype != torch.int64 or seed.numel() != 1 or seed.device != logits.device:
            raise ValueError(f"fused_sample: a tensor seed must be one int64 element on {logits.device}, got "
                             f"{seed.dtype} {tuple(seed.shape)} on {seed.device}")
    elif isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"fused_sample: seed must be a Python int or an int64 tensor, got {type(seed).__name__}")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if logits.device.type != "cuda" and not (interpret and logits.device.type == "cpu"):
        raise ValueError(f"fused_sample: needs a CUDA device (or CPU under TRITON_INTERPRET=1), got {logits.device}")


def _describe(x: object) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__


def _quad_size(vocab: int) -> int:
    """Rows of 4 columns per chunk tile, from V alone."""
    return max(_MIN_QUAD, min(_MAX_QUAD, triton.next_power_of_2(triton.cdiv(vocab, 4))))


def _warps(quad: int) -> int:
    return max(1, min(8, quad // 64))  # QUAD 512: 8 warps, 2 tile rows (8 columns) per thread, 64 registers


def _pick_splits(batch: int, n_chunks: int, device: torch.device, splits: int | None) -> int:
    if splits is not None:
        if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
            raise ValueError(f"fused_sample: splits must be a positive int, got {splits!r}")
        return min(splits, n_chunks)
    if device.type != "cuda":
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(n_chunks, triton.cdiv(_PROGRAMS_PER_SM * sms, batch)))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# ---------------------------------------------------------------------------------------------- kernels

if triton is not None:
    _LOG2E = tl.constexpr(1.4426950408889634)
    _LN2 = tl.constexpr(0.6931471805599453)
    _NEG_INF = tl.constexpr(float("-inf"))
    # a slot's running max starts at -FLT_MAX, not -inf: x - max is then never -inf - -inf (NaN), so a masked
    # (-inf) logit gives exp(-inf) = 0 with no extra select, and an all-masked slot's sum stays 0
    _MAX_INIT = tl.constexpr(-3.4028234663852886e38)
    _NO_COLUMN = tl.constexpr(2**31 - 1)

    @triton.jit
    def _log2(x, FAST: tl.constexpr):
        """log2 of a positive normal float. tl.log2 is libdevice's exact log2f: ~20 FMAs and a branch per call,
        twice per element; the hardware approximation (MUFU, abs. error ~2**-22) is ample for the noise."""
        if FAST:
            y = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                          pack=1)
        else:  # the interpreter runs no PTX
            y = tl.log2(x)
        return y

    @triton.jit
    def _update(m, s, best, best_col, row_ptr, V, cols, r, c, t_ln2, SAMPLE: tl.constexpr, FAST: tl.constexpr):
        """One tile of columns into the per-slot state: the online log-sum-exp of x*c (c = log2(e)/t) and the
        race on key = x + t*Gumbel (argmax(x/t + g) scaled by t; greedy rows race x alone)."""
        x = tl.load(row_ptr + cols, mask=cols < V, other=_NEG_INF).to(tl.float32)
        e = tl.exp2(-tl.abs(x - m) * c)  # one exp per element: x > m rescales the old sum by e, else adds e
        s = tl.where(x > m, s * e + 1.0, s + e)
        m = tl.maximum(m, x)
        if SAMPLE:
            # 23 random bits under a 1.0 exponent give 1 + k * 2**-23; minus (1 - 2**-24), exactly:
            # v = (2k + 1) * 2**-24, in (0, 1) and never 0 or 1 (no log(0)), with no int-to-float conversion
            v = ((r >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 0.999999940395355224609375
            # E = -ln(1 - v) ~ Exp(1). Small v (small E: the tail where rare tokens win) needs a relative
            # accuracy that a fast log near 1 lacks: the series there (truncation < 2e-7 relative for v < 2**-5);
            # elsewhere 1 - v is exact and |log2(1 - v)| >= 0.046, so an absolute error of 2**-22 is harmless
            series = v * (1.0 + v * (0.5 + v * (0.3333333432674408 + v * 0.25)))
            exp1 = tl.where(v < 0.03125, series, -_LN2 * _log2(1.0 - v, FAST))
            key = x - t_ln2 * _log2(exp1, FAST)  # x + t * g with g = -ln(E); -inf stays -inf: never drawn
        else:
            key = x
        win = key > best  # strict: a slot keeps its first (lowest) column among equal keys
        return m, s, tl.where(win, key, best), tl.where(win, cols, best_col)

    @triton.jit
    def _scan(
        row_ptr, V, c_lo, c_hi, t, seed, counter, QUAD: tl.constexpr, SAMPLE: tl.constexpr, FAST: tl.constexpr,
    ):
        """Chunks [c_lo, c_hi) of one row, a chunk being a [QUAD, 4] tile of consecutive columns: each thread
        holds whole rows of 4 columns, the 4 words of one Philox call (so the noise needs no layout shuffle).
        Returns (max x, sum exp((x - max)/t), best key, its column)."""
        quads = tl.arange(0, QUAD)
        m = tl.full([QUAD, 4], _MAX_INIT, tl.float32)
        s = tl.zeros([QUAD, 4], tl.float32)
        best = tl.full([QUAD, 4], _NEG_INF, tl.float32)
        best_col = tl.zeros([QUAD, 4], tl.int32)
        c = _LOG2E / t
        t_ln2 = t * _LN2
        for chunk in range(c_lo, c_hi):
            quad = chunk * QUAD + quads  # column // 4
            cols = quad[:, None] * 4 + tl.arange(0, 4)[None, :]
            if SAMPLE:  # counter = (row, column // 4), word = column % 4
                r0, r1, r2, r3 = tl.randint4x(seed, counter + quad)
                bits = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), [QUAD, 4])
            else:
                bits = cols  # unused by greedy rows
            # each state slot sees its columns in increasing order (greedy ties keep the first)
            m, s, best, best_col = _update(m, s, best, best_col, row_ptr, V, cols, bits, c, t_ln2, SAMPLE, FAST)
        row_max = tl.max(tl.max(m, axis=1), axis=0)
        total = tl.sum(tl.sum(s * tl.exp2((m - row_max) * c), axis=1), axis=0)
        best_key = tl.max(tl.max(best, axis=1), axis=0)
        # the lowest column among slots holding the best key (torch.argmax's tie rule for greedy rows)
        col = tl.min(tl.min(tl.where(best == best_key, best_col, _NO_COLUMN), axis=1), axis=0)
        return row_max, total, best_key, col

    @triton.jit
    def _finish(row_ptr, tokens_ptr, logprobs_ptr, row, row_max, total, col, t):
        """log_softmax(x/t)[col] = (x[col] - max)/t - log(sum exp((x - max)/t)); t is 1 for greedy rows."""
        x_col = tl.load(row_ptr + col).to(tl.float32)
        tl.store(tokens_ptr + row, col.to(tl.int64))
        tl.store(logprobs_ptr + row, (x_col - row_max) / t - tl.log(total))

    @triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
    def _sample_kernel(
        logits_ptr, temp_ptr, seed_ptr, seed_lo, seed_hi, tokens_ptr, logprobs_ptr, work_ptr,
        stride_row, V, n_chunks, per_split,
        QUAD: tl.constexpr, SEED_FROM_PTR: tl.constexpr, SPLIT: tl.constexpr, FAST: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        n_splits = tl.num_programs(1)
        row_ptr = logits_ptr + row * stride_row  # int64: B * row stride can pass 2**31
        if SEED_FROM_PTR:
            seed = tl.load(seed_ptr)
        else:
            seed = (seed_hi.to(tl.int64) << 31) | seed_lo.to(tl.int64)
        c_lo = split * per_split
        c_hi = tl.minimum(c_lo + per_split, n_chunks)
        counter = row * tl.cdiv(V, 4)  # Philox counter base: one counter per 4 columns of the row
        t = tl.load(temp_ptr + row)
        greedy = t <= 0
        t = tl.where(greedy, 1.0, t)  # greedy rows: the raw logits' race and log-softmax
        if greedy:
            row_max, total, best_key, col = _scan(row_ptr, V, c_lo, c_hi, t, seed, counter, QUAD, False, FAST)
        else:
            row_max, total, best_key, col = _scan(row_ptr, V, c_lo, c_hi, t, seed, counter, QUAD, True, FAST)
        if SPLIT:
            out = work_ptr + (row * n_splits + split) * 4
            tl.store(out, row_max.to(tl.int32, bitcast=True))
            tl.store(out + 1, total.to(tl.int32, bitcast=True))
            tl.store(out + 2, best_key.to(tl.int32, bitcast=True))
            tl.store(out + 3, col)
        else:
            _finish(row_ptr, tokens_ptr, logprobs_ptr, row, row_max, total, col, t)

    @triton.jit
    def _combine_kernel(
        logits_ptr, temp_ptr, work_ptr, tokens_ptr, logprobs_ptr, stride_row, n_splits, BLOCK_S: tl.constexpr,
    ):
        """Merge one row's partials: log-sum-exps rescaled to the common max, the best key's column."""
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_S)
        valid = offs < n_splits
        part = work_ptr + (row * n_splits + offs) * 4
        m = tl.load(part, mask=valid, other=0).to(tl.float32, bitcast=True)
        s = tl.load(part + 1, mask=valid, other=0).to(tl.float32, bitcast=True)
        key = tl.load(part + 2, mask=valid, other=0).to(tl.float32, bitcast=True)
        col = tl.load(part + 3, mask=valid, other=0)
        m = tl.where(valid, m, _MAX_INIT)
        s = tl.where(valid, s, 0.0)
        key = tl.where(valid, key, _NEG_INF)
        t = tl.load(temp_ptr + row)
        t = tl.where(t <= 0, 1.0, t)
        row_max = tl.max(m, axis=0)
        total = tl.sum(s * tl.exp2((m - row_max) * (_LOG2E / t)), axis=0)
        best_key = tl.max(key, axis=0)
        best_col = tl.min(tl.where(valid & (key == best_key), col, _NO_COLUMN), axis=0)
        _finish(logits_ptr + row * stride_row, tokens_ptr, logprobs_ptr, row, row_max, total, best_col, t)
