"""The engine's knobs, validated with errors that name the bad field."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """How the rollout engine sizes its KV cache and its batches.

    ``num_blocks=None`` lets the model runner size the cache: a ``gpu_memory_utilization`` share of the GPU
    (on CPU, the runner's own default). ``max_num_batched_tokens`` bounds the tokens COMPUTED by one prefill
    step (prefix-cache hits are free); a single sequence longer than it still runs, alone in its step.
    ``max_model_len=None`` means no limit beyond the pool's size (the backend fills in the model's own).
    """

    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_utilization: float = 0.3
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True
    # Decode steps run back to back per engine step (the sampled tokens feed the next step on the device): the host
    # schedules, stages inputs and checks stop conditions once per burst. A sequence that finishes inside a burst
    # wastes at most decode_steps - 1 tokens of compute; waiting requests join at the next burst. On an H100 16 was
    # 2-5 % faster per token than 8 at batches 1-256, and 32 another 5 % at batch 256 (the host's work per burst,
    # ~2-3 ms for 256 sequences, leaves the GPU idle; bench/RESULTS.md).
    decode_steps: int = 32
    # Launch each step before reading back the previous one's tokens (engine.py): the host's scheduling and
    # postprocessing overlap the device's work. A sequence stopped by EOS or a stop string may compute one burst
    # more than it needed (dropped).
    async_scheduling: bool = True
    # torch.compile the graphed decode forward (CUDA only). Off by default: on torch 2.11 inductor fails on the
    # Triton paged-decode launcher and the fallback (attention outside the compiled graph) was slower (H100, 2026-11-22).
    compile_decode: bool = False
    max_model_len: int | None = None
    # Triton kernels for RMSNorm + residual add, RoPE and the SiLU product (CUDA with Triton only; CPU: torch ops).
    fused_kernels: bool = True

    def validate(self) -> None:
        _positive_int("block_size", self.block_size)
        if self.num_blocks is not None:
            _positive_int("num_blocks", self.num_blocks)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"EngineConfig.gpu_memory_utilization must be in (0, 1], "
                             f"got {self.gpu_memory_utilization}")
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive_int("decode_steps", self.decode_steps)
        if self.max_num_batched_tokens < self.max_num_seqs:
            # a decode step computes one token per running sequence; it must fit the budget
            raise ValueError(f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({self.max_num_seqs})")
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        for name in ("enable_prefix_caching", "cuda_graphs", "async_scheduling", "compile_decode", "fused_kernels"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EngineConfig.{name} must be a bool, got {getattr(self, name)!r}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")
