"""The lm_head log-prob Function against autograd through log_softmax: values, entropies and the gradients of the
hidden states, the weight and the bias, for chunk sizes that do and do not divide the tokens; on a GPU, its compiled
reductions against the eager ones in bf16 at a Qwen-sized vocabulary."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tandemrl.train.head_logprobs import head_logprobs, logit_grads, logit_stats


def _reference(hidden, targets, weight, bias, scale):
    log_probs = (F.linear(hidden, weight, bias).float() * scale).log_softmax(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy.detach()


def _inputs(tokens=13, width=16, vocab=50, with_bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, width, generator=gen).mul(0.5).requires_grad_()
    bias = torch.randn(vocab, generator=gen).requires_grad_() if with_bias else None
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    upstream = torch.randn(tokens, generator=gen)  # the loss's gradient of each log-prob
    return hidden, targets, weight, bias, upstream


def _grads(leaves, output, upstream):
    (output * upstream).sum().backward()
    grads = [leaf.grad.clone() if leaf is not None and leaf.grad is not None else None for leaf in leaves]
    for leaf in leaves:
        if leaf is not None:
            leaf.grad = None
    return grads


@pytest.mark.parametrize("chunk_size", [1, 5, 13, 64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_log_probs_entropies_and_gradients_equal_autograd_through_log_softmax(chunk_size, with_bias):
    hidden, targets, weight, bias, upstream = _inputs(with_bias=with_bias)
    leaves = [hidden, weight, bias]
    expected, expected_entropy = _reference(hidden, targets, weight, bias, 1 / 0.7)
    expected_grads = _grads(leaves, expected, upstream)
    logprobs, entropy = head_logprobs(hidden, targets, weight, bias, 1 / 0.7, chunk_size)
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-5, rtol=1e-5)
    assert not entropy.requires_grad
    for got, want in zip(_grads(leaves, logprobs, upstream), expected_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert expected_grads[1].abs().max() > 0


def test_a_frozen_head_passes_gradients_to_the_hidden_states_alone():
    hidden, targets, weight, _, upstream = _inputs(with_bias=False)
    weight.requires_grad_(False)
    expected = _grads([hidden], _reference(hidden, targets, weight, None, 1.0)[0], upstream)
    logprobs, _ = head_logprobs(hidden, targets, weight, None, 1.0, 4)
    torch.testing.assert_close(_grads([hidden], logprobs, upstream)[0], expected[0], atol=1e-5, rtol=1e-5)
    assert weight.grad is None


def test_without_grad_the_log_probs_are_the_same_and_record_nothing():
    hidden, targets, weight, bias, _ = _inputs()
    with torch.no_grad():
        logprobs, _ = head_logprobs(hidden, targets, weight, bias, 1.0, 4)
    assert logprobs.grad_fn is None
    torch.testing.assert_close(logprobs, _reference(hidden, targets, weight, bias, 1.0)[0].detach())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the reductions compile on CUDA only")
def test_the_compiled_reductions_equal_the_eager_ones_on_a_gpu_in_bf16():
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(1000, 151936, device="cuda", generator=gen) * 4).to(torch.bfloat16)
    targets = torch.randint(0, 151936, (1000,), device="cuda", generator=gen)
    upstream = torch.randn(1000, device="cuda", generator=gen)
    compiled_stats = torch.compile(logit_stats, dynamic=True)(logits, targets, 0.7)
    eager_stats = logit_stats(logits, targets, 0.7)
    for got, want in zip(compiled_stats, eager_stats):
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
    lse = eager_stats[2]
    compiled = torch.compile(logit_grads, dynamic=True)(logits, targets, lse, upstream, 0.7)
    torch.testing.assert_close(compiled.float(), logit_grads(logits, targets, lse, upstream, 0.7).float(),
                               atol=1e-3, rtol=1e-2)
