"""One typed config: a TOML file plus `--set section.key=value` overrides, validated before any work starts.

The public entry: ``from tandemrl.config import Config, load_config, TrainConfig`` and the rest of the names below.
Where each part lives:

- ``base``: what every section shares (unknown keys are errors, numbers are plain finite numbers)
- ``model``, ``data``, ``rollout``, ``vllm``, ``reward``, ``training``: the sections, by the part of a run they set
- ``root``: the root ``Config`` and the checks that read more than one section; ``effects``: keys set to no effect
- ``loading``: TOML in, ``--set`` overrides, error messages that name the key; ``to_toml``: TOML out
"""

from __future__ import annotations

from tandemrl.config.base import Section
from tandemrl.config.data import CurriculumConfig, DataConfig
from tandemrl.config.loading import ConfigError, load_config, validate_config
from tandemrl.config.model import LoraConfig, ModelConfig
from tandemrl.config.reward import InferenceRewardConfig, RewardConfig
from tandemrl.config.rollout import RolloutConfig, SyncConfig, ToolsConfig
from tandemrl.config.root import Config
from tandemrl.config.to_toml import config_to_toml, toml_literal
from tandemrl.config.training import CheckpointConfig, DistributedConfig, EvalConfig, LogConfig, TrainConfig
from tandemrl.config.vllm import VLLMConfig
from tandemrl.engine.config import EngineConfig
from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.tandem.config import TandemConfig

__all__ = [
    "CheckpointConfig", "Config", "ConfigError", "CurriculumConfig", "DataConfig", "DistributedConfig", "EngineConfig",
    "EvalConfig", "InferenceRewardConfig", "LogConfig", "LoraConfig", "ModelConfig", "RewardConfig", "RolloutConfig",
    "Section", "SpeculativeConfig", "SyncConfig", "TandemConfig", "ToolsConfig", "TrainConfig", "VLLMConfig",
    "config_to_toml", "load_config", "toml_literal", "validate_config",
]
