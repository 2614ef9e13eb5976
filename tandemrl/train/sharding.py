"""The trainer's model under FSDP2 (torchrun): distributed/fsdp.py shards its layers, and the log-prob pass
(logprobs.py) becomes a forward method of the root. It calls the decoder and reads lm_head.weight directly (chunked,
without full logits); as a registered forward method it runs between FSDP's gather and its gradient hooks.
"""

from __future__ import annotations

from torch import nn

from tandemrl.distributed.fsdp import fully_shard_decoder
from tandemrl.train.batch import TrainBatch
from tandemrl.train.logprobs import FSDP_FORWARD, TokenLogprobs, logprobs_of


def shard_model(model: nn.Module) -> None:
    """FSDP2 over the decoder layers and the root, with the trainer's log-prob pass as the root's forward method."""
    fully_shard_decoder(model, {FSDP_FORWARD: _sharded_logprobs})


def _sharded_logprobs(model: nn.Module, batch: TrainBatch, temperature: float, chunk_size: int) -> TokenLogprobs:
    out = logprobs_of(model, batch, temperature, chunk_size)
    # FSDP hooks its backward onto the outputs: fresh tensors, not views (an in-place op on a view drops the hook)
    return TokenLogprobs(out.logprobs.clone(), out.entropy)
