"""The speculative-decoding rejection sampler (tandemrl/engine/model/rejection.py).

The distribution tests compare against p computed independently in float64 and use a fixed seed, so each is
deterministic; the chi-square threshold (p-value > 1e-3) is the one the brief asks for.
"""

import numpy as np
import pytest
import torch
from tandemrl.engine.model.rejection import PAD_TOKEN, RejectionResult, rejection_sample

NEG_INF = float("-inf")
# Toy: V = 6, k = 3. The target's logits at each position are fixed (independent of the tokens before them), and
# the draft's distribution differs from the target's at every position.
TARGET_LOGITS = [
    [2.0, 1.0, 0.5, 0.0, -0.5, -1.0],
    [-1.0, 0.0, 1.5, 0.5, 0.0, 1.0],
    [0.3, 0.3, -0.2, 1.2, 0.8, -1.5],
    [1.0, -1.0, 0.0, 2.0, 0.5, 0.2],  # the bonus position
]
DRAFT_PROBS = [
    [0.05, 0.10, 0.15, 0.30, 0.25, 0.15],
    [0.30, 0.25, 0.05, 0.10, 0.20, 0.10],
    [0.10, 0.40, 0.10, 0.10, 0.10, 0.20],
]
N_ROWS = 40_000
MIN_P_VALUE = 1e-3


def target_p(logits, temperature):
    """softmax(logits / T) in float64, per position: [positions, V]."""
    x = np.asarray(logits, dtype=np.float64) / temperature
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def assert_distributed_as(tokens, p, label):
    """Chi-square goodness of fit of the 1-D integer tensor `tokens` against p (zero-probability tokens must
    never appear). scipy is imported here so that the CUDA test needs none."""
    chisquare = pytest.importorskip("scipy.stats").chisquare
    counts = np.bincount(tokens.numpy(), minlength=len(p))
    assert len(counts) == len(p), (label, counts)
    support = p > 0
    assert counts[~support].sum() == 0, (label, counts)
    expected = p[support] / p[support].sum() * counts.sum()
    result = chisquare(counts[support], expected)
    assert result.pvalue > MIN_P_VALUE, (label, result, counts, expected.round(1))


def toy_batch(n_rows, temperature, draft_probs, seed):
    """The toy as batched inputs, with the draft tokens drawn from q by a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.tensor(draft_probs, dtype=torch.float32)
    k = q.shape[0]
    tokens = torch.stack([torch.multinomial(q[i], n_rows, replacement=True, generator=gen) for i in range(k)], 1)
    return dict(
        target_logits=torch.tensor(TARGET_LOGITS, dtype=torch.float32).expand(n_rows, -1, -1).contiguous(),
        draft_probs=q.expand(n_rows, -1, -1).contiguous(),
        draft_tokens=tokens,
        num_draft=torch.full((n_rows,), k, dtype=torch.long),
        temperature=torch.full((n_rows,), temperature, dtype=torch.float32),
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_outputs_follow_the_target_distribution(temperature):
    batch = toy_batch(N_ROWS, temperature, DRAFT_PROBS, seed=11)
    out = rejection_sample(**batch, generator=torch.Generator().manual_seed(12))
    p = target_p(TARGET_LOGITS, temperature)
    q = np.asarray(DRAFT_PROBS, dtype=np.float64)

    # (a) the first emitted token (an accepted draft or the residual sample) is distributed as p at position 0
    assert_distributed_as(out.tokens[:, 0], p[0], "first token")
    # (b) given that the first draft was accepted, the second emitted token is distributed as p at position 1
    first_accepted = out.num_accepted >= 1
    assert_distributed_as(out.tokens[first_accepted, 1], p[1], "second token | first accepted")
    # and the first draft is accepted with probability sum_x min(p, q) = 1 - TV(p, q): a 4-sigma binomial bound
    rate = np.minimum(p[0], q[0]).sum()
    sigma = np.sqrt(rate * (1 - rate) / N_ROWS)
    assert abs(first_accepted.double().mean().item() - rate) < 4 * sigma


def test_draft_equal_to_target_accepts_everything_and_bonus_follows_p():
    temperature = 0.9
    logits = torch.tensor(TARGET_LOGITS, dtype=torch.float32)
    # q exactly as the sampler computes p (float32 log_softmax), so min(1, p/q) is exactly 1, not 1 - an ulp
    q = torch.log_softmax(logits[:3] / temperature, dim=-1).exp()
    batch = toy_batch(N_ROWS, temperature, q.tolist(), seed=21)
    batch["draft_probs"] = q.expand(N_ROWS, -1, -1).contiguous()
    out = rejection_sample(**batch, generator=torch.Generator().manual_seed(22))
    assert torch.equal(out.num_accepted, torch.full((N_ROWS,), 3))
    assert torch.equal(out.tokens[:, :3], batch["draft_tokens"])
    assert_distributed_as(out.tokens[:, 3], target_p(TARGET_LOGITS, temperature)[3], "bonus token")


def test_always_wrong_draft_is_rejected_and_the_residual_is_p():
    # the target gives token 5 no mass at any position; the draft puts all its mass there
    logits = torch.tensor(TARGET_LOGITS, dtype=torch.float32)
    logits[:, 5] = NEG_INF
    q = torch.zeros(3, 6)
    q[:, 5] = 1.0
    out = rejection_sample(
        target_logits=logits.expand(N_ROWS, -1, -1).contiguous(),
        draft_probs=q.expand(N_ROWS, -1, -1).contiguous(),
        draft_tokens=torch.full((N_ROWS, 3), 5),
        num_draft=torch.full((N_ROWS,), 3),
        temperature=torch.ones(N_ROWS),
        generator=torch.Generator().manual_seed(31),
    )
    assert torch.equal(out.num_accepted, torch.zeros(N_ROWS, dtype=torch.long))
    assert_distributed_as(out.tokens[:, 0], target_p(logits.tolist(), 1.0)[0], "residual after rejection")
    assert bool((out.tokens[:, 1:] == PAD_TOKEN).all())


def greedy_batch(batch_size=8, k=4, vocab=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch_size, k + 1, vocab, generator=gen)
    argmax = logits.argmax(-1)
    return logits, argmax, gen


def test_greedy_rows_reproduce_plain_greedy_decoding():
    batch_size, k, vocab = 8, 4, 50
    logits, argmax, gen = greedy_batch(batch_size, k, vocab)
    # the draft's probabilities are irrelevant to greedy rows: give them random ones
    draft_probs = torch.rand(batch_size, k, vocab, generator=gen).softmax(-1)
    common = dict(target_logits=logits, draft_probs=draft_probs, num_draft=torch.full((batch_size,), k),
                  temperature=torch.zeros(batch_size))

    out = rejection_sample(draft_tokens=argmax[:, :k].clone(), **common)
    assert torch.equal(out.num_accepted, torch.full((batch_size,), k))
    assert torch.equal(out.tokens, argmax)  # the k drafts, then the argmax at position k

    # row b drafts a wrong token at position j = b % (k+1) (j == k: no wrong draft)
    wrong_at = torch.arange(batch_size) % (k + 1)
    drafts = argmax[:, :k].clone()
    rows = torch.nonzero(wrong_at < k).squeeze(-1)
    drafts[rows, wrong_at[rows]] = (argmax[rows, wrong_at[rows]] + 1) % vocab
    out = rejection_sample(draft_tokens=drafts, **common)
    assert torch.equal(out.num_accepted, wrong_at)
    for b in range(batch_size):
        j = int(wrong_at[b])
        assert out.tokens[b, : j + 1].tolist() == argmax[b, : j + 1].tolist()  # greedy decoding's own tokens
        assert bool((out.tokens[b, j + 1:] == PAD_TOKEN).all())
    # the greedy-only path (no draws, draft_probs never read) gives the same result
    fast = rejection_sample(draft_tokens=drafts, greedy_only=True,
                            **{**common, "draft_probs": torch.zeros(()).expand(batch_size, k, vocab)})
    for name in ("tokens", "logprobs", "num_accepted"):
        assert torch.equal(getattr(fast, name), getattr(out, name)), name


def test_short_drafts_and_mixed_greedy_and_sampled_rows():
    k, rows_per_case = 4, 500
    vocab = 2 * (k + 1)
    # position i's target puts all its mass on tokens {2i, 2i+1}: the token a row emits tells which position
    # it came from
    logits = torch.full((k + 1, vocab), NEG_INF)
    for i in range(k + 1):
        logits[i, 2 * i], logits[i, 2 * i + 1] = 0.3, -0.2
    argmax = torch.arange(k + 1) * 2
    n_values = torch.arange(k + 1).repeat_interleave(rows_per_case)  # each n in 0..k
    batch_size = len(n_values)
    greedy = torch.arange(batch_size) % 2 == 0
    gen = torch.Generator().manual_seed(41)
    # sampled rows draft from q uniform over the vocabulary; greedy rows draft the target's argmax
    q = torch.full((batch_size, k, vocab), 1.0 / vocab)
    drafts = torch.randint(0, vocab, (batch_size, k), generator=gen)
    drafts[greedy] = argmax[:k]
    past_n = torch.arange(k)[None, :] >= n_values[:, None]
    drafts[past_n] = -1  # padding past each row's own n must be ignored
    q[past_n] = float("nan")
    out = rejection_sample(
        target_logits=logits.expand(batch_size, -1, -1).contiguous(),
        draft_probs=q,
        draft_tokens=drafts,
        num_draft=n_values,
        temperature=torch.where(greedy, 0.0, 1.0),
        generator=gen,
    )
    a = out.num_accepted
    assert bool((a <= n_values).all()) and bool((a >= 0).all())
    assert torch.equal(a[greedy], n_values[greedy])  # greedy rows draft the argmax: all accepted
    assert bool((a[~greedy] < n_values[~greedy]).any())  # some sampled drafts were rejected
    assert bool((a[~greedy] == n_values[~greedy]).any())  # ... and some rows kept all of theirs
    rows = torch.arange(batch_size)
    last = out.tokens[rows, a]
    assert bool((last // 2 == a).all())  # the last token comes from position a (the bonus: position n)
    assert torch.equal(last[greedy], argmax[a[greedy]])
    col = torch.arange(k + 1)[None, :]
    assert torch.equal(out.tokens[col < a[:, None]], drafts[col[:, :k] < a[:, None]])
    assert bool((out.tokens[col > a[:, None]] == PAD_TOKEN).all())
    assert bool((out.logprobs[col > a[:, None]] == 0).all())


def test_logprobs_are_the_targets_sampling_distribution_at_the_emitted_tokens():
    batch_size, k, vocab = 300, 3, 40
    gen = torch.Generator().manual_seed(51)
    logits = torch.randn(batch_size, k + 1, vocab, generator=gen) * 2
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3]).repeat(batch_size // 4)
    # a draft close to the target (so rows accept a few) but not equal to it
    q = (logits[:, :k] / 1.1 + 0.5 * torch.randn(batch_size, k, vocab, generator=gen)).softmax(-1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch_size, k)
    out = rejection_sample(logits, q, drafts, torch.full((batch_size,), k), temperature, generator=gen)
    assert out.logprobs.dtype == torch.float32 and out.tokens.dtype == torch.long
    assert bool((out.num_accepted > 0).any())

    temp = torch.where(temperature > 0, temperature, 1.0)  # greedy rows: raw log_softmax
    ref = torch.log_softmax(logits.double() / temp.double()[:, None, None], -1)
    emitted = torch.arange(k + 1)[None, :] <= out.num_accepted[:, None]
    ref_at = ref.gather(-1, out.tokens.clamp_min(0)[..., None]).squeeze(-1)
    assert torch.allclose(out.logprobs[emitted].double(), ref_at[emitted], atol=1e-5)
    assert bool((out.logprobs[~emitted] == 0).all())
    assert bool(torch.isfinite(out.logprobs).all())


def test_generator_reproduces_a_step():
    batch = toy_batch(512, 1.0, DRAFT_PROBS, seed=61)
    a = rejection_sample(**batch, generator=torch.Generator().manual_seed(5))
    b = rejection_sample(**batch, generator=torch.Generator().manual_seed(5))
    c = rejection_sample(**batch, generator=torch.Generator().manual_seed(6))
    assert isinstance(a, RejectionResult)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)
    assert not torch.equal(a.tokens, c.tokens)


def test_bfloat16_logits_are_accepted():
    logits, argmax, _ = greedy_batch(4, 2, 16)
    out = rejection_sample(logits.bfloat16(), torch.full((4, 2, 16), 1 / 16).bfloat16(), argmax[:, :2].clone(),
                           torch.full((4,), 2), torch.zeros(4))
    assert torch.equal(out.tokens, logits.bfloat16().argmax(-1))
    assert out.logprobs.dtype == torch.float32


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError):
        rejection_sample(torch.zeros(2, 3, 5), torch.zeros(2, 3, 5), torch.zeros(2, 2, dtype=torch.long),
                         torch.zeros(2, dtype=torch.long), torch.zeros(2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rejection_sampling_does_not_sync_with_the_host():
    dev = torch.device("cuda")
    batch = {name: t.to(dev) for name, t in toy_batch(256, 1.0, DRAFT_PROBS, seed=71).items()}
    batch["temperature"][::3] = 0.0  # mixed greedy and sampled rows
    batch["num_draft"][::5] = 1  # and a short draft
    gen = torch.Generator(device=dev).manual_seed(0)
    rejection_sample(**batch, generator=gen)  # warm up (first-call allocations may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = rejection_sample(**batch, generator=gen)
        out.num_emitted
        rejection_sample(**{**batch, "target_logits": batch["target_logits"].bfloat16()}, generator=gen)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert bool((out.num_accepted <= batch["num_draft"]).all())
