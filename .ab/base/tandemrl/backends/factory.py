"""Pick the rollout backend named by `rollout.backend`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tandemrl.backends.base import RolloutBackend
from tandemrl.backends.hf_backend import HFBackend
from tandemrl.config import Config


def make_backend(cfg: Config, model: nn.Module, tokenizer: Any, device: torch.device) -> RolloutBackend:
    if cfg.rollout.backend == "engine" and _engine_supports(model):
        from tandemrl.backends.engine_backend import EngineBackend
        from tandemrl.engine.config import EngineConfig

        return EngineBackend(model, tokenizer, EngineConfig(**cfg.engine.model_dump()), device=device)
    # The generic path: any decoder-only architecture, or the user asked for it.
    return HFBackend(model, tokenizer, max_batch_size=cfg.rollout.max_batch_size, device=device)


def _engine_supports(model: nn.Module) -> bool:
    from tandemrl.engine.forward import inspect_decoder

    try:
        inspect_decoder(model)
    except NotImplementedError:
        return False
    return True
