"""The policy update: epochs x mini-batches x micro-batches with gradient accumulation over one rollout batch.

Micro-batches are packed (no padding) and sized by a token budget (train/micro_batches.py); the loss's normalisers
are the mini-batch's, so the result does not depend on how its rows are grouped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from tandemrl.algo.losses import (
    POLICY_LOSSES, BatchNorm, LossConfig, LossInputs, accumulate_metrics, is_maximum,
)
from tandemrl.config import TrainConfig
from tandemrl.train.batch import TrainBatch
from tandemrl.train.logprobs import completion_logprobs
from tandemrl.train.micro_batches import micro_batch_limits, micro_batches


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    optimizer_steps: int = 0
    skipped_nonfinite: int = 0


@dataclass
class _MeanOf:
    """Means over optimizer steps of per-mini-batch metric values; maxima (``*_max``) keep their max."""

    sums: dict[str, float] = field(default_factory=dict)
    count: int = 0

    def add(self, metrics: dict[str, float]) -> None:
        accumulate_metrics(self.sums, metrics)
        self.count += 1

    def means(self) -> dict[str, float]:
        return {k: v if is_maximum(k) else v / max(self.count, 1) for k, v in self.sums.items()}


def policy_update(
    model: nn.Module,
    batch: TrainBatch,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    cfg: TrainConfig,
    temperature: float,
    max_completion_length: int,
    global_norm: Callable[[BatchNorm], BatchNorm] | None = None,
    any_rank: Callable[[bool], bool] | None = None,
    reduce_gradients: Callable[[], None] | None = None,
) -> UpdateResult:
    """Runs cfg.epochs_per_batch passes over the batch, one optimizer step per mini-batch.

    ``global_norm`` turns a mini-batch's normalisers into the whole job's (multi-process: every rank's rows), so
    each rank's loss is its share of the global loss and the summed gradients are the global gradient. ``any_rank``
    (multi-process: is the flag true on any rank?) keeps every rank running as many micro-batches, and every rank
    skipping the same steps. ``reduce_gradients`` (replicated ranks) averages the accumulated gradients over the
    ranks once per optimizer step, after the last micro-batch's backward.
    """
    loss_cfg = LossConfig(
        eps_low=cfg.eps_low, eps_high=cfg.eps_high, kl_beta=cfg.kl_beta,
        aggregation=cfg.aggregation, max_completion_length=max_completion_length, tis_cap=cfg.tis_cap,
        tis_mode=cfg.tis_mode,
    )
    result, step_metrics = UpdateResult(metrics={}), _MeanOf()
    generator = torch.Generator().manual_seed(cfg.seed + int(scheduler.last_epoch))
    for _ in range(cfg.epochs_per_batch):
        order = torch.randperm(batch.size, generator=generator).to(batch.input_ids.device)
        for mini in order.chunk(cfg.mini_batches):
            metrics = _accumulate_gradients(model, batch.rows(mini), loss_cfg, cfg, temperature, global_norm,
                                            any_rank)
            if reduce_gradients is not None:
                reduce_gradients()
            params = [p for p in model.parameters() if p.requires_grad]
            grad_norm = _full(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            skip = metrics is None or not bool(torch.isfinite(grad_norm))
            if any_rank is not None:  # replicas (and shards) must take the same steps
                skip = any_rank(skip)
            if skip:
                optimizer.zero_grad(set_to_none=True)
                result.skipped_nonfinite += 1
                continue
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            result.optimizer_steps += 1
            step_metrics.add({**metrics, "grad_norm": float(grad_norm)})
    scheduler.step()
    result.metrics = {**step_metrics.means(), "lr": scheduler.get_last_lr()[0]}
    return result


def _full(grad_norm: torch.Tensor) -> torch.Tensor:
    """The global gradient norm: FSDP2 returns it as a DTensor (a partial norm per rank)."""
    full_tensor = getattr(grad_norm, "full_tensor", None)
    return full_tensor() if full_tensor is not None else grad_norm


def _accumulate_gradients(
    model: nn.Module, mini_batch: TrainBatch, loss_cfg: LossConfig, cfg: TrainConfig, temperature: float,
    global_norm: Callable[[BatchNorm], BatchNorm] | None = None, any_rank: Callable[[bool], bool] | None = None,
) -> dict[str, float] | None:
    """Backward over the micro-batches of one mini-batch; its metrics, or None if the loss was not finite.

    A non-finite micro-batch is still backpropagated (its gradients are dropped with the step): under FSDP every
    rank must run the same number of backward passes, or the gradient reduce-scatter waits forever.
    """
    loss_fn = POLICY_LOSSES.get(cfg.policy_loss)
    # Normalisers over the whole mini-batch make accumulation exact: 1 x 8 micro-batches == 8 x 1, any packing.
    norm = BatchNorm.from_masks([mini_batch.loss_mask], loss_cfg.max_completion_length)
    if global_norm is not None:
        norm = global_norm(norm)
    finite: torch.Tensor | bool = True
    # Each micro-batch's loss and metrics are its share of the mini-batch's: they add up. They stay on the device
    # (0-dim tensors) and are read once below, so the micro-batch loop never waits on the GPU for a metric.
    totals: dict[str, torch.Tensor] = {}
    for part in micro_batches(mini_batch, micro_batch_limits(cfg, model), any_rank):
        micro = part.batch
        out = completion_logprobs(model, micro, temperature, cfg.logprob_chunk_size)
        # old = the policy before this update: fixed up front, or on a single on-policy pass the detached
        # current log-probs. TIS and the mismatch metrics compare it with the rollout engine's.
        old = micro.old_logprobs if micro.old_logprobs is not None else out.logprobs.detach()
        inputs = LossInputs(out.logprobs, old, micro.advantages, micro.loss_mask, micro.ref_logprobs,
                            micro.rollout_logprobs)
        loss_out = loss_fn(inputs, loss_cfg, norm)
        loss = loss_out.loss.detach()
        finite = torch.isfinite(loss) & finite
        loss_out.loss.backward()
        entropy = (out.entropy * micro.loss_mask).sum() / max(norm.total_tokens, 1e-9)
        accumulate_metrics(totals, {**loss_out.metrics, "loss": loss, "entropy": entropy})
    return _read_once(totals) if bool(finite) else None


def _read_once(totals: dict[str, torch.Tensor]) -> dict[str, float]:
    """The mini-batch's metrics as floats: one device-to-host copy for all of them."""
    values = torch.stack([v.detach().to(torch.float64) for v in totals.values()]).tolist()
    return dict(zip(totals, values))
