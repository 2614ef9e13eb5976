"""Everything a run needs, built from the config before the first step (so bad input fails early)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import torch
from torch import nn

from tandemrl.backends.base import RolloutBackend
from tandemrl.backends.factory import make_backend
from tandemrl.config import Config, ModelConfig
from tandemrl.data.iterator import PromptIterator
from tandemrl.data.tasks import load_task
from tandemrl.models.load import load_model, load_tokenizer, resolve_device, resolve_name_or_path
from tandemrl.models.lora import LoraSettings, apply_lora
from tandemrl.rewards.composite import CompositeReward, build_reward
from tandemrl.train.optim import build_optimizer, build_scheduler
from tandemrl.train.rollouts import PromptEncoder
from tandemrl.types import Sample


@dataclass
class TrainerState:
    """What a checkpoint must carry besides weights and optimizer to resume exactly."""

    step: int = 0
    policy_version: int = 0
    consecutive_nonfinite: int = 0
    initial_eval: dict | None = None
    data: dict = field(default_factory=dict)


@dataclass
class Run:
    cfg: Config
    out_dir: Path
    device: torch.device
    model: nn.Module
    tokenizer: object
    encoder: PromptEncoder
    backend: RolloutBackend
    reward: CompositeReward
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_prompts: PromptIterator
    test_samples: list[Sample]
    ref_model: nn.Module | None


def default_out_dir(cfg: Config) -> Path:
    task = cfg.data.task.replace(":", "-")
    return Path("runs") / f"{task}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def load_policy(cfg: ModelConfig, device: torch.device) -> tuple[nn.Module, object]:
    path = resolve_name_or_path(cfg.name_or_path, tiny_dir=cfg.tiny_dir, tiny_seed=cfg.tiny_seed)
    model = load_model(
        path, dtype=cfg.dtype, device=device, gradient_checkpointing=cfg.gradient_checkpointing,
        attn_implementation=cfg.attn_implementation, trust_remote_code=cfg.trust_remote_code,
    )
    tokenizer = load_tokenizer(path, trust_remote_code=cfg.trust_remote_code)
    if cfg.lora.enabled:
        lora = cfg.lora
        model = apply_lora(model, LoraSettings(lora.rank, lora.alpha, lora.dropout, list(lora.target_modules)))
    return model, tokenizer


def build_run(cfg: Config, out_dir: Path) -> Run:
    torch.manual_seed(cfg.train.seed)
    device = resolve_device(cfg.model.device)
    train_samples = load_task(cfg.data.task, cfg.data.train_split, path=cfg.data.path,
                              limit=cfg.data.train_limit, seed=cfg.train.seed)
    test_samples = load_task(cfg.data.task, cfg.data.test_split, path=cfg.data.path,
                             limit=cfg.eval.limit, seed=cfg.train.seed)
    reward = build_reward(cfg.reward.weights)
    model, tokenizer = load_policy(cfg.model, device)
    model.train()
    # With LoRA the reference is the base model (adapter disabled); otherwise a frozen copy.
    ref_model = None
    if cfg.train.kl_beta > 0 and not cfg.model.lora.enabled:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = build_optimizer(model, cfg.train)
    return Run(
        cfg=cfg, out_dir=out_dir, device=device, model=model, tokenizer=tokenizer,
        encoder=PromptEncoder(tokenizer, cfg.data.use_chat_template, cfg.data.system_prompt),
        backend=make_backend(cfg, model, tokenizer, device),
        reward=reward, optimizer=optimizer, scheduler=build_scheduler(optimizer, cfg.train),
        train_prompts=PromptIterator(train_samples, cfg.rollout.prompts_per_step, seed=cfg.train.seed),
        test_samples=test_samples, ref_model=ref_model,
    )
