"""A RolloutBackend over tandemrl's own engine (paged KV cache, continuous batching, prefix sharing).

The model runner decodes with the trainer's own parameter tensors (no copy); this file only wires the model,
tokenizer and config into an ``LLMEngine`` and maps the backend protocol onto it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from tandemrl.backends.hf_backend import eos_token_ids, sampling_mode
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.engine import LLMEngine
from tandemrl.models.tensor_parallel import TensorParallelGroup, is_shard
from tandemrl.engine.speculative import DRAFT
from tandemrl.engine.step import TARGET
from tandemrl.engine.tandem import FROZEN
from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.tandem.config import TandemConfig
from tandemrl.types import Request, Rollout


class EngineBackend:
    """RolloutBackend (generate / sleep / wake / close) backed by ``LLMEngine`` and the model runner."""

    def __init__(self, model: nn.Module, tokenizer: Any, engine_config: EngineConfig | None = None,
                 device: torch.device | str | None = None, speculative: SpeculativeConfig | None = None,
                 draft_model: nn.Module | None = None, tandem: TandemConfig | None = None,
                 frozen_model: nn.Module | None = None,
                 tensor_parallel: TensorParallelGroup | None = None) -> None:
        from tandemrl.engine.model.runner import ModelRunner  # lazy: the runner pulls in the attention kernels

        config = dataclasses.replace(engine_config) if engine_config is not None else EngineConfig()
        if config.max_model_len is None:
            limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
            config.max_model_len = int(limit) if limit else None
        config.validate()
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        speculative = speculative or SpeculativeConfig()
        if (speculative.method == DRAFT) != (draft_model is not None):
            raise ValueError("speculative.method = 'draft' needs a draft model, and a draft model needs that method; "
                             f"got method {speculative.method!r} and {'a' if draft_model is not None else 'no'} draft")
        tandem = tandem if tandem is not None and tandem.enabled else None
        if (tandem is None) != (frozen_model is None):
            raise ValueError("tandem rollouts need a frozen model, and a frozen model needs tandem.enabled")
        model, frozen_model = _tensor_parallel_models(config.tensor_parallel_size, model, frozen_model,
                                                      tensor_parallel)
        models = {TARGET: model, DRAFT: draft_model, FROZEN: frozen_model}
        self.runner = ModelRunner({name: m for name, m in models.items() if m is not None}, config, self.device)
        if tensor_parallel is not None and tensor_parallel.size > 1 and config.num_blocks is None:
            # every rank of the group schedules alike only over pools of one size: the smallest that fits
            fits = self.runner.num_blocks_that_fit(config.block_size, config.gpu_memory_utilization)
            config.num_blocks = tensor_parallel.min_int(fits, self.device)
            if config.num_blocks < 1:
                raise ValueError(f"no room for a KV cache on a rank of this engine's group (at "
                                 f"engine.gpu_memory_utilization = {config.gpu_memory_utilization}); raise it or set "
                                 "engine.num_blocks")
        if config.max_model_len is None:  # the runner's own limit (e.g. its RoPE table), so add() rejects early
            config.max_model_len = getattr(self.runner, "max_model_len", None)
        self.engine = LLMEngine(self.runner, tokenizer, config, eos_token_ids(model, tokenizer),
                                speculative=speculative.for_engine(),
                                tandem=tandem.for_engine(tokenizer) if tandem is not None else None,
                                device=self.device)
        self._closed = False

    @property
    def engine_model(self) -> nn.Module:
        """The model the engine decodes: ``model`` itself, or this rank's tensor-parallel shard of it."""
        return self.runner.target.model

    def generate(self, requests: Sequence[Request], policy_version: int = 0) -> list[Rollout]:
        with self.generating():
            return self.engine.generate(requests, policy_version)

    @contextlib.contextmanager
    def generating(self) -> Iterator[LLMEngine]:
        """The engine, ready to decode (eval mode, no autograd, seeded streams afresh): for callers that drive it
        request by request, like the agent loop (tandemrl/rollout/agent_loop.py)."""
        if self._closed:
            raise RuntimeError("EngineBackend.generate called after close()")
        if self.engine.is_asleep:
            raise RuntimeError("EngineBackend.generate called while asleep; call wake() first")
        reset_rng = getattr(self.runner, "reset_rng", None)
        if reset_rng is not None:  # seeded requests: each call starts its random stream afresh
            reset_rng()
        with sampling_mode(self.model), torch.no_grad():
            yield self.engine

    def sleep(self) -> None:
        """Free the KV cache so the trainer can use the memory (it stays in PyTorch's allocator); the CUDA graphs
        are parked and serve again after ``wake()`` if nothing they read has moved."""
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
        self.runner.free_kv_cache()  # the parked graphs too, now: left to the garbage collector they hold device memory
        self._closed = True
        self.model = None  # type: ignore[assignment]  # the trainer owns the model; drop our references
        self.runner = None  # type: ignore[assignment]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the freed cache back to the device



def _tensor_parallel_models(size: int, model: nn.Module, frozen: nn.Module | None, tp: TensorParallelGroup | None
                            ) -> tuple[nn.Module, nn.Module | None]:
    """``size``: engine.tensor_parallel_size, which must be the group's. Over a group of several ranks, this rank's
    shards of the policy (unless the trainer built it: distributed/tp_weights.py) and of tandem's frozen model (the
    whole one is then dropped); a draft model stays whole on every rank."""
    from tandemrl.models.tensor_parallel import shard_for_rank

    if size != (tp.size if tp is not None else 1):
        where = f"a group of {tp.size}" if tp is not None else "one rank"
        raise ValueError(f"engine.tensor_parallel_size = {size} needs a torchrun job whose ranks run the engine "
                         f"together (`torchrun --nproc-per-node N -m tandemrl train`); this engine runs on {where} "
                         "(set engine.tensor_parallel_size = 1 to run a whole engine in this process)")
    if tp is None or tp.size == 1:
        return model, frozen
    if not is_shard(model):
        model = shard_for_rank(model, tp)
    if frozen is not None and not is_shard(frozen):
        frozen = shard_for_rank(frozen, tp)
    return model, frozen
