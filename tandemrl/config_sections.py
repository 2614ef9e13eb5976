"""The config sections of the optional features (vLLM backend, tools, weight sync, inference-aware reward,
curriculum, multi-GPU) and the base every section shares; config.py assembles them into one Config."""

from __future__ import annotations

import dataclasses
import math
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, ValidatorFunctionWrapHandler,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="wrap")
    @classmethod
    def _plain_numbers(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        """Numbers are numbers: pydantic's lax mode would read `true` as 1 (lr = true trained at lr 1.0) and "0.5"
        as 0.5; and no setting here means anything at inf or nan. An int stays valid where a float is expected."""
        # a boolean is refused before the range checks, whose message ("should be >= 2 (got True)") would mislead
        early = isinstance(value, bool) and _takes_numbers_not_bools(cls.model_fields[info.field_name].annotation)
        problem = ((), value, "expected a number, not a boolean") if early else None
        result = None if early else handler(value)
        problem = problem or _coerced_number(value, result, ())
        if problem is not None:
            loc, got, message = problem
            raise ValidationError.from_exception_data(
                cls.__name__, [{"type": PydanticCustomError("plain_number", message), "loc": loc, "input": got}])
        return result


def _takes_numbers_not_bools(annotation: Any) -> bool:
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return bool not in members and any(m in (int, float) for m in members)


def _coerced_number(given: Any, result: Any, loc: tuple) -> tuple[tuple, Any, str] | None:
    """(where, the value, why) for the first number in `result` that was not a plain finite number in `given`.
    Walks lists, tuples, dicts and dataclass sections; a nested Section has checked itself."""
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        if isinstance(given, bool):
            return loc, given, "expected a number, not a boolean"
        if isinstance(given, (str, bytes)):
            return loc, given, "expected a number, not a string (write it without quotes)"
        if isinstance(result, float) and not math.isfinite(result):
            return loc, given, "expected a finite number"
        return None
    if isinstance(result, (list, tuple)) and isinstance(given, (list, tuple)) and len(given) == len(result):
        pairs = [(i, g, r) for i, (g, r) in enumerate(zip(given, result))]
    elif isinstance(result, dict) and isinstance(given, dict):
        pairs = [(k, given[k], r) for k, r in result.items() if k in given]
    elif dataclasses.is_dataclass(result) and isinstance(given, dict):
        pairs = [(f.name, given[f.name], getattr(result, f.name)) for f in dataclasses.fields(result) if f.name in given]
    else:
        return None
    for key, g, r in pairs:
        if (problem := _coerced_number(g, r, (*loc, key))) is not None:
            return problem
    return None


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


class ToolsConfig(Section):
    """Multi-turn tool calling (tandemrl/rollout/): on when ``names`` lists tools (a task may bring its own, see
    tandemrl/data/task_defaults.py), unless ``enabled = false``."""

    enabled: bool | None = Field(None, description="multi-turn tool calling; unset: on when `tools.names` lists "
                                 "tools (a task's defaults may name them)")
    names: list[str] = Field([], description="built-in tools the model may call: `python`, `calculator`, `peek`")
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


class InferenceRewardConfig(Section):
    """Serving cost in the reward: total = task score - latency*ms - tokens*generated - kv_mb*MB held
    + accept*acceptance rate + cache_reuse*prefix-cache hit ratio. All 0 (the default) = plain GRPO. The
    inference_aware_grpo_training seed's values: 0.001, 0.001, 0.01, 1.0, 0.5."""

    latency: float = Field(0.0, ge=0.0, description="alpha: penalty per millisecond of request latency")
    tokens: float = Field(0.0, ge=0.0, description="beta: penalty per generated token")
    kv_mb: float = Field(0.0, ge=0.0, description="gamma: penalty per MB of KV cache the request held at its peak")
    accept: float = Field(0.0, ge=0.0, description="delta: bonus per unit of speculative acceptance rate")
    cache_reuse: float = Field(0.0, ge=0.0, description="epsilon: bonus per unit of prefix-cache hit ratio")


class CurriculumConfig(Section):
    """Adaptive curriculum: a per-sample reward EMA, KDE valleys split the samples into difficulty buckets after
    each epoch, harder buckets get more rollouts per prompt. Defaults are the inference_aware_grpo_training seed's."""

    enabled: bool = Field(False, description="spend more rollouts on the prompts the model gets wrong")
    ema_decay: float = Field(0.7, ge=0.0, lt=1.0, description="ema = decay*ema + (1-decay)*epoch mean")
    unseen_reward: float = Field(0.5, description="the EMA of a sample not yet rolled out")
    normalize: Literal["minmax", "clip"] = Field("minmax", description="`minmax`: rescale the EMAs to [0, 1]; "
                                                 "`clip`: clamp them to [0, 1]")
    bandwidth: float | Literal["scott", "silverman"] = Field(
        "scott", description="scipy gaussian_kde's bw_method: `scott`, `silverman` or a factor of the data's std. "
        "The seed's code uses 0.05, which on a few hundred samples makes a wiggly density whose noise valleys "
        "split even a unimodal set")
    grid_points: int = Field(512, ge=3, description="points of the KDE grid over [0, 1]")
    min_bucket_fraction: float = Field(0.05, ge=0.0, lt=0.5, description="a valley leaving a smaller bucket is skipped")
    n_buckets: int = Field(3, ge=1, description="at most this many buckets (n_buckets - 1 valleys as boundaries)")
    base_rollouts: int = Field(4, ge=1, description="rollouts per prompt of the easiest bucket, before `alpha`")
    alpha: float = Field(1.5, ge=0.0, description="rollouts = max(1, round(base*(1 + alpha*(1 - bucket mean))))")
    min_samples: int = Field(8, ge=2, description="fewer samples than this: one bucket")

    @model_validator(mode="after")
    def _check_bandwidth(self) -> CurriculumConfig:
        if isinstance(self.bandwidth, float) and self.bandwidth <= 0:
            raise ValueError(f"curriculum.bandwidth must be > 0, 'scott' or 'silverman', got {self.bandwidth}")
        return self


class DistributedConfig(Section):
    """Multi-process runs under torchrun (read only when torchrun's RANK / WORLD_SIZE are set)."""

    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="the process group's backend; `auto`: "
                                                     "`nccl` on CUDA, `gloo` on CPU")
    timeout_s: float = Field(600.0, gt=0.0, description="seconds a collective waits for a rank that is alive but "
                             "stuck before the job fails (NCCL's watchdog and gloo alike); it must cover the longest "
                             "legitimate wait: one rank's rollouts running longer than another's, rank 0 writing a "
                             "checkpoint's full weights alone")
    heartbeat_timeout_s: float = Field(60.0, gt=0.0, description="a rank whose heartbeat (a thread beating into "
                                       "torchrun's store) stops for this long is dead, frozen or cut off: the other "
                                       "ranks end the job, naming it")
    strategy: Literal["auto", "replicate", "shard"] = Field(
        "auto", description="how ranks hold the model: `replicate` (a full copy per rank, gradients all-reduced "
        "once per optimizer step, the engine reads the trained tensors in place), `shard` (FSDP2, the engine "
        "decodes a full replica refreshed by all-gather after each update), `auto`: replicate when weights, "
        "gradients, AdamW states and a margin fit the GPU's memory (always on the CPU), else shard; LoRA always "
        "replicates")
