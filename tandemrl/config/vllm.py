"""The vLLM backend's section (rollout.vllm) and the URL check of its server mode."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tandemrl.config.base import Section


class VLLMConfig(Section):
    """rollout.backend = "vllm": a colocated vllm.LLM in the trainer's process, or (mode = "server") a running vLLM
    OpenAI server driven over HTTP (see tandemrl/backends/vllm/)."""

    mode: Literal["colocated", "server"] = Field(
        "colocated", description="`colocated`: a `vllm.LLM` in the trainer's process; `server`: a vLLM OpenAI "
        "server you run, driven over HTTP")
    url: str | None = Field(None, description="server mode: the server's base URL, where `python -m "
                            "vllm.entrypoints.openai.api_server` listens, e.g. `\"http://127.0.0.1:8000\"`")
    weight_transfer: Literal["disk", "http"] = Field(
        "disk", description="server mode: how the weights reach the server. `disk`: a safetensors file in "
        "`rollout.vllm.weights_dir`, which vLLM reloads (same path on both sides); `http`: inside the request "
        "(needs the server's `--worker-extension-cls`; any host)")
    weights_dir: str | None = Field(None, description="`disk` transfer: a directory the trainer and the server see "
                                    "at the same path; unset: a temporary directory (the server must run on this "
                                    "host)")
    timeout_s: float = Field(600.0, gt=0.0, description="server mode: seconds one HTTP request may take")

    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0, description="share of GPU memory vLLM may take")
    cpu_kvcache_gib: int = Field(1, ge=1, description="KV cache on a CPU (VLLM_CPU_KVCACHE_SPACE wins if set)")
    enforce_eager: bool = Field(True, description="no CUDA graphs or compilation: a start of seconds, not "
                                "minutes (set false on a GPU for speed)")
    enable_prefix_caching: bool = Field(True, description="vLLM's prefix cache (emptied at every weight update)")
    max_model_len: int | None = Field(None, ge=1, description="longest prompt + completion; unset: the model's "
                                      "max_position_embeddings")
    probe_tokens: int = Field(32, ge=2, description="length of the fixed sequence that checks each weight update")
    probe_tolerance: float | None = Field(None, gt=0.0, description="largest log-prob difference the weight "
                                          "check accepts; unset: by dtype (float32 2e-3, float16 5e-2, bfloat16 0.2)")

    @model_validator(mode="after")
    def _check_server(self) -> VLLMConfig:
        if self.mode == "colocated":
            if self.url is not None:
                raise ValueError("rollout.vllm.url is set but rollout.vllm.mode = 'colocated'; set "
                                 "rollout.vllm.mode = 'server' to use the vLLM server at that URL")
            return self
        if not self.url:
            raise ValueError("rollout.vllm.mode = 'server' needs rollout.vllm.url (e.g. 'http://127.0.0.1:8000', "
                             "where `python -m vllm.entrypoints.openai.api_server` listens)")
        host = server_host(self.url)
        if self.weight_transfer == "disk" and self.weights_dir is None and host not in LOCAL_HOSTS:
            raise ValueError(f"rollout.vllm.weight_transfer = 'disk' with a server on {host!r}: set "
                             "rollout.vllm.weights_dir to a directory both hosts see at the same path, or use "
                             "rollout.vllm.weight_transfer = 'http'")
        return self


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def server_host(url: str) -> str:
    """The host of an http(s) URL; a clear error for anything else."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  # raises ValueError on a port that is not a number
        port_ok = True
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValueError(f"rollout.vllm.url = {url!r} is not an http(s) URL like 'http://127.0.0.1:8000'")
    return parts.hostname
