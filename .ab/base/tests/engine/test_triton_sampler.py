"""The Triton sampler (engine/triton_sampler.py: inverse CDF over chunk partials, one uniform per row) against the
semantics of ``sample_tokens(..., apply_filters=False)``: greedy rows are torch.argmax with log_softmax at it, sampled
rows report log_softmax(logits / T) at their token and follow softmax(logits / T) (chi-square), and a given uniform u
lands on the inverse-CDF token (the first whose cumulative probability exceeds u). Runs on CUDA, or on the CPU under
Triton's interpreter (TRITON_INTERPRET=1, float32/float16 only, fewer rows: a few ms per program there)."""

from __future__ import annotations

import os

import pytest
import torch
from scipy.stats import chisquare, kstest

from tandemrl.backends.sampler import sample_tokens
from tandemrl.engine import triton_sampler as ts

HAS_CUDA = torch.cuda.is_available()
INTERPRET = ts.triton is not None and os.environ.get("TRITON_INTERPRET") == "1" and not HAS_CUDA
DEVICE = "cuda" if HAS_CUDA else "cpu"
needs_kernels = pytest.mark.skipif(ts.triton is None or not (HAS_CUDA or INTERPRET),
                                   reason="needs Triton and CUDA (or TRITON_INTERPRET=1)")
needs_cuda = pytest.mark.skipif(not HAS_CUDA or ts.triton is None, reason="needs a CUDA device and Triton")
# the interpreter evaluates the masked lanes' overflow (exp of -inf and the like) in numpy, which warns
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# (rows, vocab): single column, tiny, one chunk, odd sizes over several 2048-column chunks
SHAPES = [(1, 1), (2, 12), (3, 1000), (2, 4097), (3, 9001)]
TOL = dict(atol=1e-5, rtol=1e-5)
TOP_UNIFORM = 1.0 - 2.0**-53  # the largest uniform the kernel draws


def _small_chunks(monkeypatch, block_partials=2):
    """64-column chunks, and the second kernel reading a row's partials `block_partials` chunks at a time (its loop
    over blocks of partials runs with a few hundred columns)."""
    monkeypatch.setattr(ts, "_MAX_CHUNK", 64)
    monkeypatch.setattr(ts, "_PARTIALS_BLOCK", block_partials)


def _poison_allocator() -> None:
    """Fill freed device memory with NaN so an output the kernel never writes shows up."""
    if HAS_CUDA:
        junk = torch.full((1 << 24,), float("nan"), device="cuda")
        del junk


def _sample(logits, temperature, seed=1234, **kw):
    _poison_allocator()
    tokens, logprobs = ts.fused_sample(logits, temperature, seed, **kw)
    assert tokens.shape == logprobs.shape == (logits.shape[0],)
    assert tokens.dtype == torch.int64 and logprobs.dtype == torch.float32
    assert bool(((tokens >= 0) & (tokens < logits.shape[1])).all())
    return tokens, logprobs


def _sample_given_uniform(logits, temperature, uniform, **kw):
    """The kernels with the rows' uniforms pinned instead of drawn from a seed (float64 values)."""
    _poison_allocator()
    uniform = torch.as_tensor(uniform, dtype=torch.float64).to(logits.device)
    return ts._run_kernels(logits, temperature, 0, kw.get("splits"), uniform=uniform)


def _ref_probs(logits, temperature):
    """softmax(logits / T) in float64, T = 1 for greedy rows."""
    temp = torch.where(temperature <= 0, torch.ones_like(temperature), temperature)
    return (logits.double() / temp.double().unsqueeze(-1)).softmax(dim=-1).cpu()


def _ref_logprobs(logits, temperature, tokens):
    """log_softmax(logits / T)[token] in float32, T = 1 for greedy rows (as sample_tokens)."""
    temp = torch.where(temperature <= 0, torch.ones_like(temperature), temperature)
    logp = (logits.float() / temp.unsqueeze(-1)).log_softmax(dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _logits(rows, vocab, seed, dtype=torch.float32, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=g) * scale).to(DEVICE, dtype)


# ---------------------------------------------------------------------------------------------- exactness

@needs_kernels
@pytest.mark.parametrize("splits", [1, None, 2])
@pytest.mark.parametrize("rows,vocab", SHAPES)
def test_greedy_rows_are_argmax_with_log_softmax(rows, vocab, splits):
    logits = _logits(rows, vocab, rows * vocab)
    if vocab > 8:  # ties: torch.argmax takes the first index of the maximum (other lane, other chunk)
        logits[0, vocab // 2] = logits[0, vocab - 1] = logits[0, 5] = logits[0].max() + 1.0
    temperature = torch.tensor([0.0, -1.0, 0.0][:rows], device=DEVICE)
    tokens, logprobs = _sample(logits, temperature, splits=splits)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, temperature, tokens), **TOL)


@needs_kernels
@pytest.mark.parametrize("splits", [1, 3])
def test_greedy_ties_across_blocks_of_partials(splits, monkeypatch):
    _small_chunks(monkeypatch)  # 64-column chunks, partials merged 2 at a time: 7 chunks, 4 blocks
    logits = _logits(2, 430, 8)
    peak = logits.max() + 1.0
    logits[0, [75, 70, 130, 300, 429]] = peak  # chunk 1 (block 0) twice, chunk 2 (block 1), 4 (2), 6 (3)
    logits[1, [429, 300]] = peak  # only in later blocks
    temperature = torch.zeros(2, device=DEVICE)
    tokens, logprobs = _sample(logits, temperature, splits=splits)
    assert tokens.tolist() == [70, 300]
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, temperature, tokens), **TOL)


@needs_kernels
@pytest.mark.parametrize("splits", [1, None, 3])
@pytest.mark.parametrize("rows,vocab", SHAPES)
def test_sampled_logprobs_match_log_softmax(rows, vocab, splits):
    logits = _logits(rows, vocab, 7 + rows * vocab)
    temperature = torch.tensor([0.7, 1.0, 1.6][:rows], device=DEVICE)
    tokens, logprobs = _sample(logits, temperature, seed=99, splits=splits)
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, temperature, tokens), **TOL)


@needs_kernels
def test_mixed_greedy_and_sampled_rows_match_sample_tokens_semantics():
    rows, vocab = 6, 3001
    logits = _logits(rows, vocab, 5)
    temperature = torch.tensor([0.0, 0.8, -2.0, 1.0, 0.0, 1.3], device=DEVICE)
    tokens, logprobs = _sample(logits, temperature, seed=3)
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, temperature, tokens), **TOL)
    greedy = temperature <= 0
    ref_tokens, ref_logprobs = sample_tokens(logits, temperature, torch.ones(rows, device=DEVICE),
                                             torch.zeros(rows, dtype=torch.long, device=DEVICE),
                                             apply_filters=False)
    assert torch.equal(tokens[greedy], ref_tokens[greedy])  # the existing sampler's greedy output exactly
    torch.testing.assert_close(logprobs[greedy], ref_logprobs[greedy], **TOL)


# ---------------------------------------------------------------------------------------------- distribution

def _chi_square_p(logits_row, temperature, draws, seed, **kw):
    """p-value of `draws` samples (identical rows: a stride-0 view) against softmax(row / T)."""
    vocab = logits_row.numel()
    logits = logits_row.to(DEVICE).unsqueeze(0).expand(draws, vocab)
    tokens, logprobs = _sample(logits, torch.full((draws,), temperature, device=DEVICE), seed=seed, **kw)
    probs = (logits_row.double() / temperature).softmax(-1)
    finite = torch.isfinite(logits_row)
    counts = torch.bincount(tokens.cpu(), minlength=vocab).double()
    assert counts[~finite].sum() == 0  # masked entries are never drawn
    torch.testing.assert_close(logprobs.cpu(), probs.log()[tokens.cpu()].float(), **TOL)
    return chisquare(counts[finite].numpy(), (probs[finite] * draws).numpy()).pvalue


@needs_kernels
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_draws_follow_softmax_chi_square(temperature):
    # 12 tokens, probabilities ~3%..17% at T=0.7: every expected count >= 5 even with the interpreter's few rows
    row = torch.linspace(0.6, -0.6, 12)[torch.randperm(12, generator=torch.Generator().manual_seed(0))]
    draws = 20000 if HAS_CUDA else 100
    assert _chi_square_p(row, temperature, draws, seed=11) > 1e-3


@needs_kernels
def test_draws_follow_softmax_across_chunks_and_splits(monkeypatch):
    # 64-column chunks: 300 columns are 5 chunks (3 blocks of 2 partials), 3 splits; 12 finite logits over them
    _small_chunks(monkeypatch)
    row = torch.full((300,), float("-inf"))
    row[torch.arange(12) * 25 + 7] = torch.linspace(0.5, -0.5, 12)
    draws = 20000 if HAS_CUDA else 100
    assert _chi_square_p(row, 1.0, draws, seed=5, splits=3) > 1e-3


# ---------------------------------------------------------------------------------------------- inverse CDF

@needs_kernels
@pytest.mark.parametrize("small_chunks", [False, True])
def test_given_uniform_lands_on_the_inverse_cdf_token(small_chunks, monkeypatch):
    """token = the first column whose cumulative softmax exceeds u (u = 0: the first drawable column; u just below
    1: the last one), whatever the chunking."""
    if small_chunks:
        _small_chunks(monkeypatch)
    rows, vocab = 16, 1500
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(rows, vocab, generator=g) * 2.0
    logits[torch.rand(rows, vocab, generator=g) < 0.3] = float("-inf")
    logits[:, :70] = logits[:, -90:] = float("-inf")  # masked first and last chunks (small chunks: whole chunks)
    logits[1, 700] = 12.0  # one dominant token, a long tail behind it
    temperature = torch.linspace(0.3, 2.0, rows)
    uniform = torch.rand(rows, generator=g, dtype=torch.float64)
    uniform[0], uniform[1], uniform[2] = 0.0, TOP_UNIFORM, 1e-7
    tokens, logprobs = _sample_given_uniform(logits.to(DEVICE), temperature.to(DEVICE), uniform, splits=2)
    tokens = tokens.cpu()
    cum = _ref_probs(logits, temperature).cumsum(dim=-1)
    drawable = torch.isfinite(logits)
    assert bool(drawable.gather(-1, tokens.unsqueeze(-1)).all())
    columns = torch.arange(vocab).expand(rows, vocab)
    first = torch.where(drawable, columns, vocab).min(dim=-1).values
    last = torch.where(drawable, columns, -1).max(dim=-1).values
    assert tokens[0] == first[0] and tokens[1] == last[1]
    # u lies in the token's cumulative interval [cum[token - 1], cum[token]), up to the kernel's float32 rounding
    slack = 1e-6
    below = torch.where(tokens > 0, cum.gather(-1, (tokens - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1), 0.0)
    upto = cum.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert bool(((below - slack <= uniform) & (uniform < upto + slack)).all()), (tokens, uniform, below, upto)
    expected = torch.searchsorted(cum, uniform.unsqueeze(-1), right=True).squeeze(-1)  # first cum > u
    clear = (cum - uniform.unsqueeze(-1)).abs().min(dim=-1).values > slack  # no boundary within rounding
    assert int(clear.sum()) >= rows - 5 and torch.equal(tokens[clear], expected[clear])
    torch.testing.assert_close(logprobs, _ref_logprobs(logits.to(DEVICE), temperature.to(DEVICE),
                                                       tokens.to(DEVICE)), **TOL)


@needs_kernels
@pytest.mark.parametrize("splits", [1, 3])
def test_given_uniform_exact_boundaries(splits, monkeypatch):
    """Equal logits on the even columns of chunks 1..4 (chunk 0 and the odd columns masked): every sum is exact, so
    u = k/128 draws exactly the k-th drawable column and u just below it the one before; a masked column or chunk
    is never drawn, even by the rounding guard (u = 1: the last drawable column)."""
    _small_chunks(monkeypatch)
    vocab = 64 * 6  # chunk 5 masked too
    logits = torch.full((vocab,), float("-inf"))
    drawable = torch.arange(64, 64 + 256, 2)
    logits[drawable] = 1.5
    ks = torch.tensor([0, 1, 31, 32, 33, 64, 100, 127])
    at = ks.double() / 128.0
    uniform = torch.cat([at, at[1:] - 2.0**-53, torch.tensor([TOP_UNIFORM, 1.0], dtype=torch.float64)])
    expected = torch.cat([drawable[ks], drawable[ks[1:] - 1], drawable[-1:], drawable[-1:]])
    rows = uniform.numel()
    temperature = torch.full((rows,), 0.9, device=DEVICE)
    tokens, logprobs = _sample_given_uniform(logits.to(DEVICE).expand(rows, vocab), temperature, uniform,
                                             splits=splits)
    assert torch.equal(tokens.cpu(), expected)
    torch.testing.assert_close(logprobs.cpu(), torch.full((rows,), -torch.log(torch.tensor(128.0)).item()), **TOL)


if ts.triton is not None:
    tl = ts.tl

    @ts.triton.jit
    def _uniforms_kernel(out_ptr, seed_lo, seed_hi, N: tl.constexpr):
        """The kernel's uniforms for rows 0..N-1, from the seed split as fused_sample splits a Python int."""
        rows = tl.arange(0, N).to(tl.int64)
        seed = (seed_hi.to(tl.int64) << 31) | seed_lo.to(tl.int64)
        tl.store(out_ptr + rows, ts._row_uniform(seed, rows))


def _row_uniforms(seed, rows):
    """The uniforms the kernel draws for rows 0..rows-1 (rows a power of two) under a Python int seed."""
    out = torch.empty(rows, dtype=torch.float64, device=DEVICE)
    _uniforms_kernel[(1,)](out, seed & ts._SEED_MASK, (seed >> 31) & ts._SEED_MASK, N=rows)
    return out.cpu()


@needs_kernels
def test_row_uniforms_are_uniform_fine_and_keyed_by_seed():
    u = _row_uniforms(42, 4096)
    assert bool(((u >= 0) & (u < 1)).all())
    assert kstest(u.numpy(), "uniform").pvalue > 1e-3
    assert (u * 2.0**24 != (u * 2.0**24).floor()).float().mean() > 0.99  # finer than a float32 2**-24 grid
    assert u.unique().numel() == u.numel()  # one draw per row
    for other in (43, 42 + (1 << 40)):  # the high bits of the seed count too
        assert (u != _row_uniforms(other, 4096)).float().mean() > 0.99


@needs_kernels
def test_seeded_draw_is_the_inverse_cdf_at_the_row_uniform():
    rows, vocab = 8, 3000
    logits = _logits(rows, vocab, 4, scale=0.5)
    temperature = torch.linspace(0.5, 1.5, rows).to(DEVICE)
    tokens, logprobs = _sample(logits, temperature, seed=1234)
    pinned, pinned_logprobs = _sample_given_uniform(logits, temperature, _row_uniforms(1234, rows))
    assert torch.equal(tokens, pinned) and torch.equal(logprobs, pinned_logprobs)


# ---------------------------------------------------------------------------------------------- properties

@needs_kernels
def test_seed_reproducible_and_distinct():
    logits = _logits(8, 500, 1, scale=0.5)  # flat: different uniforms give different tokens
    temperature = torch.ones(8, device=DEVICE)
    a, la = _sample(logits, temperature, seed=42)
    b, lb = _sample(logits, temperature, seed=42)
    assert torch.equal(a, b) and torch.equal(la, lb)
    c, _ = _sample(logits, temperature, seed=43)
    d, _ = _sample(logits, temperature, seed=42 + (1 << 40))  # the high bits count too
    assert not torch.equal(a, c) and not torch.equal(a, d)
    # a tensor seed (read by the kernel: CUDA-graph friendly) draws as the same Python int
    e, le = _sample(logits, temperature, seed=torch.tensor([42], device=DEVICE))
    assert torch.equal(a, e) and torch.equal(la, le)
    _sample(logits[:1], temperature[:1], seed=-5)  # any Python int is accepted (low 62 bits)


@needs_kernels
@pytest.mark.parametrize("vocab", [4097, 9001])
def test_splitting_a_row_never_changes_the_draw(vocab):
    logits = _logits(3, vocab, vocab)
    temperature = torch.tensor([1.0, 0.0, 0.6], device=DEVICE)
    one, lp_one = _sample(logits, temperature, seed=8, splits=1)
    for splits in (2, 3, 5):
        many, lp_many = _sample(logits, temperature, seed=8, splits=splits)
        # the chunks depend on V only, the uniform on (seed, row): the same partials, bit for bit
        assert torch.equal(one, many) and torch.equal(lp_one, lp_many)


@needs_kernels
@pytest.mark.parametrize("splits", [1, 2])
def test_masked_vocabulary_never_drawn(splits):
    rows, vocab = 12, 4500
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(rows, vocab, generator=g)
    logits[torch.rand(rows, vocab, generator=g) < 0.9] = float("-inf")
    logits[0] = float("-inf")
    logits[0, 4321] = 0.5  # one allowed token: always drawn, log-prob 0
    logits[1, :] = float("-inf")
    logits[1, 17] = -3.0  # one allowed token on a greedy row
    logits = logits.to(DEVICE)
    temperature = torch.full((rows,), 4.0, device=DEVICE)  # hot: masked tokens would show up if drawable
    temperature[1] = 0.0
    tokens, logprobs = _sample(logits, temperature, seed=6, splits=splits)
    assert bool(torch.isfinite(logits.gather(-1, tokens.unsqueeze(-1))).all())
    assert tokens[0] == 4321 and tokens[1] == 17
    assert bool(torch.isfinite(logprobs).all()) and abs(float(logprobs[0])) < 1e-6 and abs(float(logprobs[1])) < 1e-6
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, temperature, tokens), **TOL)


@needs_kernels
def test_half_input_equals_its_float32_cast():
    dtype = torch.bfloat16 if HAS_CUDA else torch.float16
    logits = _logits(4, 5000, 9, dtype=dtype)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.2], device=DEVICE)
    tokens, logprobs = _sample(logits, temperature, seed=21)
    ref_tokens, ref_logprobs = _sample(logits.float(), temperature, seed=21)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logprobs, ref_logprobs, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, temperature, tokens), **TOL)


@needs_kernels
def test_strided_row_view():
    wide = _logits(3, 4137, 4)
    view = wide[:, 11:4111]  # row stride 4137, offset start
    temperature = torch.tensor([1.0, 0.0, 0.5], device=DEVICE)
    tokens, logprobs = _sample(view, temperature, seed=77)
    ref_tokens, ref_logprobs = _sample(view.contiguous(), temperature, seed=77)
    assert torch.equal(tokens, ref_tokens) and torch.equal(logprobs, ref_logprobs)


@needs_kernels
def test_empty_batch():
    tokens, logprobs = ts.fused_sample(torch.zeros(0, 10, device=DEVICE), torch.zeros(0, device=DEVICE), 1)
    assert tokens.shape == logprobs.shape == (0,)


@needs_kernels
def test_bad_inputs_raise_clear_errors():
    logits = _logits(2, 10, 0)
    temp = torch.ones(2, device=DEVICE)
    cases = [
        ((logits[0], temp, 1), "2-D"),
        ((logits.long(), temp, 1), "dtype"),
        ((logits[:, ::2], temp, 1), "column stride"),
        ((logits[:, :0], temp, 1), "vocabulary"),
        ((logits, torch.ones(3, device=DEVICE), 1), "shape"),
        ((logits, temp.double(), 1), "float32"),
        ((logits, torch.ones(2, device="meta"), 1), "meta"),
        ((logits, temp, 1.5), "seed"),
        ((logits, temp, True), "seed"),
        ((logits, temp, torch.tensor([1], dtype=torch.int32, device=DEVICE)), "int64"),
        ((logits, temp, torch.tensor([1, 2], device=DEVICE)), "one int64 element"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            ts.fused_sample(*args)
    with pytest.raises(ValueError, match="splits"):
        ts.fused_sample(logits, temp, 1, splits=0)


def test_available_needs_cuda_and_triton():
    assert not ts.fused_sample_available("cpu")
    assert ts.fused_sample_available("cuda") == (ts.triton is not None)


# ---------------------------------------------------------------------------------------------- CUDA only

@needs_cuda
def test_qwen_vocabulary_batch_256_bf16():
    rows, vocab = 256, 151936
    logits = _logits(rows, vocab, 123, dtype=torch.bfloat16)
    temperature = torch.where(torch.arange(rows, device=DEVICE) % 2 == 0, 0.0, 0.9).float()
    tokens, logprobs = _sample(logits, temperature, seed=2024)
    greedy = temperature <= 0
    assert torch.equal(tokens[greedy], logits[greedy].argmax(dim=-1))
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, temperature, tokens), **TOL)
    ref_tokens, ref_logprobs = sample_tokens(logits, temperature, torch.ones(rows, device=DEVICE),
                                             torch.zeros(rows, dtype=torch.long, device=DEVICE),
                                             apply_filters=False)
    assert torch.equal(tokens[greedy], ref_tokens[greedy])
    torch.testing.assert_close(logprobs[greedy], ref_logprobs[greedy], **TOL)


@needs_cuda
@pytest.mark.parametrize("rows", [1, 8])
def test_small_batch_split_path_on_qwen_vocabulary(rows):
    logits = _logits(rows, 151936, rows, dtype=torch.bfloat16)
    temperature = torch.full((rows,), 1.0, device=DEVICE)
    temperature[0] = 0.0
    split_tokens, split_logprobs = _sample(logits, temperature, seed=31)  # default: several programs per row
    tokens, logprobs = _sample(logits, temperature, seed=31, splits=1)
    assert torch.equal(split_tokens, tokens) and torch.equal(split_logprobs, logprobs)
    assert split_tokens[0] == logits[0].argmax()
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, temperature, tokens), **TOL)


@needs_cuda
def test_row_offsets_past_int32():
    vocab = 1000
    stride = (1 << 31) + 64  # row 1 starts past 2**31 elements
    try:
        storage = torch.empty(stride + vocab, dtype=torch.bfloat16, device=DEVICE)
    except torch.OutOfMemoryError:
        pytest.skip("needs 4 GiB of device memory")
    logits = storage.as_strided((2, vocab), (stride, 1))
    logits.copy_(_logits(2, vocab, 3, dtype=torch.bfloat16))
    tokens, logprobs = _sample(logits, torch.zeros(2, device=DEVICE), seed=1)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    torch.testing.assert_close(logprobs, _ref_logprobs(logits, torch.zeros(2, device=DEVICE), tokens), **TOL)


@needs_cuda
@pytest.mark.parametrize("rows", [1, 256])
def test_cuda_graph_replay_with_tensor_seed(rows):
    logits = _logits(rows, 151936, 17, dtype=torch.bfloat16)
    temperature = torch.ones(rows, device=DEVICE)
    seed = torch.tensor([100], device=DEVICE)
    ts.fused_sample(logits, temperature, seed)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, logprobs = ts.fused_sample(logits, temperature, seed)
    draws = []
    for step in (5, 6, 5):
        seed.fill_(step)
        graph.replay()
        ref_tokens, ref_logprobs = ts.fused_sample(logits, temperature, step)
        assert torch.equal(tokens, ref_tokens) and torch.equal(logprobs, ref_logprobs)
        draws.append(tokens.clone())
    assert torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[1])
