"""The policy model's section and its LoRA adapter."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tandemrl.config.base import Section


class LoraConfig(Section):
    """LoRA through peft (the `lora` extra): only the adapter's weights train; the base model stays frozen."""

    enabled: bool = Field(False, description="train a LoRA adapter instead of every weight")
    rank: int = Field(16, ge=1, description="the adapter's rank r")
    alpha: int = Field(32, ge=1, description="LoRA alpha: the adapter's output is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="names of the linear modules that get an adapter (default: every linear layer of a "
                    "Qwen/Llama-style decoder block)")


class ModelConfig(Section):
    """The policy model: the model that is trained and, with the default backend, samples the rollouts."""

    name_or_path: str = Field("tiny", description="hub id, local directory, or a llama.cpp `.gguf` file "
                              "(dequantised into a plain trainable model; the `gguf` extra); `\"tiny\"` builds the "
                              "project's offline Qwen2-architecture model into `model.tiny_dir` on first use")
    tiny_dir: str = Field("runs/tiny-model", description="where `\"tiny\"` is built (and reused once it exists)")
    tiny_seed: int = Field(0, description="seed of the tiny model's random initialisation")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="`auto`: bfloat16 on CUDA (float32 where the GPU has no bfloat16), float32 on CPU")
    device: str = Field("auto", description="`auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N`")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: less "
                                         "memory, more time")
    attn_implementation: str | None = Field(None, description="passed to transformers' `from_pretrained` (e.g. "
                                            "`sdpa`, `eager`, `flex_attention`), or `varlen`: tandemrl's packed "
                                            "attention through torch's varlen_attn (flash attention on CUDA, no "
                                            "compilation; see docs/update.md); unset: transformers' choice")
    trust_remote_code: bool = Field(False, description="let transformers run model and tokenizer code from the "
                                    "model's repository")
    compile: bool = Field(False, description="compile the training forward with torch.compile, decoder layer by "
                          "decoder layer (regional compilation, shapes dynamic: one compile for all micro-batch "
                          "lengths; generation stays eager; single-process runs only; see docs/update.md)")
    cpu_threads: int | None = Field(None, ge=1, description="torch's CPU threads; unset: 1 for models under 50M "
                                    "parameters (a tiny model's operators are too small to split, and spinning "
                                    "threads crawl when another process holds a core), else torch's default")
    lora: LoraConfig = LoraConfig()
