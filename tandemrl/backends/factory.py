"""Pick the rollout backend named by `rollout.backend`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tandemrl.backends.base import RolloutBackend
from tandemrl.config import Config


def make_backend(cfg: Config, model: nn.Module, tokenizer: Any, device: torch.device) -> RolloutBackend:
    if cfg.rollout.backend == "hf":
        from tandemrl.backends.hf_backend import HFBackend

        return HFBackend(model, tokenizer, max_batch_size=cfg.rollout.max_batch_size, device=device)
    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.engine.config import EngineConfig
    from tandemrl.engine.forward import inspect_decoder
    from tandemrl.backends.hf_backend import HFBackend

    try:
        inspect_decoder(model)
    except NotImplementedError:  # no fast path for this architecture: the generic backend still works
        return HFBackend(model, tokenizer, max_batch_size=cfg.rollout.max_batch_size, device=device)
    return EngineBackend(model, tokenizer, EngineConfig(**cfg.engine.model_dump()), device=device)
