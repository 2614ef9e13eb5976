"""Log-probs of the completion tokens: one packed forward per micro-batch, the lm_head only where a token is scored.

The decoder runs on the micro-batch's rows packed into one sequence (train/packing.py; padded rows for models whose
attention cannot take packed input, train/packed_support.py). The lm_head + log-softmax then run over chunks of the
completion tokens alone (train/head_logprobs.py), so peak memory holds one chunk of logits instead of tokens x vocab
(the dominant cost for 150k-token vocabularies), and no prompt or padding position is projected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tandemrl.models.compile import has_compiled_layers
from tandemrl.models.lora import unwrap_causal_lm
from tandemrl.config import TrainConfig
from tandemrl.train.batch import TrainBatch
from tandemrl.train.head_logprobs import head_logprobs
from tandemrl.train.micro_batches import micro_batch_limits, micro_batches
from tandemrl.train.packed_support import packed_is_cheaper, takes_offsets
from tandemrl.train.packing import pack, padded_sources


@dataclass
class TokenLogprobs:
    logprobs: Tensor  # [B, T] float32, differentiable when computed with grad; 0 on padding
    entropy: Tensor  # [B, T] float32, detached (a metric only); 0 on padding


# The name of the forward method an FSDP2-sharded model carries (sharding.py): the decoder and the
# lm_head are reached inside it, so FSDP gathers the root's shards (embeddings, norm, lm_head) around the whole call.
FSDP_FORWARD = "tandemrl_completion_logprobs"


def completion_logprobs(model: nn.Module, batch: TrainBatch, temperature: float, chunk_size: int) -> TokenLogprobs:
    """One forward over all of ``batch``'s rows (a micro-batch)."""
    causal_lm = unwrap_causal_lm(model)
    sharded_forward = getattr(causal_lm, FSDP_FORWARD, None)
    if sharded_forward is not None:
        return sharded_forward(batch, temperature, chunk_size)
    return logprobs_of(causal_lm, batch, temperature, chunk_size)


def batch_logprobs(
    model: nn.Module, batch: TrainBatch, temperature: float, cfg: TrainConfig,
    any_rank: Callable[[bool], bool] | None = None,
) -> Tensor:
    """[B, T] log-probs of a whole batch without grad (old and reference policies), micro-batch by micro-batch as
    the update groups them; ``any_rank`` as in policy_update."""
    out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)
    with torch.no_grad():
        for micro in micro_batches(batch, micro_batch_limits(cfg, model), any_rank):
            logprobs = completion_logprobs(model, micro.batch, temperature, cfg.logprob_chunk_size).logprobs
            if not micro.is_filler:  # a micro-batch keeps the first completion columns (micro_batches.py)
                out[micro.rows, : logprobs.shape[1]] = logprobs
    return out


def logprobs_of(causal_lm: nn.Module, batch: TrainBatch, temperature: float, chunk_size: int) -> TokenLogprobs:
    decoder = causal_lm.get_decoder()
    if packed_is_cheaper(causal_lm, batch):
        packed = pack(batch)
        offsets = packed.offsets() if takes_offsets(causal_lm) else {}
        hidden = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False, **offsets)
        source, targets, completion = packed.source, packed.targets, packed.completion
    else:
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=batch.position_ids, use_cache=False)
        sources = padded_sources(batch)
        source, targets, completion = sources["source"], sources["targets"], sources["completion"]
    states = hidden.last_hidden_state.reshape(-1, hidden.last_hidden_state.shape[-1])
    head = causal_lm.get_output_embeddings()
    if source.numel() == 0:
        return _no_completion_tokens(head, states, completion, temperature)
    scored = states[source]  # [n, H]: only the states that predict a completion token
    logprobs, entropy = _head_logprobs(head, scored, targets, temperature, chunk_size,
                                       compiled=has_compiled_layers(causal_lm))
    return TokenLogprobs(_scatter(logprobs, completion), _scatter(entropy, completion))


def _no_completion_tokens(head: nn.Module, states: Tensor, completion: Tensor, temperature: float) -> TokenLogprobs:
    """Zeros that still depend on every parameter: a micro-batch of empty completions (or a torchrun filler) keeps
    its backward, which FSDP needs on every rank, and loss.backward() has a graph to run."""
    first = _head_logprobs(head, states[:1], torch.zeros(1, dtype=torch.long, device=states.device), temperature, 1)
    zero = first[0].sum() * 0.0
    return TokenLogprobs(torch.zeros(completion.shape, device=states.device) + zero,
                         torch.zeros(completion.shape, device=states.device))


def _head_logprobs(head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, chunk_size: int,
                   compiled: bool = False) -> tuple[Tensor, Tensor]:
    """[n] log-probs and entropies of ``targets`` from [n, H] states, chunk by chunk."""
    scale = 1.0 / temperature if temperature > 0 else 1.0
    return head_logprobs(hidden, targets, head.weight, head.bias, scale, chunk_size, compiled)


def _scatter(values: Tensor, completion: Tensor) -> Tensor:
    """[n] values into the [B, T] completion layout (0 elsewhere), differentiably."""
    out = values.new_zeros(completion.shape)
    return out.masked_scatter(completion, values)
