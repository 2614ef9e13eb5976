"""distributed.strategy: replicate what fits one GPU with its training state, shard what does not; LoRA replicates."""

from __future__ import annotations

import pytest
import torch

from tandemrl.distributed.replicate import buckets
from tandemrl.distributed.strategy import decide, training_state_bytes

GIB = 2**30


def test_auto_replicates_what_fits_and_shards_what_does_not():
    def need(params_b: float) -> int:  # bf16 full fine-tuning: weights, gradients, two AdamW moments
        return int(params_b * 1e9 * 2 * 4)

    h100, h200 = 80 * GIB, 141 * GIB
    assert decide("auto", need(0.5), h100, lora=False).strategy == "replicate"
    assert decide("auto", need(1.5), h100, lora=False).strategy == "replicate"
    assert decide("auto", need(7.6), h100, lora=False).strategy == "shard"
    assert decide("auto", need(7.6), h200, lora=False).strategy == "replicate"
    assert decide("auto", need(7.6), None, lora=False).strategy == "replicate"  # the CPU
    assert "GiB" in decide("auto", need(7.6), h100, lora=False).reason


def test_the_key_overrides_and_lora_replicates():
    assert decide("shard", 1, None, lora=False).strategy == "shard"
    assert decide("replicate", 10**12, 80 * GIB, lora=False).strategy == "replicate"
    assert decide("auto", 10**12, 80 * GIB, lora=True).strategy == "replicate"
    with pytest.raises(ValueError, match="distributed.strategy = 'shard' does not take model.lora.enabled"):
        decide("shard", 1, None, lora=True)


def test_training_state_counts_adam_and_gradients_only_for_trained_weights():
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))  # 110 weights each, fp32
    assert training_state_bytes(model) == 220 * 4 * 4
    model[0].requires_grad_(False)
    assert training_state_bytes(model, extra_copies=1) == 220 * 4 * 2 + 110 * 4 * 3


def test_buckets_keep_order_dtype_and_size():
    tensors = [torch.zeros(4), torch.zeros(4), torch.zeros(10), torch.zeros(2, dtype=torch.bfloat16), torch.zeros(1)]
    groups = buckets(tensors, limit=32)
    assert [[t.numel() for t in g] for g in groups] == [[4, 4], [10], [2], [1]]
    assert [t for g in groups for t in g] == tensors
