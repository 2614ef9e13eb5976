"""How rollouts are sampled: the backend and its sampling settings, multi-turn tools, and how the trainer's weights
reach a separate sampling process."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tandemrl.config.base import Section, check_dataclass_section
from tandemrl.config.vllm import VLLMConfig
from tandemrl.speculative.config import SpeculativeConfig


class RolloutConfig(Section):
    """How rollouts are sampled: the backend, the batch of each step and the sampling settings."""

    backend: Literal["engine", "hf", "server", "vllm"] = Field(
        "engine", description="`engine`: tandemrl's engine (paged KV cache, prefix sharing, CUDA graphs; Qwen2/2.5, "
        "Qwen3, Llama, Mistral, other architectures fall back to `hf`); `hf`: plain batched decoding; `server`: a "
        "`tandemrl serve` process at `rollout.server_url`; `vllm`: vLLM (`rollout.vllm.*`)")
    server_url: str | None = Field(None, description="the server backend: base URL of `tandemrl serve`, e.g. "
                                   "`\"http://127.0.0.1:8000\"`")
    mode: Literal["sync", "async"] = Field(
        "sync", description="`sync`: each step samples its rollouts, then updates; `async`: a rollout worker "
        "thread samples the next batches (at most `rollout.max_staleness` versions ahead) while the trainer "
        "updates: see [asynchronous RL](async.md)")
    max_staleness: int = Field(0, ge=0, description="the most versions the weights that sampled a rollout may be "
                               "behind the trainer's when it is used: the server backend refuses older ones, "
                               "`rollout.mode = \"async\"` drops them (and samples at most this many batches "
                               "ahead); 0 = on-policy")
    env_port: int | None = Field(None, ge=0, le=65535, description="`rollout.mode = \"async\"` with "
                                 "`rollout.backend = \"server\"`: take the groups from environment processes "
                                 "(`python -m tandemrl.envs`) that push them to this port of 127.0.0.1 (0: a free "
                                 "one, printed at the start) instead of sampling them itself")
    async_device: str | None = Field(None, description="`rollout.mode = \"async\"`: the device of the rollout "
                                     "worker's copy of the weights, e.g. `\"cuda:1\"`; unset: the trainer's")
    server_retries: int = Field(3, ge=0, description="attempts after the first when the server does not answer")
    server_backoff_s: float = Field(2.0, ge=0.0, description="wait before the first retry; doubles each time")
    server_timeout_s: float = Field(600.0, gt=0.0, description="seconds one rollout request may take")
    prompts_per_step: int = Field(16, ge=1, description="prompts drawn per step; each is sampled "
                                  "`rollout.group_size` times")
    group_size: int = Field(8, ge=2, description="samples per prompt; GRPO needs at least 2")
    max_tokens: int = Field(3, ge=1, description="most tokens generated per completion")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling: keep the smallest set of tokens whose "
                         "probability reaches top_p (1 = off)")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens (0 = off)")
    stop: list[str] = Field([], description="strings that end a completion")
    ignore_eos: bool = Field(False, description="keep generating past the end-of-sequence token, up to "
                             "`rollout.max_tokens`")
    max_batch_size: int = Field(256, ge=1, description="the `hf` backend: sequences decoded together at most")
    speculative: SpeculativeConfig = SpeculativeConfig()
    vllm: VLLMConfig = VLLMConfig()

    @model_validator(mode="after")
    def _check_speculative(self) -> RolloutConfig:
        spec = self.speculative
        check_dataclass_section(spec, "speculative.", "rollout.speculative.")
        if spec.method == "draft" and not spec.draft_model:
            raise ValueError("rollout.speculative.method = 'draft' needs rollout.speculative.draft_model "
                             "(a hub id or a local directory)")
        if spec.enabled and self.backend != "engine":
            raise ValueError("rollout.speculative needs rollout.backend = 'engine'")
        if spec.enabled and self.temperature > 0 and (self.top_p < 1 or self.top_k > 0):
            raise ValueError("rollout.speculative samples with temperature only (the rejection rule): unset "
                             "rollout.top_p and rollout.top_k")
        return self


class ToolsConfig(Section):
    """Multi-turn tool calling (tandemrl/rollout/): on when ``names`` lists tools (a task may bring its own, see
    tandemrl/data/task_defaults.py), unless ``enabled = false``."""

    enabled: bool | None = Field(None, description="multi-turn tool calling; unset: on when `tools.names` lists "
                                 "tools (a task's defaults may name them)")
    names: list[str] = Field([], description="tools the model may call: built in (`python`, `calculator`, `peek`) "
                             "or your own typed, documented function as `package.module:function` or "
                             "`path/to/file.py:function` (docs/tools.md)")
    format: Literal["hermes", "plain"] = Field(
        "hermes", description="`hermes`: `<tool_call>{json}</tool_call>` blocks (Qwen2.5/Qwen3/Hermes chat "
        "templates); `plain`: `call_open name arguments call_close`, for base models")
    call_open: str = Field("<call>", min_length=1, description="the plain format: the marker that opens a call")
    call_close: str = Field("</call>", description="the plain format: the marker that closes a call (the turn "
                            "stops there); empty: the opener alone is a call of the only tool")
    result_open: str = Field("<result>", description="the plain format: the text before a tool's result")
    result_close: str = Field("</result>\n", description="the plain format: the text after a tool's result")
    max_turns: int = Field(8, ge=1, description="generation turns per trajectory")
    max_tool_calls: int = Field(8, ge=1, description="tool calls per trajectory")
    max_total_tokens: int = Field(1024, ge=1, description="completion tokens per trajectory, tool output included")
    max_concurrent_calls: int = Field(64, ge=1, description="tool calls running at once (threads)")
    max_result_chars: int = Field(4000, ge=1, description="a tool result longer than this is cut to its start, "
                                  "with a note saying so")
    sandbox: Literal["bwrap", "none"] = Field(
        "bwrap", description="the Python sandbox's isolation: bwrap = bubblewrap namespaces, a read-only root, no "
        "network (needs the bubblewrap package and user namespaces); none = unsandboxed, logged as a warning "
        "(trusted code only)")
    sandbox_timeout_s: float = Field(5.0, gt=0.0, description="the Python sandbox: wall-clock seconds per call "
                                     "(then its process group is killed)")
    sandbox_cpu_s: int = Field(5, ge=1, description="the Python sandbox: CPU seconds per call")
    sandbox_memory_mb: int = Field(512, ge=64, description="the Python sandbox: address space in MB")
    sandbox_max_file_mb: int = Field(4, ge=1, description="the Python sandbox: largest file it may write, in MB "
                                     "(stdout and stderr included)")
    sandbox_max_output_chars: int = Field(2000, ge=1, description="the Python sandbox: output returned to the "
                                          "model is cut to this many characters")

    @property
    def active(self) -> bool:
        """Rollouts are multi-turn: ``enabled``, or when unset, some tools are named."""
        return self.enabled if self.enabled is not None else bool(self.names)


class SyncConfig(Section):
    """How the trainer's weights reach the process that samples its rollouts (tandemrl.sync)."""

    kind: Literal["inprocess", "checkpoint", "lora", "ipc", "nccl"] = Field(
        "inprocess", description="`inprocess`: the engine decodes with the trainer's own tensors (nothing to push); "
        "with `rollout.backend = \"server\"`: `checkpoint` (full weights on disk), `lora` (the adapter only), "
        "`ipc` (CUDA IPC, same GPU) or `nccl` (broadcast to another GPU)")
    dir: str | None = Field(None, description="`checkpoint`: where the pushed checkpoints go; unset: "
                            "`<run dir>/sync`")
    nccl_init_method: str | None = Field(None, description="`nccl`: the rendezvous the trainer and the server "
                                         "join, e.g. `\"tcp://127.0.0.1:29511\"`")
    nccl_backend: Literal["nccl", "gloo"] = Field("nccl", description="`nccl`: the torch.distributed backend of "
                                                  "the broadcast (`gloo` on CPU)")
    nccl_bucket_mb: float = Field(256.0, ge=0.001, description="`nccl`: the parameters travel in buckets of this "
                                  "many MiB (the trainer holds one bucket beyond its weights)")
