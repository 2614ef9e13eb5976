"""The tensor-parallel engine's weights, refreshed from the trained model after each update: each rank receives only
its slice of every parameter (models/tensor_parallel.py says which), never a whole replica.

Sharded training (FSDP2) holds every parameter as a DTensor whose rows are split over the job's ranks (Shard(0),
torch.chunk's split: ceil(rows / world) per rank). Rank r's engine needs rows start:stop (q/k/v, gate/up, vocabulary)
or columns start:stop of every row (o_proj, down_proj), or the whole tensor (norms: small). Each rank knows every
rank's FSDP rows and every rank's engine slice, so one ``all_to_all_single`` per parameter sends each rank exactly
the part of its own rows another rank needs, straight into the engine's tensor (rows arrive in order: the slice of
rows, or all rows of the slice of columns). Replicated training holds whole tensors: each rank copies its slices.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.autograd.graph import increment_version

from tandemrl.models.tensor_parallel import (ParamSlice, TensorParallelGroup, param_slice, shard_params,
                                                   take_slice, target_view)


def tensor_parallel_group(rank: int, world_size: int, size: int) -> TensorParallelGroup:
    """Collective: this rank's group among consecutive blocks of ``size`` ranks (every rank makes every group, as
    torch.distributed asks)."""
    import torch.distributed as dist

    if size == world_size:
        return TensorParallelGroup(rank=rank, size=size)
    mine = None
    for first in range(0, world_size, size):
        group = dist.new_group(list(range(first, first + size)))
        if first <= rank < first + size:
            mine = group
    return TensorParallelGroup(rank=rank % size, size=size, group=mine)


@dataclass
class TensorParallelWeights:
    """Copies each rank's slices of ``trained``'s weights (FSDP2 DTensors or whole tensors) into ``shard``'s own
    tensors, in place (the engine's pointers and CUDA graphs stay valid). ``tp_size``: ranks per engine; the groups
    are consecutive ranks (``tensor_parallel_group``)."""

    trained: nn.Module
    shard: nn.Module
    tp_size: int

    def __post_init__(self) -> None:
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        sources = dict(self.trained.named_parameters(remove_duplicate=False))
        sizes = self.shard.shard_sizes
        self._params = [
            (sources[name], target, [param_slice(name, sizes, r % self.tp_size) for r in range(self.world)])
            for name, target, _ in shard_params(self.shard, self.rank % self.tp_size)]

    @torch.no_grad()
    def refresh(self) -> float:
        """Every parameter's slices in place; returns the seconds it took (device work included)."""
        from torch.distributed.tensor import DTensor

        start = time.perf_counter()
        for source, target, pieces in self._params:
            mine = pieces[self.rank]
            if not isinstance(source, DTensor):
                target_view(target, mine).copy_(take_slice(source, mine))
            elif _row_sharded(source, self.world):
                self._exchange(source.to_local(), tuple(source.shape), target, pieces)
            else:  # a layout FSDP2 does not make by default: gather it whole, keep the slice
                target_view(target, mine).copy_(take_slice(source.full_tensor(), mine))
        if self._params and self._params[0][1].is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def _exchange(self, local: Tensor, shape: tuple[int, ...], target: Tensor, pieces: list[ParamSlice]) -> None:
        import torch.distributed as dist

        bounds = fsdp_rows(shape[0], self.world)
        low, high = bounds[self.rank]
        if local.shape[0] != high - low:
            raise RuntimeError(f"an FSDP2 shard holds {local.shape[0]} rows where torch.chunk's split gives "
                               f"{high - low}: the tensor-parallel refresh cannot place them")
        sends, send_sizes, receive_sizes = [], [], []
        for r, piece in enumerate(pieces):
            part = _part(local, low, high, piece, shape)
            sends.append(part.reshape(-1))
            send_sizes.append(part.numel())
            receive_sizes.append(_part_numel(*bounds[r], pieces[self.rank], shape))
        out = target_view(target, pieces[self.rank])
        direct = out.is_contiguous() and out.dtype == local.dtype
        buffer = out if direct else out.new_empty(out.shape, dtype=local.dtype)
        dist.all_to_all_single(buffer.view(-1), torch.cat(sends), receive_sizes, send_sizes)
        if buffer is not out:
            out.copy_(buffer)
        increment_version(target)  # the engine's weights_version (slot.py) sees the write


def fsdp_rows(rows: int, world: int) -> list[tuple[int, int]]:
    """The rows of a dim-0 FSDP2 shard on each rank (torch.chunk: ceil(rows / world) each, the last ones short or
    empty)."""
    chunk = -(-rows // world)
    return [(min(q * chunk, rows), min((q + 1) * chunk, rows)) for q in range(world)]


def _row_sharded(source, world: int) -> bool:
    from torch.distributed.tensor import Shard

    return (source.device_mesh.ndim == 1 and source.device_mesh.size() == world
            and tuple(source.placements) == (Shard(0),))


def _needed_rows(piece: ParamSlice, rows: int) -> tuple[int, int]:
    return (piece.start, piece.stop) if piece.dim == 0 else (0, rows)


def _part(local: Tensor, low: int, high: int, piece: ParamSlice, shape: tuple[int, ...]) -> Tensor:
    """What of this rank's rows low:high (held as ``local``) the rank with slice ``piece`` needs."""
    first, last = _needed_rows(piece, shape[0])
    a, b = max(first, low), min(last, high)
    rows = local.narrow(0, a - low, b - a) if b > a else local[:0]
    return rows.narrow(1, piece.start, piece.stop - piece.start) if piece.dim == 1 else rows


def _part_numel(low: int, high: int, piece: ParamSlice, shape: tuple[int, ...]) -> int:
    """The size of ``_part`` for the rank holding rows low:high."""
    first, last = _needed_rows(piece, shape[0])
    rows = max(min(last, high) - max(first, low), 0)
    if piece.dim == 1:
        return rows * (piece.stop - piece.start) * math.prod(shape[2:])
    return rows * math.prod(shape[1:])
