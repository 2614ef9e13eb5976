"""The root Config: every section of a run, and the checks that read more than one section."""

from __future__ import annotations

from pydantic import model_validator

from tandemrl.config.base import Section, check_dataclass_section
from tandemrl.config.data import CurriculumConfig, DataConfig
from tandemrl.config.effects import check_effects, preset_keys
from tandemrl.config.model import ModelConfig
from tandemrl.config.reward import RewardConfig
from tandemrl.config.rollout import RolloutConfig, SyncConfig, ToolsConfig
from tandemrl.config.training import CheckpointConfig, DistributedConfig, EvalConfig, LogConfig, TrainConfig
from tandemrl.engine.config import EngineConfig
from tandemrl.tandem.config import TandemConfig


class Config(Section):
    """Every setting of a run, section by section (docs/configuration.md lists each key). Build it with
    :func:`load_config` (a TOML file and ``section.key=value`` overrides) or pass a dict to ``Trainer(config=...)``."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    engine: EngineConfig = EngineConfig()
    tandem: TandemConfig = TandemConfig()
    tools: ToolsConfig = ToolsConfig()
    sync: SyncConfig = SyncConfig()
    reward: RewardConfig = RewardConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    distributed: DistributedConfig = DistributedConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _check_engine(self) -> Config:
        check_dataclass_section(self.engine, "EngineConfig.", "engine.")
        return self

    @model_validator(mode="after")
    def _check_tandem(self) -> Config:
        if not self.tandem.enabled:
            return self
        check_dataclass_section(self.tandem, "TandemSelectorConfig.", "tandem.")
        if self.rollout.backend != "engine" or self.rollout.speculative.enabled:
            raise ValueError("tandem.enabled needs rollout.backend = 'engine' and no rollout.speculative")
        return self

    @model_validator(mode="after")
    def _check_vllm(self) -> Config:
        if self.rollout.backend == "vllm" and self.model.lora.enabled:
            raise ValueError("rollout.backend = 'vllm' does not take LoRA adapters yet (model.lora.enabled); "
                             "use rollout.backend = 'engine'")
        return self

    @model_validator(mode="after")
    def _check_tools(self) -> Config:
        from tandemrl.rollout.catalog import BUILTIN_TOOLS, tool_name_error  # stdlib and pydantic only

        for name in self.tools.names:
            error = tool_name_error(name)
            if error is not None:
                raise ValueError(error)
        if not self.tools.active:
            return self
        if not self.tools.names:
            raise ValueError(f"tools.enabled = true but tools.names is empty (built-in tools: "
                             f"{', '.join(BUILTIN_TOOLS)})")
        if self.rollout.backend not in ("engine", "server"):
            raise ValueError("tools (multi-turn rollouts) need rollout.backend = 'engine' or 'server': the agent loop "
                             "drives the engine, or the server, request by request")
        if self.tandem.enabled or self.rollout.speculative.enabled:
            raise ValueError("tools cannot be combined with tandem.enabled or rollout.speculative yet")
        return self

    @model_validator(mode="after")
    def _check_server(self) -> Config:
        rollout, kind = self.rollout, self.sync.kind
        if rollout.backend != "server":
            if kind != "inprocess":
                raise ValueError(f"sync.kind = {kind!r} pushes weights to a separate server: it needs "
                                 "rollout.backend = 'server' (and rollout.server_url)")
            return self
        if not rollout.server_url:
            raise ValueError("rollout.backend = 'server' needs rollout.server_url (e.g. 'http://127.0.0.1:8000', "
                             "where `tandemrl serve` listens)")
        if kind == "inprocess":
            raise ValueError("rollout.backend = 'server' samples in another process: sync.kind must be one of "
                             "'checkpoint', 'lora', 'ipc', 'nccl' ('inprocess' only works with the engine here)")
        if kind == "lora" and not self.model.lora.enabled:
            raise ValueError("sync.kind = 'lora' pushes a LoRA adapter: set model.lora.enabled = true")
        if kind == "checkpoint" and self.model.lora.enabled:
            raise ValueError("sync.kind = 'checkpoint' pushes full weights; with model.lora.enabled use sync.kind = "
                             "'lora'")
        if kind == "nccl" and not (self.sync.nccl_init_method or "").startswith("tcp://"):
            raise ValueError("sync.kind = 'nccl' needs sync.nccl_init_method = 'tcp://HOST:PORT' (e.g. "
                             "'tcp://127.0.0.1:29511'), where the trainer hosts the group's store")
        if rollout.speculative.enabled or self.tandem.enabled:
            raise ValueError("rollout.backend = 'server' does not run speculative or tandem rollouts yet")
        return self

    @model_validator(mode="after")
    def _check_async(self) -> Config:
        rollout = self.rollout
        if rollout.mode != "async":
            return self
        if rollout.backend not in ("engine", "server"):
            raise ValueError(f"rollout.mode = 'async' samples with its own engine or from a `tandemrl serve` "
                             f"server: set rollout.backend = 'engine' or 'server' (got {rollout.backend!r})")
        if rollout.speculative.enabled or self.tandem.enabled:
            raise ValueError("rollout.mode = 'async' does not run speculative or tandem rollouts yet")
        if rollout.env_port is not None and rollout.backend != "server":
            raise ValueError("rollout.env_port takes groups from environments that sample from a server: set "
                             "rollout.backend = 'server' and rollout.server_url (the trainer pushes its weights there)")
        return self

    @model_validator(mode="after")
    def _check_inference_reward(self) -> Config:
        """A non-zero weight needs the telemetry its term is made of."""
        weights, engine = self.reward.inference, self.rollout.backend == "engine"
        if weights.accept and not self.rollout.speculative.enabled:
            raise ValueError("reward.inference.accept needs speculative decoding (rollout.speculative.method): "
                             "without a draft there is no acceptance rate")
        if weights.kv_mb and not engine:
            raise ValueError("reward.inference.kv_mb needs rollout.backend = 'engine': the hf backend holds no "
                             "KV blocks to measure")
        if weights.cache_reuse and not (engine and self.engine.enable_prefix_caching):
            raise ValueError("reward.inference.cache_reuse needs rollout.backend = 'engine' with "
                             "engine.enable_prefix_caching = true: otherwise there is no cache reuse to measure")
        if self.eval.early_stop_patience and not self.eval.every_epochs:
            raise ValueError("eval.early_stop_patience counts epoch evaluations: set eval.every_epochs too")
        return self

    @model_validator(mode="after")
    def _check_batching(self) -> Config:
        samples = self.rollout.prompts_per_step * self.rollout.group_size
        if samples % self.train.mini_batches:
            raise ValueError(
                f"train.mini_batches={self.train.mini_batches} must divide rollout.prompts_per_step * "
                f"rollout.group_size = {samples}"
            )
        return self

    @model_validator(mode="after")
    def _check_effects(self) -> Config:
        """Last: a key that is set but has no effect (its section switched off) is an error naming what to set."""
        check_effects(self, preset_keys(self))
        return self
