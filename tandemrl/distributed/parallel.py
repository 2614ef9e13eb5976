"""What the training loop asks of the job's layout: its share of the prompts, global loss normalisers, metrics
reduced across ranks. One process (`SingleProcess`) answers with no-ops, so the loop reads the same either way."""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence, TypeVar

import torch

from tandemrl.algo.losses import BatchNorm
from tandemrl.distributed.env import RankInfo

T = TypeVar("T")

# Step metrics that add up over ranks (each rank reports its part of a global rate).
SUMMED_METRICS = frozenset({"tokens_per_s"})


class Parallel(Protocol):
    rank: int
    world_size: int

    @property
    def is_main(self) -> bool: ...
    def local_share(self, items: Sequence[T]) -> list[T]: ...
    def all_shares(self, items: Sequence[T]) -> list[T]: ...
    def eval_share(self, items: Sequence[T]) -> list[T]: ...
    def rollout_seed(self, seed: int) -> int: ...
    def train_rows(self, rows: int) -> slice: ...
    def global_norm(self, norm: BatchNorm) -> BatchNorm: ...
    def reduce_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]: ...
    def any(self, flag: bool) -> bool: ...
    def barrier(self) -> None: ...


class SingleProcess:
    """The job is this one process: everything is already global."""

    rank, world_size = 0, 1

    @property
    def is_main(self) -> bool:
        return True

    def local_share(self, items: Sequence[T]) -> list[T]:
        return list(items)

    def all_shares(self, items: Sequence[T]) -> list[T]:
        return list(items)

    def eval_share(self, items: Sequence[T]) -> list[T]:
        return list(items)

    def rollout_seed(self, seed: int) -> int:
        return seed

    def train_rows(self, rows: int) -> slice:
        return slice(None)

    def global_norm(self, norm: BatchNorm) -> BatchNorm:
        return norm

    def reduce_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return metrics

    def any(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        return None


class Distributed:
    """One rank of a torchrun job (the process group is already up).

    ``tensor_parallel_size`` N > 1: the N consecutive ranks of a group run one engine, so they sample the same prompts
    with the same seed (the rollouts are the group's, on every rank of it); each rank then trains on its 1/N of them.
    """

    def __init__(self, info: RankInfo, tensor_parallel_size: int = 1) -> None:
        self.rank, self.world_size, self.device = info.rank, info.world_size, info.device
        self.tp_size = tensor_parallel_size
        self.engines, self.engine_index = info.world_size // tensor_parallel_size, info.rank // tensor_parallel_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def local_share(self, items: Sequence[T]) -> list[T]:
        """This engine's contiguous slice of the global batch (prompts: each prompt's whole group samples here)."""
        if len(items) % self.engines:
            raise ValueError(f"{len(items)} prompts per step cannot be split evenly over {self.engines} engines: "
                             "make rollout.prompts_per_step a multiple of the number of processes / "
                             "engine.tensor_parallel_size")
        per_engine = len(items) // self.engines
        return list(items[self.engine_index * per_engine:(self.engine_index + 1) * per_engine])

    def all_shares(self, items: Sequence[T]) -> list[T]:
        """Every engine's ``items`` (one per share of the prompts, e.g. its rewards), joined in rank order: what one
        process would hold for the whole batch (an engine's tensor-parallel ranks hold the same: counted once)."""
        import torch.distributed as dist

        gathered: list[list[T] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, list(items))
        return [item for share in gathered[::self.tp_size] for item in share or []]

    def eval_share(self, items: Sequence[T]) -> list[T]:
        """This engine's part of the test prompts, any number of them: every engines-th one from its index (the
        ranks of one tensor-parallel engine take the same part); ``all_shares`` joins the parts' results."""
        return list(items[self.engine_index::self.engines])

    def rollout_seed(self, seed: int) -> int:
        return seed * self.engines + self.engine_index  # distinct streams per engine, still a function of the step

    def train_rows(self, rows: int) -> slice:
        """This rank's rows of its engine's rollouts (all of them when every rank runs its own engine)."""
        per_rank = rows // self.tp_size
        first = (self.rank % self.tp_size) * per_rank
        return slice(first, first + per_rank)

    def global_norm(self, norm: BatchNorm) -> BatchNorm:
        """The mini-batch normalisers over every rank's rows, divided by the world size: FSDP averages gradients
        over ranks, so mean_r(sum_r / (total / N)) = sum / total, the global loss's gradient. Each rank's loss (and
        every loss metric) is then the global value as this rank's rows estimate it; their mean is the global one."""
        import torch.distributed as dist

        sums = torch.tensor([norm.total_tokens, float(norm.num_sequences)], dtype=torch.float64, device=self.device)
        width = torch.tensor([norm.max_completion_length], dtype=torch.int64, device=self.device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        dist.all_reduce(width, op=dist.ReduceOp.MAX)
        scaled = sums / self.world_size  # num_sequences may become fractional: it is only ever divided by
        return BatchNorm(total_tokens=float(scaled[0]), num_sequences=float(scaled[1]),  # type: ignore[arg-type]
                         max_completion_length=int(width[0]))

    def reduce_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Every rank's step metrics combined: rates add up, maxima/peaks take the max, minima the min, a ``*/std``
        beside its ``*/mean`` is pooled, the rest (means over equal-sized shares of the batch, loss estimates) the
        mean; equal values stay as they are."""
        import torch.distributed as dist

        gathered: list[dict[str, Any] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, metrics)
        combined = combine_metrics([g for g in gathered if g is not None], SUMMED_METRICS)
        for key in SUMMED_METRICS & combined.keys():  # the ranks of one engine report its rate each
            combined[key] /= self.tp_size
        return combined

    def any(self, flag: bool) -> bool:
        import torch.distributed as dist

        value = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()


def combine_metrics(per_rank: list[dict[str, Any]], summed: frozenset[str]) -> dict[str, Any]:
    keys = list(dict.fromkeys(k for metrics in per_rank for k in metrics))
    out: dict[str, Any] = {}
    for key in keys:
        values = [m[key] for m in per_rank if key in m]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) != len(values) or all(v == values[0] for v in values) and key not in summed:
            out[key] = values[0]
        elif key in summed:
            out[key] = sum(numbers)
        elif key.endswith(("_max", "/max")) or "peak" in key:
            out[key] = max(numbers)
        elif key.endswith(("_min", "/min")):
            out[key] = min(numbers)
        elif key.endswith("/std") and _has_means(per_rank, key):
            out[key] = pooled_std(numbers, [m[key[:-4] + "/mean"] for m in per_rank])
        else:
            out[key] = sum(numbers) / len(numbers)
    return out


def _has_means(per_rank: list[dict[str, Any]], std_key: str) -> bool:
    return all(std_key in m and isinstance(m.get(std_key[:-4] + "/mean"), (int, float)) for m in per_rank)


def pooled_std(stds: list[float], means: list[float]) -> float:
    """The population std of the union of equal-sized groups, from each group's mean and population std."""
    grand = sum(means) / len(means)
    variance = sum(s * s + (m - grand) ** 2 for s, m in zip(stds, means)) / len(stds)
    return math.sqrt(variance)
