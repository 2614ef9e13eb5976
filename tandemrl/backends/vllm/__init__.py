"""rollout.backend = "vllm": vLLM as the rollout engine, through its public API only (extra ``tandemrl[vllm]``).

Importing this package does not import vLLM; ``VLLMBackend`` does, when it is built.
"""

from tandemrl.backends.vllm.errors import VLLMBackendError, WeightSyncError

__all__ = ["VLLMBackendError", "WeightSyncError"]
