"""A RolloutBackend over tandemrl's own engine (paged KV cache, continuous batching, prefix sharing).

The model runner decodes with the trainer's own parameter tensors (no copy); this file only wires the model,
tokenizer and config into an ``LLMEngine`` and maps the backend protocol onto it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
from torch import nn

from tandemrl.backends.hf_backend import eos_token_ids, sampling_mode
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.engine import LLMEngine
from tandemrl.types import Request, Rollout


class EngineBackend:
    """RolloutBackend (generate / sleep / wake / close) backed by ``LLMEngine`` and the model runner."""

    def __init__(self, model: nn.Module, tokenizer: Any, engine_config: EngineConfig | None = None,
                 device: torch.device | str | None = None) -> None:
        from tandemrl.engine.model_runner import ModelRunner  # lazy: the runner pulls in the attention kernels

        config = dataclasses.replace(engine_config) if engine_config is not None else EngineConfig()
        if config.max_model_len is None:
            limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
            config.max_model_len = int(limit) if limit else None
        config.validate()
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.runner = ModelRunner(model, self.device, config.block_size, max_model_len=config.max_model_len,
                                  enforce_eager=not config.cuda_graphs, compile_decode=config.compile_decode,
                                  fused_kernels=config.fused_kernels)
        if config.max_model_len is None:  # the runner's own limit (e.g. its RoPE table), so add() rejects early
            config.max_model_len = getattr(self.runner, "max_model_len", None)
        self.engine = LLMEngine(self.runner, tokenizer, config, eos_token_ids(model, tokenizer))
        self._closed = False

    def generate(self, requests: Sequence[Request], policy_version: int = 0) -> list[Rollout]:
        if self._closed:
            raise RuntimeError("EngineBackend.generate called after close()")
        if self.engine.is_asleep:
            raise RuntimeError("EngineBackend.generate called while asleep; call wake() first")
        reset_rng = getattr(self.runner, "reset_rng", None)
        if reset_rng is not None:  # seeded requests: each call starts its random stream afresh
            reset_rng()
        with sampling_mode(self.model), torch.no_grad():
            return self.engine.generate(requests, policy_version)

    def sleep(self) -> None:
        """Free the KV cache and CUDA graphs so the trainer can use the memory (it stays in PyTorch's allocator)."""
        if not self._closed:
            self.engine.sleep()

    def wake(self) -> None:
        if self._closed:
            raise RuntimeError("EngineBackend.wake called after close()")
        self.engine.wake()

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def close(self) -> None:
        if self._closed:
            return
        self.sleep()
        self._closed = True
        self.model = None  # type: ignore[assignment]  # the trainer owns the model; drop our references
        self.runner = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the freed cache back to the device

