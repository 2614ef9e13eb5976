"""A checksum of a model's weights computed where they lie (no copy to the host): the trainer and the server each
compute it over the same named tensors, equal checksums say the push arrived whole (GET /v1/weights/checksum).

Over the bytes of each tensor in turn: their sum and their sum weighted by position (Adler-style), so a changed,
swapped or shifted byte changes it. Done in chunks: the int64 temporaries stay small.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor

from tandemrl.sync.buckets import as_bytes

CHUNK = 2**26  # bytes per step: the int64 temporaries take 8x this
MODULUS = 65521  # the position weights cycle through 1..MODULUS (keeps the int64 sums far from overflow)


def weights_checksum(tensors: Iterable[tuple[str, Tensor]]) -> str:
    """``"<tensors>:<bytes>:<sum>:<weighted sum>"`` over the named tensors, in the given order."""
    count, position = 0, 0
    plain = weighted = None
    for _, tensor in tensors:
        data = as_bytes(tensor)
        for start in range(0, data.numel(), CHUNK):
            chunk = data[start:start + CHUNK].to(torch.int64)
            weights = (torch.arange(chunk.numel(), device=chunk.device, dtype=torch.int64) + position) % MODULUS + 1
            part, part_weighted = chunk.sum(), (chunk * weights).sum()
            plain = part if plain is None else plain + part
            weighted = part_weighted if weighted is None else weighted + part_weighted
            position += chunk.numel()
        count += 1
    return f"{count}:{position}:{int(plain or 0)}:{int(weighted or 0)}"
