"""The policy update: epochs x mini-batches x micro-batches with gradient accumulation over one rollout batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from tandemrl.algo.losses import POLICY_LOSSES, BatchNorm, LossConfig, LossInputs
from tandemrl.config import TrainConfig
from tandemrl.train.batch import TrainBatch
from tandemrl.train.logprobs import completion_logprobs


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    optimizer_steps: int = 0
    skipped_nonfinite: int = 0


@dataclass
class _MeanOf:
    """Means over optimizer steps of per-mini-batch metric values."""

    sums: dict[str, float] = field(default_factory=dict)
    count: int = 0

    def add(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.count += 1

    def means(self) -> dict[str, float]:
        return {k: v / max(self.count, 1) for k, v in self.sums.items()}


def policy_update(
    model: nn.Module,
    batch: TrainBatch,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    cfg: TrainConfig,
    temperature: float,
    max_completion_length: int,
) -> UpdateResult:
    """Runs cfg.epochs_per_batch passes over the batch, one optimizer step per mini-batch."""
    loss_cfg = LossConfig(
        eps_low=cfg.eps_low, eps_high=cfg.eps_high, kl_beta=cfg.kl_beta,
        aggregation=cfg.aggregation, max_completion_length=max_completion_length,
    )
    result, step_metrics = UpdateResult(metrics={}), _MeanOf()
    generator = torch.Generator().manual_seed(cfg.seed + int(scheduler.last_epoch))
    for _ in range(cfg.epochs_per_batch):
        order = torch.randperm(batch.size, generator=generator).to(batch.input_ids.device)
        for mini in order.chunk(cfg.mini_batches):
            metrics = _accumulate_gradients(model, batch.rows(mini), loss_cfg, cfg, temperature)
            params = [p for p in model.parameters() if p.requires_grad]
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm) if metrics is not None else None
            if grad_norm is None or not torch.isfinite(grad_norm):
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


def _accumulate_gradients(
    model: nn.Module, mini_batch: TrainBatch, loss_cfg: LossConfig, cfg: TrainConfig, temperature: float
) -> dict[str, float] | None:
    """Backward over the micro-batches of one mini-batch; its metrics, or None if the loss was not finite."""
    loss_fn = POLICY_LOSSES.get(cfg.policy_loss)
    # Normalisers over the whole mini-batch make accumulation exact: 1 x 8 micro-batches == 8 x 1.
    norm = BatchNorm.from_masks([mini_batch.loss_mask], loss_cfg.max_completion_length)
    # Each micro-batch's loss and metrics are its share of the mini-batch's: they add up.
    totals: dict[str, float] = {"loss": 0.0, "entropy": 0.0}
    for start in range(0, mini_batch.size, cfg.micro_batch_size):
        micro = mini_batch.rows(slice(start, start + cfg.micro_batch_size))
        out = completion_logprobs(model, micro, temperature, cfg.logprob_chunk_size)
        old = micro.old_logprobs if micro.old_logprobs is not None else out.logprobs.detach()
        inputs = LossInputs(out.logprobs, old, micro.advantages, micro.loss_mask, micro.ref_logprobs)
        loss_out = loss_fn(inputs, loss_cfg, norm)
        if not torch.isfinite(loss_out.loss):
            return None
        loss_out.loss.backward()
        entropy = float((out.entropy * micro.loss_mask).sum()) / max(norm.total_tokens, 1e-9)
        for key, value in {**loss_out.metrics, "loss": float(loss_out.loss.detach()), "entropy": entropy}.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals
