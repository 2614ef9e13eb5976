"""The byte layout of a bucketed weight push: every tensor's bytes at an aligned offset of one stream, the stream cut
into fixed-size buckets.

The sender copies each tensor's bytes into one bucket-sized buffer and sends it when full, so it never holds more
than one bucket beyond its weights (and, for a sharded model, the one gathered parameter being copied). The
receiver, knowing the same specs and bucket size, receives each bucket straight into its slice of one staging
buffer and reads the tensors back as views of it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import torch
from torch import Tensor

ALIGN = 16  # every tensor starts at a multiple of this many bytes: its view of the byte stream is well aligned
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16)}


@dataclasses.dataclass(frozen=True)
class Segment:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # bytes from the start of the stream
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


def layout(specs: list[dict]) -> tuple[list[Segment], int]:
    """The segments of ``specs`` ([{name, shape, dtype}] in send order) and the stream's length in bytes."""
    segments, offset = [], 0
    for spec in specs:
        dtype = DTYPES.get(spec["dtype"])
        if dtype is None:
            raise ValueError(f"tensor {spec['name']!r}: dtype {spec['dtype']!r} is not one of {sorted(DTYPES)}")
        shape = tuple(int(n) for n in spec["shape"])
        numel = 1
        for n in shape:
            numel *= n
        offset = -(-offset // ALIGN) * ALIGN
        segments.append(Segment(spec["name"], shape, dtype, offset, numel * dtype.itemsize))
        offset += segments[-1].nbytes
    return segments, offset


def bucket_spans(total: int, bucket_bytes: int) -> list[tuple[int, int]]:
    """[start, end) of each bucket: every one ``bucket_bytes`` long but the last."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"a bucket of {bucket_bytes} bytes is smaller than the {ALIGN}-byte alignment")
    return [(start, min(start + bucket_bytes, total)) for start in range(0, total, bucket_bytes)]


def as_bytes(tensor: Tensor) -> Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def filled_buckets(segments: list[Segment], total: int, tensor_at: Callable[[int], Tensor], bucket_bytes: int,
                   device: torch.device) -> Iterator[Tensor]:
    """Yields each bucket in turn, filled (a view of one buffer, overwritten after the caller resumes: send it
    before asking for the next). ``tensor_at(i)`` gives segment i's tensor; it is asked once, in order, and
    dropped when its last byte is in a bucket, so a gathered full tensor lives only while it is copied."""
    spans = bucket_spans(total, bucket_bytes)
    buffer = torch.empty(spans[0][1] if spans else 0, dtype=torch.uint8, device=device)
    index, data = 0, None
    for start, end in spans:
        while index < len(segments) and segments[index].offset < end:
            segment = segments[index]
            if data is None:
                data = as_bytes(tensor_at(index))
            low, high = max(segment.offset, start), min(segment.end, end)
            if high > low:
                buffer[low - start:high - start].copy_(data[low - segment.offset:high - segment.offset])
            if segment.end > end:
                break  # the rest of this tensor goes into the next bucket
            index, data = index + 1, None
        yield buffer[:end - start]
    for rest in range(index, len(segments)):  # empty tensors at the very end: still asked for (a sharded model's
        tensor_at(rest)                       # ranks gather every parameter together)


def received_tensors(segments: list[Segment], staging: Tensor) -> dict[str, Tensor]:
    """The tensors as views of the staging buffer that received the whole stream."""
    return {s.name: staging[s.offset:s.end].view(s.dtype).view(s.shape) for s in segments}
