"""One typed config: a TOML file plus `--set section.key=value` overrides, validated before any work starts."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config problem, phrased for the user: names the key and what would be valid."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(Section):
    enabled: bool = False
    rank: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class ModelConfig(Section):
    # "tiny" builds the project's offline Qwen2-architecture model into `tiny_dir` on first use.
    name_or_path: str = "tiny"
    tiny_dir: str = "runs/tiny-model"
    tiny_seed: int = 0
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    gradient_checkpointing: bool = False
    attn_implementation: str | None = None
    trust_remote_code: bool = False
    lora: LoraConfig = LoraConfig()


class DataConfig(Section):
    task: str = "synthetic:add"  # "gsm8k" or "synthetic:<add|copy|add2>"
    path: str | None = None  # local dir/file for gsm8k; None = the hub dataset
    train_split: str = "train"
    test_split: str = "test"
    train_limit: int | None = Field(None, ge=1)
    use_chat_template: bool = False
    system_prompt: str | None = None


class RolloutConfig(Section):
    backend: Literal["engine", "hf"] = "engine"  # engine: paged KV cache; hf: plain batched decoding
    prompts_per_step: int = Field(16, ge=1)
    group_size: int = Field(8, ge=2, description="samples per prompt; GRPO needs at least 2")
    max_tokens: int = Field(3, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    stop: list[str] = []
    ignore_eos: bool = False
    max_batch_size: int = Field(256, ge=1)


class EngineSection(Section):
    """The paged rollout engine (rollout.backend = "engine")."""

    block_size: int = Field(16, ge=1)
    num_blocks: int | None = Field(None, ge=1, description="KV blocks; None = gpu_memory_utilization of the GPU")
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(16384, ge=1)
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True
    decode_steps: int = Field(32, ge=1, description="decode steps per engine step: host work once per burst")
    async_scheduling: bool = True  # launch each step before reading back the previous one's tokens
    fused_kernels: bool = True  # Triton add+RMSNorm, RoPE and SiLU*mul in decode (CUDA only)
    compile_decode: bool = False  # experimental: torch.compile the decode forward before graph capture


class RewardConfig(Section):
    # name (registered, or "package.module:function") -> weight
    weights: dict[str, float] = {"accuracy": 1.0}


class TrainConfig(Section):
    max_steps: int = Field(800, ge=1)
    seed: int = 0
    lr: float = Field(1e-3, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    adam_betas: tuple[float, float] = (0.9, 0.99)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    advantage: str = "grpo"
    policy_loss: str = "grpo"
    aggregation: str = "token-mean"
    eps_low: float = Field(0.2, ge=0.0)
    eps_high: float = Field(0.2, ge=0.0)
    kl_beta: float = Field(0.0, ge=0.0)
    epochs_per_batch: int = Field(1, ge=1)
    mini_batches: int = Field(1, ge=1)
    micro_batch_size: int = Field(64, ge=1)
    logprob_chunk_size: int = Field(1024, ge=1, description="tokens per lm_head chunk when computing log-probs")
    max_nonfinite_steps: int = Field(3, ge=1)


class EvalConfig(Section):
    every_steps: int = Field(0, ge=0)  # 0 = only before the first and after the last update
    limit: int | None = Field(200, ge=1)
    pass_k: int = Field(4, ge=0)  # samples per prompt for pass@k; 0 disables
    temperature: float = Field(1.0, ge=0.0)
    batch_size: int = Field(256, ge=1)


class CheckpointConfig(Section):
    every_steps: int = Field(200, ge=0)  # 0 = only at the end
    keep_last: int = Field(2, ge=1)


class LogConfig(Section):
    out_dir: str | None = None  # None = runs/<task>-<timestamp>
    tensorboard: bool = True
    wandb_project: str | None = None


class Config(Section):
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    engine: EngineSection = EngineSection()
    reward: RewardConfig = RewardConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _check_batching(self) -> Config:
        samples = self.rollout.prompts_per_step * self.rollout.group_size
        if samples % self.train.mini_batches:
            raise ValueError(
                f"train.mini_batches={self.train.mini_batches} must divide rollout.prompts_per_step * "
                f"rollout.group_size = {samples}"
            )
        return self


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a TOML file (optional), apply `a.b=c` overrides, validate everything."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(Path(path))
    for item in overrides or []:
        _apply_override(raw, item)
    return validate_config(raw)


def validate_config(raw: dict[str, Any]) -> Config:
    _check_registered_names(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def config_to_toml(cfg: Config) -> str:
    """Resolved config as TOML (None values are left out: TOML has no null)."""
    lines: list[str] = []
    _emit_table(cfg.model_dump(), [], lines)
    return "\n".join(lines).strip() + "\n"


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects section.key=value, got {item!r}")
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item!r}: {part!r} is a value, not a section")
    node[parts[-1]] = _parse_value(text.strip())


def _parse_value(text: str) -> Any:
    """TOML literal if it parses (3, 1e-4, true, [..], "x"), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _check_registered_names(raw: dict[str, Any]) -> None:
    # Imported here: algorithm registries pull in torch, which the config module itself should not need.
    from tandemrl.algo.advantages import ADVANTAGES
    from tandemrl.algo.losses import AGGREGATIONS, POLICY_LOSSES

    train = raw.get("train", {})
    if not isinstance(train, dict):
        return
    for key, registry in (("advantage", ADVANTAGES), ("aggregation", AGGREGATIONS), ("policy_loss", POLICY_LOSSES)):
        if key in train and train[key] not in registry.names():
            raise ConfigError(
                f"train.{key} = {train[key]!r} is not known; valid choices: {', '.join(registry.names())}"
            )


def _describe(err: ValidationError) -> str:
    messages = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] == "extra_forbidden":
            messages.append(_unknown_key_message(e["loc"]))
        else:
            messages.append(f"{key}: {e['msg']} (got {e.get('input')!r})")
    return "invalid config:\n  " + "\n  ".join(messages)


def _unknown_key_message(loc: tuple[Any, ...]) -> str:
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            break
        model = field.annotation
    valid = list(model.model_fields)
    key = ".".join(str(p) for p in loc)
    hint = difflib.get_close_matches(str(loc[-1]), valid, n=1)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"unknown config key {key!r}{suggestion}; valid keys here: {', '.join(valid)}"


def _emit_table(table: dict[str, Any], prefix: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    sections = {k: v for k, v in table.items() if isinstance(v, dict)}
    if prefix and (scalars or not sections):
        lines.append(f"\n[{'.'.join(prefix)}]")
    for key, value in scalars.items():
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in sections.items():
        _emit_table(value, prefix + [key], lines)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")
