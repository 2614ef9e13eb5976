"""Log-probs of the completion tokens without materialising full-vocabulary logits for the whole batch.

The decoder runs once; the lm_head + log-softmax run over chunks of tokens under activation checkpointing, so peak
memory holds one chunk of logits instead of batch x length x vocab (the dominant cost for 150k-token vocabularies).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tandemrl.models.lora import unwrap_causal_lm
from tandemrl.train.batch import TrainBatch


@dataclass
class TokenLogprobs:
    logprobs: Tensor  # [B, T] float32, differentiable when computed with grad
    entropy: Tensor  # [B, T] float32, detached (a metric only)


# The name of the forward method an FSDP2-sharded model carries (sharding.py): the decoder and the
# lm_head are reached inside it, so FSDP gathers the root's shards (embeddings, norm, lm_head) around the whole call.
FSDP_FORWARD = "tandemrl_completion_logprobs"


def completion_logprobs(model: nn.Module, batch: TrainBatch, temperature: float, chunk_size: int) -> TokenLogprobs:
    causal_lm = unwrap_causal_lm(model)
    sharded_forward = getattr(causal_lm, FSDP_FORWARD, None)
    if sharded_forward is not None:
        return sharded_forward(batch, temperature, chunk_size)
    return logprobs_of(causal_lm, batch, temperature, chunk_size)


def logprobs_of(causal_lm: nn.Module, batch: TrainBatch, temperature: float, chunk_size: int) -> TokenLogprobs:
    hidden = causal_lm.get_decoder()(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).last_hidden_state
    # The state at position i predicts token i+1: completion token j is predicted from column P-1+j.
    width = batch.completion_ids.shape[1]
    hidden = hidden[:, batch.prompt_width - 1 : batch.prompt_width - 1 + width]
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = batch.completion_ids.reshape(-1)
    head = causal_lm.get_output_embeddings()
    scale = 1.0 / temperature if temperature > 0 else 1.0
    logprob_chunks, entropy_chunks = [], []
    for start in range(0, flat_hidden.shape[0], chunk_size):
        h = flat_hidden[start : start + chunk_size]
        t = flat_targets[start : start + chunk_size]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, h, t, head.weight, head.bias, scale, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(h, t, head.weight, head.bias, scale)
        logprob_chunks.append(lp)
        entropy_chunks.append(ent)
    shape = batch.completion_ids.shape
    return TokenLogprobs(torch.cat(logprob_chunks).view(shape), torch.cat(entropy_chunks).view(shape))


def _chunk_logprobs(
    hidden: Tensor, targets: Tensor, weight: Tensor, bias: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    logits = nn.functional.linear(hidden, weight, bias).float() * scale
    log_probs = logits.log_softmax(-1)
    token_logprobs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return token_logprobs, entropy
