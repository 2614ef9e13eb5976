"""AdamW over the trainable parameters and a warmup + decay learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from tandemrl.config import TrainConfig


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (is everything frozen?)")
    # One fused kernel per step on CUDA for plain tensors (FSDP2's DTensor shards keep the foreach default).
    fused = all(p.is_cuda and type(p.data) is torch.Tensor for p in params) or None
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay, fused=fused)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, cfg.warmup_steps, cfg.max_steps, cfg.lr_schedule))


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    decay = {
        "constant": 1.0,
        "linear": 1.0 - progress,
        "cosine": 0.5 * (1.0 + math.cos(math.pi * progress)),
    }
    return decay[schedule]
