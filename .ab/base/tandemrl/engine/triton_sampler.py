"""Triton sampler for the decode step: the sampled token and its log-probability from one read of the logits.

Same results as ``backends.sampler.sample_tokens(..., apply_filters=False)`` (temperature only, no top-k/top-p):
sampled rows draw from ``softmax(logits / T)`` and report ``log_softmax(logits / T)[token]``; rows with ``T <= 0``
are greedy: ``argmax(logits)`` (first index of the maximum, as torch) with ``log_softmax(logits)`` at it.

Method: inverse CDF over chunk partials, one uniform per row (not one random number per vocabulary element).
The columns of a row are cut into fixed chunks (``_chunk_size``: from V alone, never from B or the split).

1. ``_partials_kernel``, grid (B, programs per row), reads the logits once: for every chunk c it writes to a
   workspace [B, n_chunks, 3] the chunk max ``m_c``, ``s_c = sum exp((x - m_c) / T)`` (one exp2 per element,
   float32) and the first column of the maximum (greedy rows). The number of programs per row (``splits``) only
   decides how many chunks one program walks, so it never changes the draw.
2. ``_draw_kernel``, grid (B,), per row: ``M = max m_c``, chunk weights ``w_c = s_c * exp((m_c - M) / T)``,
   ``total = sum w_c``; one uniform ``u`` in [0, 1) from Philox keyed by (seed, row); the chunk is the first one
   whose inclusive cumulative weight exceeds ``u * total``, then its columns are read again (one chunk per row)
   and the token is the first column whose inclusive cumulative ``exp((x - M) / T)`` exceeds the same fraction
   of the chunk's own sum. The log-prob is ``(x[token] - M) / T - log(total)``; greedy rows use T = 1 and the
   lowest chunk holding M with its recorded column (torch.argmax's first index among ties).
   A column with ``exp((x - M) / T) = 0`` (a masked -inf logit, or an underflow) is never drawn: it never makes a
   cumulative sum cross. Rounding guard: where nothing crosses (a target rounded up to the total, or the fraction
   to 1), the last chunk with a positive weight, then its last positive column, are taken.

Precision: the exponentials and the partials are float32 (a chunk sum of at most 2048 terms: ~1e-6 relative
rounding); the merge, both cumulative sums and the target are float64 and ``u`` has 53 random bits (a 2**-53 grid).
So every token is drawn with its softmax probability up to ~1e-6 relative rounding (a few 1e-6 deep in the tail,
where the float32 exponent ``(x - M) / T`` is large), rare tokens included: float32 cumulative sums and a 24-bit
``u`` would quantise the draw to multiples of ~2**-24 of the total, drawing a token rarer than ~6e-8 at either 0 or
~6e-8. Only tokens whose float32 ``exp((x - M) / T)`` underflows (below ~2**-126 of the top token) are never drawn.
The float64 work is a few thousand values per row in the second kernel, off the memory-bound pass.
"""

from __future__ import annotations

import functools
import numbers
import os

import torch
from torch import Tensor

from tandemrl.engine import pdl

try:  # optional: without Triton (or off CUDA) callers keep the torch sampler
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - missing or broken install
    triton = None

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_CHUNK = 2048  # columns per chunk: 75 chunks for a 151936 vocabulary, 8 per thread with 8 warps
_MIN_CHUNK = 64
_PARTIALS_BLOCK = 1024  # the second kernel reads a row's partials this many chunks at a time
# rows are split until about this many programs per SM run (one program per row cannot fill the GPU at batch 1,
# and even at batch 256 more programs hide more load latency)
_PROGRAMS_PER_SM = 4
_SEED_MASK = (1 << 31) - 1
_PARTIAL_WORDS = 3  # per chunk: max, sum of exp (float32 bits), first column of the max


def fused_sample_available(device: torch.device | str) -> bool:
    """Whether ``fused_sample`` can run here: Triton importable and a CUDA device."""
    return triton is not None and torch.device(device).type == "cuda"


def fused_sample(
    logits: Tensor, temperature: Tensor, seed: int | Tensor, *, splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample one token per row of ``logits`` [B, V] (bf16/fp16/fp32, unit column stride) from one read of it.

    temperature: [B] float32 on the same device, ``<= 0`` means greedy. seed: a Python int (only its low 62 bits
    are used), or an int64 tensor with one element on the same device, read by the kernel: a CUDA graph captures
    the tensor's address, so write a fresh value into it before each replay (a Python int is frozen at capture).
    splits: programs per row in the first pass (None: picked from the batch size and the SM count); it never
    changes the tokens. Returns (tokens [B] int64, logprobs [B] float32), as
    ``sample_tokens(..., apply_filters=False)``.
    """
    _check_inputs(logits, temperature, seed)
    return _run_kernels(logits, temperature, seed, splits, uniform=None)


def _run_kernels(
    logits: Tensor, temperature: Tensor, seed: int | Tensor, splits: int | None, uniform: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Both kernels on checked inputs. uniform: None (the Philox draw from the seed), or [B] float64 values in
    [0, 1) used as the rows' uniforms instead (tests pin them to check the inverse CDF)."""
    batch, vocab = logits.shape
    device = logits.device
    tokens = torch.empty(batch, dtype=torch.int64, device=device)
    logprobs = torch.empty(batch, dtype=torch.float32, device=device)
    if batch == 0:
        return tokens, logprobs
    chunk = _chunk_size(vocab)
    n_chunks = triton.cdiv(vocab, chunk)
    per_program = triton.cdiv(n_chunks, _pick_splits(batch, n_chunks, device, splits))
    n_programs = triton.cdiv(n_chunks, per_program)  # no empty program
    partials = torch.empty((batch, n_chunks, _PARTIAL_WORDS), dtype=torch.int32, device=device)
    _partials_kernel[(batch, n_programs)](
        logits, temperature, partials, logits.stride(0), vocab, n_chunks, per_program,
        CHUNK=chunk, num_warps=_partials_warps(chunk), **pdl.launch_options(device))
    seed_from_ptr = isinstance(seed, Tensor)
    if seed_from_ptr:
        seed_ptr, seed_lo, seed_hi = seed, 0, 0
    else:  # two non-negative int32 halves: one kernel signature whatever the seed's size
        seed = int(seed)
        seed_ptr, seed_lo, seed_hi = temperature, seed & _SEED_MASK, (seed >> 31) & _SEED_MASK
    _draw_kernel[(batch,)](
        logits, temperature, partials, seed_ptr, seed_lo, seed_hi, tokens if uniform is None else uniform,
        tokens, logprobs, logits.stride(0), vocab, n_chunks,
        CHUNK=chunk, BLOCK_P=min(_PARTIALS_BLOCK, triton.next_power_of_2(n_chunks)),
        SEED_FROM_PTR=seed_from_ptr, GIVEN_UNIFORM=uniform is not None, num_warps=_draw_warps(chunk),
        **pdl.launch_options(device))
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


def _chunk_size(vocab: int) -> int:
    """Columns per chunk, from V alone (so the draw depends on neither B nor the split)."""
    return max(_MIN_CHUNK, min(_MAX_CHUNK, triton.next_power_of_2(vocab)))


def _partials_warps(chunk: int) -> int:
    return max(1, min(8, chunk // 256))  # 2048 columns: 8 warps, 8 columns (one 16-byte bf16 load) per thread


def _draw_warps(chunk: int) -> int:
    return max(1, min(4, chunk // 512))  # one chunk per row: latency, not bandwidth


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
    _NEG_INF = tl.constexpr(float("-inf"))
    # a chunk's max is stored as at least -FLT_MAX, not -inf: x - max is then never -inf - -inf (NaN), so masked
    # (-inf) logits give exp(-inf) = 0 with no extra select, and an all-masked chunk has sum 0 and weight 0
    _MAX_FLOOR = tl.constexpr(-3.4028234663852886e38)
    _NO_COLUMN = tl.constexpr(2**31 - 1)
    _TWO_POW_M53 = tl.constexpr(1.1102230246251565e-16)
    _WORDS = tl.constexpr(_PARTIAL_WORDS)

    # ------------------------------------------------------------------ first pass: chunk partials

    @triton.jit
    def _load_chunk(row_ptr, chunk, end, offs, CHUNK: tl.constexpr):
        """One chunk's logits in float32, -inf from column `end` on (V; 0 loads nothing)."""
        cols = chunk * CHUNK + offs
        return tl.load(row_ptr + cols, mask=cols < end, other=_NEG_INF).to(tl.float32)

    @triton.jit
    def _store_partials(out_ptr, x, first_col, offs, scale, ARGMAX: tl.constexpr):
        """(max, sum of exp2((x - max) * scale), first column of the max) of one chunk, as 32-bit words."""
        peak = tl.max(x, axis=0)
        m = tl.maximum(peak, _MAX_FLOOR)
        s = tl.sum(tl.exp2((x - m) * scale), axis=0)  # the one exp per element
        tl.store(out_ptr, m.to(tl.int32, bitcast=True))
        tl.store(out_ptr + 1, s.to(tl.int32, bitcast=True))
        if ARGMAX:  # greedy rows only (sampled rows never read it): the lowest column of the max (-inf: the first)
            tl.store(out_ptr + 2, tl.min(tl.where(x == peak, first_col + offs, _NO_COLUMN), axis=0))

    @triton.jit
    def _walk_chunks(row_ptr, out_ptr, V, first, last, scale, CHUNK: tl.constexpr, ARGMAX: tl.constexpr):
        """Chunks [first, last) of one row. The next chunk's load is issued before the current chunk's
        reductions, so a program always has a load in flight (the pass is memory bound)."""
        offs = tl.arange(0, CHUNK)
        x = _load_chunk(row_ptr, first, V, offs, CHUNK)
        for chunk in range(first, last):
            x_next = _load_chunk(row_ptr, chunk + 1, tl.where(chunk + 1 < last, V, 0), offs, CHUNK)
            _store_partials(out_ptr + chunk * _WORDS, x, chunk * CHUNK, offs, scale, ARGMAX)
            x = x_next

    @triton.jit
    def _partials_kernel(
        logits_ptr, temp_ptr, partials_ptr, stride_row, V, n_chunks, per_program, CHUNK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.pdl_enter(PDL)
        row = tl.program_id(0).to(tl.int64)
        first = tl.program_id(1) * per_program
        last = tl.minimum(first + per_program, n_chunks)
        row_ptr = logits_ptr + row * stride_row  # int64: B * row stride can pass 2**31
        out_ptr = partials_ptr + row * n_chunks * _WORDS
        t = tl.load(temp_ptr + row)
        greedy = t <= 0
        scale = _LOG2E / tl.where(greedy, 1.0, t)  # exp(y / T) = exp2(y * log2(e) / T); greedy rows: T = 1
        if greedy:
            _walk_chunks(row_ptr, out_ptr, V, first, last, scale, CHUNK, True)
        else:
            _walk_chunks(row_ptr, out_ptr, V, first, last, scale, CHUNK, False)

    # ------------------------------------------------------------------ second pass: merge and draw

    @triton.jit
    def _chunk_weights(parts_ptr, chunks, n_chunks, peak, scale):
        """w_c = s_c * exp((m_c - M) / T) in float64, 0 past the last chunk."""
        valid = chunks < n_chunks
        m = tl.load(parts_ptr + chunks * _WORDS, mask=valid, other=0).to(tl.float32, bitcast=True)
        s = tl.load(parts_ptr + chunks * _WORDS + 1, mask=valid, other=0).to(tl.float32, bitcast=True)
        w = s.to(tl.float64) * tl.exp2((m - peak) * scale).to(tl.float64)
        return tl.where(valid, w, 0.0)

    @triton.jit
    def _merged_max(parts_ptr, n_chunks, BLOCK_P: tl.constexpr):
        """M = max m_c and the lowest chunk holding it."""
        idx = tl.arange(0, BLOCK_P)
        peak = tl.full([], _NEG_INF, tl.float32)
        peak_chunk = tl.zeros([], tl.int32)
        for start in range(0, n_chunks, BLOCK_P):
            chunks = start + idx
            valid = chunks < n_chunks
            m = tl.load(parts_ptr + chunks * _WORDS, mask=valid, other=0).to(tl.float32, bitcast=True)
            m = tl.where(valid, m, _NEG_INF)
            block_peak = tl.max(m, axis=0)
            block_first = tl.min(tl.where(m == block_peak, chunks, _NO_COLUMN), axis=0)
            peak_chunk = tl.where(block_peak > peak, block_first, peak_chunk)  # strict: an earlier block wins ties
            peak = tl.maximum(peak, block_peak)
        return peak, peak_chunk

    @triton.jit
    def _merged_total(parts_ptr, n_chunks, peak, scale, BLOCK_P: tl.constexpr):
        """sum exp((x - M) / T) over the row, from the chunk partials."""
        idx = tl.arange(0, BLOCK_P)
        total = tl.zeros([], tl.float64)
        for start in range(0, n_chunks, BLOCK_P):
            total += tl.sum(_chunk_weights(parts_ptr, start + idx, n_chunks, peak, scale), axis=0)
        return total

    @triton.jit
    def _row_uniform(seed, row):
        """u in [0, 1) on a 2**-53 grid: 21 + 32 bits of the Philox call keyed by the seed, counter = row."""
        r0, r1, _, _ = tl.randint4x(seed, row)
        bits = ((r0 >> 11).to(tl.int64) << 32) | r1.to(tl.int64)  # unsigned words: zero-extended
        return bits.to(tl.float64) * _TWO_POW_M53

    @triton.jit
    def _pick_chunk(parts_ptr, n_chunks, peak, scale, target, BLOCK_P: tl.constexpr):
        """The first chunk whose inclusive cumulative weight exceeds target (a zero-weight chunk never does), and
        where target falls in it as a fraction of its weight, in [0, 1). None crossing (target rounded up to the
        total): the last chunk with a positive weight, fraction 1 (its last positive column)."""
        idx = tl.arange(0, BLOCK_P)
        carry = tl.zeros([], tl.float64)  # cumulative weight before the block
        picked = tl.zeros([], tl.int32) + n_chunks  # n_chunks: none yet
        frac = tl.full([], 1.0, tl.float64)
        last_positive = tl.zeros([], tl.int32)
        for start in range(0, n_chunks, BLOCK_P):
            chunks = start + idx
            w = _chunk_weights(parts_ptr, chunks, n_chunks, peak, scale)
            cum = carry + tl.cumsum(w, axis=0)  # non-negative terms: non-decreasing, so max = last
            first = tl.min(tl.where((chunks < n_chunks) & (cum > target), chunks, n_chunks), axis=0)
            before = tl.max(tl.where(chunks < first, cum, carry), axis=0)
            weight = tl.sum(tl.where(chunks == first, w, 0.0), axis=0)  # > 0 where first crosses
            take = (picked == n_chunks) & (first < n_chunks)
            frac = tl.where(take, (target - before) / tl.where(weight > 0, weight, 1.0), frac)
            picked = tl.where(take, first, picked)
            last_positive = tl.maximum(last_positive, tl.max(tl.where(w > 0, chunks, 0), axis=0))
            carry = tl.max(cum, axis=0)
        return tl.where(picked < n_chunks, picked, last_positive), frac

    @triton.jit
    def _pick_column(row_ptr, V, chunk, peak, scale, frac, CHUNK: tl.constexpr):
        """The first column of the chunk whose inclusive cumulative exp((x - M) / T) exceeds frac times the
        chunk's sum as read here (so the draw inside the chunk is exactly proportional to those values). None
        crossing (frac rounded to 1): the last positive column; none at all (every logit masked): the first."""
        offs = tl.arange(0, CHUNK)
        first_col = chunk * CHUNK
        x = _load_chunk(row_ptr, chunk, V, offs, CHUNK)
        p = tl.exp2((x - peak) * scale).to(tl.float64)
        cum = tl.cumsum(p, axis=0)
        crossed = tl.min(tl.where(cum > frac * tl.max(cum, axis=0), offs, _NO_COLUMN), axis=0)
        last_positive = tl.max(tl.where(p > 0, offs, 0), axis=0)
        return first_col + tl.where(crossed < CHUNK, crossed, last_positive)

    @triton.jit(do_not_specialize=["seed_lo", "seed_hi"])
    def _draw_kernel(
        logits_ptr, temp_ptr, partials_ptr, seed_ptr, seed_lo, seed_hi, uniform_ptr, tokens_ptr, logprobs_ptr,
        stride_row, V, n_chunks,
        CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, SEED_FROM_PTR: tl.constexpr, GIVEN_UNIFORM: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.pdl_enter(PDL)
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * stride_row
        parts_ptr = partials_ptr + row * n_chunks * _WORDS
        t = tl.load(temp_ptr + row)
        greedy = t <= 0
        t = tl.where(greedy, 1.0, t)  # greedy rows: the raw logits' log-softmax
        scale = _LOG2E / t
        peak, peak_chunk = _merged_max(parts_ptr, n_chunks, BLOCK_P)
        total = _merged_total(parts_ptr, n_chunks, peak, scale, BLOCK_P)
        if greedy:
            token = tl.load(parts_ptr + peak_chunk * _WORDS + 2)
        else:
            if GIVEN_UNIFORM:
                u = tl.load(uniform_ptr + row)
            elif SEED_FROM_PTR:
                u = _row_uniform(tl.load(seed_ptr), row)
            else:
                u = _row_uniform((seed_hi.to(tl.int64) << 31) | seed_lo.to(tl.int64), row)
            chunk, frac = _pick_chunk(parts_ptr, n_chunks, peak, scale, u * total, BLOCK_P)
            token = _pick_column(row_ptr, V, chunk, peak, scale, frac, CHUNK)
        x_token = tl.load(row_ptr + token).to(tl.float32)
        tl.store(tokens_ptr + row, token.to(tl.int64))
        # log_softmax(x / T)[token] = (x[token] - M) / T - log(sum exp((x - M) / T))
        tl.store(logprobs_ptr + row, (x_token - peak) / t - tl.log(total.to(tl.float32)))
