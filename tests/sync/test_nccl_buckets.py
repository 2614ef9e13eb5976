"""The bucketed push's byte layout (sync/buckets.py): buckets reassemble into every tensor, a tensor larger than a
bucket spans several, each tensor is asked for once and in order; and the checksum sees a changed byte."""

from __future__ import annotations

import pytest
import torch

from tandemrl.sync.buckets import ALIGN, bucket_spans, filled_buckets, layout, received_tensors
from tandemrl.sync.checksum import weights_checksum


def named_tensors() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [("a", torch.randn(3, 5, generator=gen)),  # 60 bytes: the next starts at 64
            ("b", torch.randn(7, generator=gen).to(torch.bfloat16)),
            ("empty", torch.zeros(0)),
            ("big", torch.randn(40, 9, generator=gen).to(torch.float16)),  # 720 bytes: over several buckets
            ("c", torch.randn(2, 2, generator=gen).t())]  # not contiguous


def specs_of(tensors):
    return [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for n, t in tensors]


@pytest.mark.parametrize("bucket_bytes", [16, 100, 256, 10_000])
def test_buckets_reassemble_every_tensor(bucket_bytes):
    tensors = named_tensors()
    segments, total = layout(specs_of(tensors))
    assert all(s.offset % ALIGN == 0 for s in segments)
    assert segments[0].nbytes == 60 and segments[1].offset == 64
    asked: list[int] = []

    def tensor_at(i: int) -> torch.Tensor:
        asked.append(i)
        return tensors[i][1]

    staging = torch.zeros(total, dtype=torch.uint8)
    spans = bucket_spans(total, bucket_bytes)
    for (start, end), bucket in zip(spans, filled_buckets(segments, total, tensor_at, bucket_bytes,
                                                          torch.device("cpu")), strict=True):
        assert bucket.numel() == end - start <= bucket_bytes
        staging[start:end] = bucket  # what a receiver's broadcast does
    assert asked == list(range(len(tensors)))  # once each, in order: a sharded model's gathers line up
    received = received_tensors(segments, staging)
    for name, tensor in tensors:
        assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape
        assert torch.equal(received[name], tensor), name


def test_layout_refuses_an_unknown_dtype_and_a_tiny_bucket():
    with pytest.raises(ValueError, match="'x'.*int8"):
        layout([{"name": "x", "shape": [2], "dtype": "int8"}])
    with pytest.raises(ValueError, match="smaller than"):
        bucket_spans(100, 8)


def test_checksum_sees_one_changed_byte_and_a_swap():
    tensors = named_tensors()
    reference = weights_checksum(tensors)
    assert weights_checksum([(n, t.clone()) for n, t in tensors]) == reference
    changed = [(n, t.clone()) for n, t in tensors]
    changed[3][1].view(torch.uint8).view(-1)[7] ^= 1
    assert weights_checksum(changed) != reference
    swapped = [(n, t.clone()) for n, t in tensors]
    swapped[0][1][0, 0], swapped[0][1][0, 1] = tensors[0][1][0, 1], tensors[0][1][0, 0]
    assert weights_checksum(swapped) != reference
