"""The rollout engine: paged KV cache, continuous batching, prefix sharing, CUDA graphs.

``step()`` = schedule -> run -> postprocess. The model runner (tandemrl.engine.model_runner) is imported
lazily by tandemrl.backends.engine_backend, so this package imports without it.
"""

from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.engine import LLMEngine, ModelRunnerProtocol
from tandemrl.engine.scheduler import Scheduler
from tandemrl.engine.sequence import Sequence, SequenceStatus

__all__ = ["BlockManager", "EngineConfig", "LLMEngine", "ModelRunnerProtocol", "Scheduler", "Sequence",
           "SequenceStatus"]
