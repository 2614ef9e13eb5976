"""The speculative-decoding rejection sampler: batched, on the device, with no host synchronisation.

The target scores a row's ``k`` proposals (and the position after them) in one forward; this decides how many to
keep and which token follows them by the standard rule (Leviathan et al. 2023; Chen et al. 2023), so a row's tokens
are distributed exactly as if the target had sampled them one by one:

* proposal ``x`` at position ``i`` is accepted with probability ``min(1, p(x) / q(x))`` (``p``: the target's sampling
  distribution, ``q``: the draft's, both at ``i``);
* at the first rejection the row emits one token drawn from the residual ``norm(max(0, p - q))`` and stops;
* when every proposal is accepted the row emits a bonus token drawn from ``p`` at the position after them.

Greedy rows (temperature 0) accept while the proposal is the target's argmax, then emit the argmax: plain greedy
decoding token for token. Everything is tensor arithmetic over the batch (no ``.item()``, no branching on values);
the random draws come from the optional generator in a fixed order (``B * k`` uniforms, then ``B * V``
exponentials), so a seeded generator reproduces a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tandemrl.engine.model.sampler import race_noise

PAD_TOKEN = -1
"""``RejectionResult.tokens`` past a row's last emitted token (its log-prob there is 0.0)."""


@dataclass(frozen=True)
class RejectionResult:
    """Per row ``b``: ``tokens[b, :num_accepted[b] + 1]`` [B, k+1] are its accepted drafts, then the target's token
    (``PAD_TOKEN`` after); ``logprobs`` [B, k+1] float32, each token's log-prob under the target's sampling
    distribution at its position (``log_softmax(logits / T)``, raw for greedy rows; 0.0 at padding)."""

    tokens: Tensor
    logprobs: Tensor
    num_accepted: Tensor

    @property
    def num_emitted(self) -> Tensor:
        """[B] long: tokens each row emits this step (``num_accepted + 1``)."""
        return self.num_accepted + 1


def rejection_sample(target_logits: Tensor, draft_probs: Tensor, draft_tokens: Tensor, num_draft: Tensor,
                     temperature: Tensor, generator: torch.Generator | None = None,
                     greedy_only: bool = False) -> RejectionResult:
    """Verify each row's drafted tokens against the target (module docstring).

    target_logits [B, k+1, V] (any float dtype; float32 arithmetic); draft_probs [B, k, V], what each draft token was
    drawn from, read only by sampled rows at positions ``< num_draft[b]`` (the rest may be anything, even NaN);
    draft_tokens [B, k] long (ignored from ``num_draft[b]`` on); num_draft [B] long, clamped to ``[0, k]``;
    temperature [B], ``<= 0``: greedy. ``greedy_only``: every row is greedy (known on the host): the same result
    without random draws, residual or ``draft_probs`` (then anything of its shape, e.g. an expanded zero).

    Temperature only: the residual of a top-k / top-p truncated ``p`` would need both distributions truncated alike.
    The test is ``u * q(x) < p(x)`` (no division): ``q(x) == 0`` (rounding, or a draft outside what it reports)
    accepts iff ``p(x) > 0``. A residual with no mass (``p == q`` up to rounding) draws from ``p``. Memory: one
    float32 [B, k+1, V] temporary and a few [B, V] ones.
    """
    batch, positions, vocab = _check_shapes(target_logits, draft_probs, draft_tokens, num_draft, temperature)
    k = positions - 1
    device = target_logits.device
    greedy = temperature <= 0
    n = num_draft.clamp(0, k)

    # logp: [B, k+1, V] the target's sampling distribution; greedy rows divide by 1, i.e. raw log_softmax.
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    logp = torch.log_softmax(target_logits.float() / temp[:, None, None], dim=-1)
    # greedy argmax on the raw logits, as plain greedy decoding takes it (subtracting the logsumexp could merge
    # two nearly equal logits and change which is first)
    target_argmax = target_logits.argmax(dim=-1)  # [B, k+1]

    drafted = torch.arange(k, device=device)[None, :] < n[:, None]  # [B, k]
    x = torch.where(drafted, draft_tokens, torch.zeros_like(draft_tokens))  # gather-safe ids
    draft_logp = logp[:, :k].gather(-1, x[..., None]).squeeze(-1)  # [B, k] log p(x_i)
    if greedy_only:
        accept = (x == target_argmax[:, :k]) & drafted
    else:
        accept = _accept_mask(draft_logp, draft_probs, x, target_argmax[:, :k], greedy, generator) & drafted
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [B] length of the accepted prefix

    if greedy_only:
        last_token = target_argmax.gather(1, num_accepted[:, None])
        last_logp = logp.gather(1, num_accepted[:, None, None].expand(batch, 1, vocab)).squeeze(1)
        last_token, last_logp = last_token.squeeze(1), last_logp.gather(-1, last_token).squeeze(-1)
    else:
        last_token, last_logp = _final_token(logp, draft_probs, target_argmax, num_accepted, num_accepted < n, greedy,
                                             generator)
    tokens, logprobs = _assemble(x, draft_logp, last_token, last_logp, num_accepted)
    return RejectionResult(tokens=tokens, logprobs=logprobs, num_accepted=num_accepted)


def _check_shapes(target_logits: Tensor, draft_probs: Tensor, draft_tokens: Tensor, num_draft: Tensor,
                  temperature: Tensor) -> tuple[int, int, int]:
    """Shape checks only (host-side metadata, no sync); returns (B, k+1, V)."""
    if target_logits.dim() != 3 or target_logits.shape[1] < 2:
        raise ValueError(f"target_logits must be [B, k+1, V] with k >= 1, got {tuple(target_logits.shape)}")
    batch, positions, vocab = target_logits.shape
    for name, tensor, shape in (("draft_probs", draft_probs, (batch, positions - 1, vocab)),
                                ("draft_tokens", draft_tokens, (batch, positions - 1)),
                                ("num_draft", num_draft, (batch,)), ("temperature", temperature, (batch,))):
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    return batch, positions, vocab


def _accept_mask(draft_logp: Tensor, draft_probs: Tensor, x: Tensor, target_argmax: Tensor, greedy: Tensor,
                 generator: torch.Generator | None) -> Tensor:
    """[B, k] bool: whether each drafted token passes its own test, before the "stop at the first rejection"
    prefix is taken. Sampled rows: ``u * q(x) < p(x)``, ``u ~ U[0, 1)``, i.e. probability ``min(1, p/q)``
    without a division (q(x) == 0 accepts iff p(x) > 0). Greedy rows: ``x == argmax``."""
    q_x = draft_probs.gather(-1, x[..., None]).squeeze(-1).float()  # [B, k]
    u = torch.rand(x.shape, device=x.device, dtype=torch.float32, generator=generator)
    sampled_ok = u * q_x < draft_logp.exp()
    return torch.where(greedy[:, None], x == target_argmax, sampled_ok)


def _final_token(logp: Tensor, draft_probs: Tensor, target_argmax: Tensor, num_accepted: Tensor, rejected: Tensor,
                 greedy: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """The one token the target adds after the accepted prefix, at position ``a = num_accepted``, and its
    log-prob under ``p``: from ``norm(max(0, p - q))`` where the draft at ``a`` was rejected, from ``p`` where
    every draft was accepted (bonus) or the residual is empty, the argmax for greedy rows. Returns ([B], [B])."""
    batch, positions, vocab = logp.shape
    a = num_accepted
    logp_a = logp.gather(1, a[:, None, None].expand(batch, 1, vocab)).squeeze(1)  # [B, V]
    # q at a; a == k (all accepted) reads position k-1, which only matters where `rejected`, i.e. never there
    a_q = a.clamp(max=positions - 2)
    q_a = draft_probs.gather(1, a_q[:, None, None].expand(batch, 1, vocab)).squeeze(1).float()  # [B, V]

    residual = (logp_a.exp() - q_a).clamp_min_(0.0)  # NaN q (unread garbage) only reaches rows not `rejected`
    use_residual = rejected & ~greedy & (residual.sum(dim=-1) > 0)
    # log of the (unnormalised) weights to sample from: the race below does not need them normalised
    log_weights = torch.where(use_residual[:, None], residual.log(), logp_a)
    sampled = (log_weights + race_noise(log_weights, generator)).argmax(dim=-1)

    greedy_token = target_argmax.gather(1, a[:, None]).squeeze(1)
    token = torch.where(greedy, greedy_token, sampled)
    token_logp = logp_a.gather(-1, token[:, None]).squeeze(-1)
    return token, token_logp


def _assemble(x: Tensor, draft_logp: Tensor, last_token: Tensor, last_logp: Tensor,
              num_accepted: Tensor) -> tuple[Tensor, Tensor]:
    """Rows of ``[accepted drafts..., last token, PAD...]``: tokens [B, k+1] long and logprobs [B, k+1]
    float32 (0.0 at padding)."""
    batch, k = x.shape
    col = torch.arange(k + 1, device=x.device)[None, :]
    a = num_accepted[:, None]
    drafts = torch.cat([x, x.new_full((batch, 1), PAD_TOKEN)], dim=1)
    drafts_logp = torch.cat([draft_logp, draft_logp.new_zeros((batch, 1))], dim=1)
    tokens = torch.where(col < a, drafts, torch.where(col == a, last_token[:, None], PAD_TOKEN))
    logprobs = torch.where(col < a, drafts_logp, torch.where(col == a, last_logp[:, None], 0.0))
    return tokens, logprobs.float()
