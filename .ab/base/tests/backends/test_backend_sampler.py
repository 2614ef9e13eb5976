import math

import numpy as np
import pytest
import torch

from tandemrl.backends.sampler import sample_tokens

LOGITS = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0]
N = 20_000
# (temperature, top_k, top_p)
CASES = [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.7), (0.8, 5, 0.9),
         (1.0, 100, 1.0), (1.0, 0, 1e-6)]


def analytic(temperature, top_k, top_p):
    """The distribution the sampler must draw from, computed independently in float64."""
    x = np.asarray(LOGITS, dtype=np.float64) / temperature
    order = np.argsort(-x, kind="stable")
    keep = np.ones(len(x), dtype=bool)
    if top_k > 0:
        keep[order[top_k:]] = False
    p = np.where(keep, np.exp(x - x.max()), 0.0)
    p /= p.sum()
    mass_above = 0.0
    for i in order:
        if mass_above >= top_p and top_p < 1:
            keep[i] = False
        mass_above += p[i]
    p = np.where(keep, p, 0.0)
    return p / p.sum()


def chi2_critical(df, z=3.0902):  # upper 0.1 % point; scipy if present, else Wilson-Hilferty
    try:
        from scipy.stats import chi2
        return float(chi2.ppf(0.999, df))
    except ImportError:
        return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def rows(cases, n):
    t = torch.tensor([c[0] for c in cases for _ in range(n)], dtype=torch.float32)
    k = torch.tensor([c[1] for c in cases for _ in range(n)], dtype=torch.long)
    p = torch.tensor([c[2] for c in cases for _ in range(n)], dtype=torch.float32)
    logits = torch.tensor(LOGITS).expand(len(t), -1).contiguous()
    return logits, t, p, k


def check_case(tokens, logprobs, case):
    expected = analytic(*case)
    counts = np.bincount(tokens.numpy(), minlength=len(LOGITS))
    support = expected > 0
    assert counts[~support].sum() == 0, (case, counts)
    assert np.allclose(logprobs.numpy(), np.log(expected[tokens.numpy()]), atol=1e-5)
    if support.sum() == 1:
        assert counts[support].sum() == len(tokens)
        return
    exp_counts = expected[support] * len(tokens)
    stat = float(((counts[support] - exp_counts) ** 2 / exp_counts).sum())
    assert stat < chi2_critical(int(support.sum()) - 1), (case, stat, counts, exp_counts)


def test_distributions_match_temperature_top_k_top_p_per_row():
    logits, t, p, k = rows(CASES, N)
    gen = torch.Generator().manual_seed(1234)
    tokens, logprobs = sample_tokens(logits, t, p, k, gen)
    assert tokens.dtype == torch.long and tokens.shape == (len(t),)
    for i, case in enumerate(CASES):
        sl = slice(i * N, (i + 1) * N)
        check_case(tokens[sl], logprobs[sl], case)


def test_fast_path_without_filters_matches_distribution():
    cases = [(1.0, 0, 1.0), (0.5, 0, 1.0)]
    logits, t, p, k = rows(cases, N)
    tokens, logprobs = sample_tokens(logits, t, p, k, torch.Generator().manual_seed(7), apply_filters=False)
    for i, case in enumerate(cases):
        check_case(tokens[i * N:(i + 1) * N], logprobs[i * N:(i + 1) * N], case)


def test_greedy_rows_take_argmax_with_raw_logprob():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.0, 1.0, 0.0, 0.7, 0.0, 0.0])
    p = torch.tensor([0.5, 1.0, 1.0, 0.9, 1.0, 0.1])
    k = torch.tensor([3, 0, 0, 5, 1, 0])
    tokens, logprobs = sample_tokens(logits, t, p, k, torch.Generator().manual_seed(1))
    greedy = t == 0
    assert torch.equal(tokens[greedy], logits[greedy].argmax(-1))
    ref = logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logprobs[greedy], ref[greedy])


def test_generator_makes_sampling_reproducible():
    logits, t, p, k = rows([(1.0, 0, 0.9)], 256)
    a = sample_tokens(logits, t, p, k, torch.Generator().manual_seed(3))
    b = sample_tokens(logits, t, p, k, torch.Generator().manual_seed(3))
    c = sample_tokens(logits, t, p, k, torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_bfloat16_logits_are_accepted():
    logits = torch.randn(4, 32).bfloat16()
    tokens, logprobs = sample_tokens(logits, torch.ones(4), torch.ones(4), torch.zeros(4, dtype=torch.long))
    assert logprobs.dtype == torch.float32 and bool((logprobs <= 0).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sampling_does_not_sync_with_the_host():
    dev = torch.device("cuda")
    logits, t, p, k = (x.to(dev) for x in rows(CASES, 64))
    gen = torch.Generator(device=dev).manual_seed(0)
    sample_tokens(logits, t, p, k, gen)  # warm up (first-call allocations may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sample_tokens(logits, t, p, k, gen)
        sample_tokens(logits, t, p, k, gen, apply_filters=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
