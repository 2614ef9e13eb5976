"""The engine's knobs, validated with errors that name the bad field."""

from __future__ import annotations

from dataclasses import dataclass, field

KV_CACHE_DTYPES = ("auto", "fp8_e4m3")  # engine.kv_cache_dtype: the model's dtype, or float8 e4m3 (scale 1.0)


@dataclass
class EngineConfig:
    """How the rollout engine sizes its KV cache and its batches; each field says what it does.

    The main config nests this class as its ``engine`` section (validated there by pydantic, which reads the field
    types; ``__pydantic_config__`` makes an unknown key an error), and it reaches the engine and the model runner
    whole.
    """

    __pydantic_config__ = {"extra": "forbid"}

    block_size: int = field(default=16, metadata={"description": "tokens per KV-cache block"})
    num_blocks: int | None = field(default=None, metadata={
        "description": "KV-cache blocks; unset: sized from `engine.gpu_memory_utilization` (on CPU, the runner's "
                       "own default), at most what `engine.max_num_seqs` sequences of `engine.max_model_len` tokens "
                       "hold"})
    gpu_memory_utilization: float = field(default=0.3, metadata={
        "description": "share of the GPU's memory the KV cache may take when `engine.num_blocks` is unset"})
    max_num_seqs: int = field(default=256, metadata={"description": "sequences running at once at most"})
    max_num_batched_tokens: int = field(default=16384, metadata={
        "description": "tokens computed by one prefill step at most (prefix-cache hits are free); a single "
                       "longer sequence still runs, alone in its step"})
    enable_prefix_caching: bool = field(default=True, metadata={
        "description": "reuse the KV blocks of a prefix already computed: the samples of one prompt prefill it "
                       "once"})
    cuda_graphs: bool = field(default=True, metadata={
        "description": "replay decode forwards as CUDA graphs, one per batch size (CUDA only)"})
    decode_steps: int = field(default=32, metadata={
        "description": "decode steps run back to back per engine step, each step's tokens fed to the next on the "
                       "device: the host schedules, stages inputs and checks stop conditions once per burst. A "
                       "sequence that finishes inside a burst wastes at most decode_steps - 1 tokens of compute; "
                       "waiting requests join at the next burst. On an H100 16 was 2-5 % faster per token than 8 "
                       "at batches 1-256, and 32 another 5 % at batch 256 (bench/RESULTS.md)"})
    async_scheduling: bool = field(default=True, metadata={
        "description": "launch each step before reading back the previous one's tokens, so the host's scheduling "
                       "and postprocessing overlap the device's work; a sequence stopped by EOS or a stop string "
                       "may compute one burst more than it needed (dropped)"})
    max_model_len: int | None = field(default=None, metadata={
        "description": "longest prompt + completion; unset: no limit beyond the pool's size (the backend fills in "
                       "the model's own)"})
    kv_cache_dtype: str = field(default="auto", metadata={
        "description": "KV-cache element type: `auto` (the model's dtype) or `fp8_e4m3` (float8 e4m3, half the "
                       "bytes of bf16: twice the tokens in the same memory and half the KV read per decode step; "
                       "values stored with scale 1.0, clamped to +-448, so log-probs drift slightly from bf16, "
                       "see docs/engine.md)"})
    fused_kernels: bool = field(default=True, metadata={
        "description": "Triton kernels for RMSNorm + residual add, RoPE and the SiLU product (CUDA with Triton "
                       "only; on CPU torch ops)"})
    tensor_parallel_size: int = field(default=1, metadata={
        "description": "ranks of a torchrun job that run one engine together, each holding 1/N of the attention "
                       "heads, KV heads, MLP columns and vocabulary (its KV cache split by KV heads); must divide "
                       "the job's processes and the model's heads (docs/multi-gpu.md). 1: every rank runs its own "
                       "engine over the whole model"})

    def validate(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "decode_steps",
                     "tensor_parallel_size", "max_model_len"):
            value = getattr(self, name)
            if value is None and name in ("num_blocks", "max_model_len"):  # sized from memory / no limit
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"EngineConfig.gpu_memory_utilization must be in (0, 1], "
                             f"got {self.gpu_memory_utilization}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # a decode step computes one token per running sequence; it must fit the budget
            raise ValueError(f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({self.max_num_seqs})")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"EngineConfig.kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        for name in ("enable_prefix_caching", "cuda_graphs", "async_scheduling", "fused_kernels"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EngineConfig.{name} must be a bool, got {getattr(self, name)!r}")
