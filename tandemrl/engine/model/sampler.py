"""Batched token sampling with per-row parameters and no host synchronisation.

Order of the transforms (as in vLLM and Hugging Face): temperature, then top-k, then top-p over what
top-k kept. Sampling uses the exponential race: ``argmax_i p_i / E_i`` with ``E_i ~ Exp(1)`` draws ``i``
with probability ``p_i``; it needs no cumulative sums and takes an optional ``torch.Generator``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sample_tokens(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor,
                  generator: torch.Generator | None = None, *, apply_filters: bool = True) -> tuple[Tensor, Tensor]:
    """Sample one token per row.

    logits: [B, V] float. temperature, top_p: [B] float; top_k: [B] long, 0 disables top-k.
    Returns (tokens [B] long, logprobs [B] float32): each token's log-probability under the
    distribution it was actually drawn from (temperature-scaled, top-k/top-p renormalised). Rows with
    temperature 0 are greedy: the argmax of the raw logits, with ``log_softmax(logits)`` at it.

    ``apply_filters=False`` is a fast path for callers that know (on the host) that no row uses top-k or
    top-p: it skips the full-vocabulary sort. It never changes results when that is true.
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)
    scaled = logits / temp.unsqueeze(-1)  # greedy rows: exactly the raw logits (x / 1.0 == x)

    neg_log_noise = race_noise(scaled, generator)
    greedy_tok = logits.argmax(dim=-1, keepdim=True)

    if apply_filters:
        sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        sorted_logits = sorted_logits.masked_fill(ranks.unsqueeze(0) >= k.unsqueeze(-1), float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first one always stays).
        mass_above = probs.cumsum(dim=-1) - probs
        drop = mass_above >= top_p.to(probs.dtype).unsqueeze(-1)
        drop &= (top_p < 1).unsqueeze(-1)  # top_p == 1 keeps all: no rounding of the cumsum cuts the tail
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logp = sorted_logits.log_softmax(dim=-1)
        choice = (logp + neg_log_noise).argmax(dim=-1, keepdim=True)
        sampled = sorted_idx.gather(-1, choice).squeeze(-1)
        sampled_logp = logp.gather(-1, choice).squeeze(-1)
        # greedy rows report the raw distribution's log-prob: a reduction, not a second full log_softmax
        greedy_logp = logits.gather(-1, greedy_tok).squeeze(-1) - logits.logsumexp(dim=-1)
    else:
        # One full-vocabulary log_softmax serves the sampled rows and the greedy ones (whose scaled == logits).
        logp = scaled.log_softmax(dim=-1)
        choice = neg_log_noise.add_(logp).argmax(dim=-1, keepdim=True)
        sampled = choice.squeeze(-1)
        sampled_logp = logp.gather(-1, choice).squeeze(-1)
        greedy_logp = logp.gather(-1, greedy_tok).squeeze(-1)

    tokens = torch.where(greedy, greedy_tok.squeeze(-1), sampled)
    logprobs = torch.where(greedy, greedy_logp, sampled_logp)
    return tokens, logprobs


def race_noise(like: Tensor, generator: torch.Generator | None) -> Tensor:
    """-log E, E ~ Exp(1), shaped like ``like``: ``argmax(log w + noise)`` draws ``i`` with probability
    ``w_i / sum(w)`` (the exponential race: no normalisation or cumulative sum needed)."""
    noise = torch.empty_like(like).exponential_(1.0, generator=generator)
    return noise.clamp_min_(torch.finfo(noise.dtype).tiny).log_().neg_()


def sample_with_probs(logits: Tensor, temperature: Tensor,
                      generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Tokens [B] and the distributions [B, V] they were drawn from (float32; temperature only), for a draft model
    whose proposals are verified by rejection sampling. Greedy rows: the argmax, and a one-hot distribution."""
    logits = logits.float()
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)
    probs = (logits / temp.unsqueeze(-1)).softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    argmax = logits.argmax(dim=-1)
    tokens = torch.where(greedy, argmax, (probs / noise).argmax(dim=-1))  # p_i / E_i: the exponential race
    one_hot = torch.zeros_like(probs).scatter_(-1, argmax.unsqueeze(-1), 1.0)
    return tokens, torch.where(greedy.unsqueeze(-1), one_hot, probs)
