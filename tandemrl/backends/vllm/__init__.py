"""rollout.backend = "vllm": vLLM as the rollout engine, through its public API only (extra ``tandemrl[vllm]``).

Importing this package does not import vLLM; ``VLLMBackend`` (colocated) does, when it is built.
``VLLMServerBackend`` (server mode) never does: it talks HTTP to a vLLM server running in its own environment.
"""

from tandemrl.backends.vllm.errors import VLLMBackendError, VLLMServerError, WeightSyncError

__all__ = ["VLLMBackendError", "VLLMServerError", "WeightSyncError"]
