"""The lm_head's log-probs of target tokens, chunk by chunk, without float32 logits kept or recomputed by autograd.

Autograd through ``log_softmax(linear(h).float())`` keeps float32 copies of each chunk's logits (under activation
checkpointing: computes them twice) and its backward runs half a dozen passes over [tokens x vocab]: at a 150k-token
vocabulary that traffic costs more than the lm_head's GEMMs. This Function keeps only the hidden states and each
token's log-sum-exp. Its forward reduces each chunk's logits (one GEMM, in the model's dtype) to the target's
log-prob, the log-sum-exp and the entropy; its backward recomputes the chunk's logits, turns them into their
gradient ((onehot(target) - softmax) x grad x scale, in the logits' dtype) and runs the two GEMMs. Under
``model.compile`` on CUDA the two reductions run compiled (inductor fuses each into a kernel that reads the logits
and writes only what it returns); elsewhere they run as written, which the tests compare with autograd through
log_softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._triton import has_triton


def logit_stats(logits: Tensor, targets: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """[n, V] logits, [n] targets -> float32 [n] log-probs of the targets, entropies, log-sum-exps (of logits x
    scale)."""
    scaled = logits.float() * scale
    lse = scaled.logsumexp(-1)
    probs = (scaled - lse.unsqueeze(-1)).exp()
    entropy = lse - (probs * scaled).sum(-1)
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, entropy, lse


def logit_grads(logits: Tensor, targets: Tensor, lse: Tensor, grad: Tensor, scale: float) -> Tensor:
    """The gradient of ``grad``-weighted target log-probs with respect to the [n, V] logits, in their dtype."""
    scaled = logits.float() * scale
    probs = (scaled - lse.unsqueeze(-1)).exp()
    is_target = torch.arange(logits.shape[-1], device=logits.device) == targets.unsqueeze(-1)
    return ((is_target.float() - probs) * (grad * scale).unsqueeze(-1)).to(logits.dtype)


# Compiled lazily (on the first CUDA call), once per process; dynamic: a micro-batch's last chunk is shorter.
_COMPILED_STATS = torch.compile(logit_stats, dynamic=True)
_COMPILED_GRADS = torch.compile(logit_grads, dynamic=True)


def head_logprobs(hidden: Tensor, targets: Tensor, weight: Tensor, bias: Tensor | None, scale: float,
                  chunk_size: int, compiled: bool = False) -> tuple[Tensor, Tensor]:
    """float32 [n] log-probs of ``targets`` under ``linear(hidden, weight, bias) x scale`` (differentiable in
    ``hidden``, ``weight`` and ``bias``) and their entropies (not differentiable), ``chunk_size`` tokens at a time;
    ``compiled``: the reductions compiled where they can be (CUDA with Triton)."""
    compiles = compiled and hidden.is_cuda and has_triton()
    return _HeadLogprobs.apply(hidden, targets, weight, bias, scale, chunk_size, compiles)


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, targets: Tensor, weight: Tensor, bias: Tensor | None, scale: float,
                chunk_size: int, compiles: bool) -> tuple[Tensor, Tensor]:
        stats = _COMPILED_STATS if compiles else logit_stats
        logprobs, entropy, lse = (torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
                                  for _ in range(3))
        for rows in _chunks(hidden.shape[0], chunk_size):
            logprobs[rows], entropy[rows], lse[rows] = stats(F.linear(hidden[rows], weight, bias), targets[rows],
                                                             scale)
        ctx.save_for_backward(hidden, targets, weight, bias, lse)
        ctx.scale, ctx.chunk_size, ctx.compiles = scale, chunk_size, compiles
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs: Tensor, _grad_entropy: Tensor | None):
        hidden, targets, weight, bias, lse = ctx.saved_tensors
        wants_hidden, _, wants_weight, wants_bias = ctx.needs_input_grad[:4]
        grads = _COMPILED_GRADS if ctx.compiles else logit_grads
        grad_hidden = torch.empty_like(hidden) if wants_hidden else None
        grad_weight = torch.zeros_like(weight) if wants_weight else None
        grad_bias = torch.zeros_like(bias) if wants_bias else None
        for rows in _chunks(hidden.shape[0], ctx.chunk_size):
            grad_logits = grads(F.linear(hidden[rows], weight, bias), targets[rows], lse[rows], grad_logprobs[rows],
                                ctx.scale)
            if grad_hidden is not None:
                torch.mm(grad_logits, weight, out=grad_hidden[rows])
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), hidden[rows])
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
        return grad_hidden, None, grad_weight, grad_bias, None, None, None


def _chunks(count: int, chunk_size: int) -> list[slice]:
    return [slice(start, start + chunk_size) for start in range(0, count, chunk_size)]
