"""The rollout engine: paged KV cache, continuous batching, prefix sharing, CUDA graphs.

Layers: the host-side core here (sequence, block manager, scheduler, the step contract, the engine), model execution
in ``model/`` (runner and its model slots, forward, attention metadata, CUDA graphs, sampling) and the Triton kernels
in ``kernels/``. ``step()`` = schedule -> run -> postprocess. The model runner is imported lazily by
tandemrl.backends.engine_backend, so this package imports without torch's model code.
"""

from tandemrl.engine.block_manager import BlockManager
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.engine import LLMEngine, ModelRunnerProtocol
from tandemrl.engine.scheduler import Scheduler
from tandemrl.engine.sequence import Sequence, SequenceStatus
from tandemrl.engine.step import DecodeStep, PrefillStep, StepKind, StepOutput, StepPlan, VerifyStep

__all__ = ["BlockManager", "DecodeStep", "EngineConfig", "LLMEngine", "ModelRunnerProtocol", "PrefillStep", "Scheduler",
           "Sequence", "SequenceStatus", "StepKind", "StepOutput", "StepPlan", "VerifyStep"]
