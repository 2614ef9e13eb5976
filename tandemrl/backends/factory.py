"""Pick the rollout backend named by `rollout.backend`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tandemrl.backends.base import RolloutBackend
from tandemrl.backends.hf_backend import HFBackend
from tandemrl.config import Config


def make_backend(cfg: Config, model: nn.Module, tokenizer: Any, device: torch.device,
                 draft_model: nn.Module | None = None, frozen_model: nn.Module | None = None,
                 tensor_parallel: Any = None) -> RolloutBackend:
    """``tensor_parallel``: this rank's TensorParallelGroup when engine.tensor_parallel_size > 1 (torchrun)."""
    speculative = cfg.rollout.speculative
    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm.mode == "server":  # HTTP only: no vLLM import here
        from tandemrl.backends.vllm.server import VLLMServerBackend

        return VLLMServerBackend(model, tokenizer, cfg.rollout.vllm)
    if cfg.rollout.backend == "vllm":  # the config already refused tandem, speculative and LoRA with it
        from tandemrl.backends.vllm.backend import VLLMBackend
        from tandemrl.models.load import resolve_name_or_path

        path = resolve_name_or_path(cfg.model.name_or_path, tiny_dir=cfg.model.tiny_dir, tiny_seed=cfg.model.tiny_seed)
        return VLLMBackend(model, tokenizer, path, cfg.rollout.vllm, seed=cfg.train.seed)
    if cfg.rollout.backend == "server":
        from tandemrl.backends.server_backend import ServerBackend

        r = cfg.rollout
        return ServerBackend(r.server_url or "", max_staleness=r.max_staleness, retries=r.server_retries,
                             backoff_s=r.server_backoff_s, timeout_s=r.server_timeout_s)
    if cfg.rollout.backend == "engine" and _engine_supports(model):
        from tandemrl.backends.engine_backend import EngineBackend

        return EngineBackend(model, tokenizer, cfg.engine, device=device, speculative=speculative,
                             draft_model=draft_model, tandem=cfg.tandem, frozen_model=frozen_model,
                             tensor_parallel=tensor_parallel)
    if cfg.tandem.enabled:
        raise ValueError(f"tandem rollouts need the engine backend; {type(model).__name__} runs on the HF backend")
    if speculative.enabled:
        raise ValueError(f"rollout.speculative needs the engine backend; {type(model).__name__} runs on the HF "
                         "backend (rollout.backend = 'hf' or an architecture the engine does not support)")
    # The generic path: any decoder-only architecture, or the user asked for it.
    return HFBackend(model, tokenizer, max_batch_size=cfg.rollout.max_batch_size, device=device)


def _engine_supports(model: nn.Module) -> bool:
    from tandemrl.engine.model.forward import inspect_decoder

    try:
        inspect_decoder(model)
    except NotImplementedError:
        return False
    return True
