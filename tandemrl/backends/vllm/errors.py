"""The vLLM backend's errors. Importable without vLLM, so the CLI can print them as one clear line."""

from __future__ import annotations


class VLLMBackendError(ValueError):
    """vLLM cannot serve this run (missing, wrong version, unsupported model); the message says what to do."""


class WeightSyncError(RuntimeError):
    """vLLM does not hold the trainer's weights after an update: the run must stop (its rollouts would be stale)."""


class VLLMServerError(ConnectionError):
    """The vLLM server stopped answering, or failed a request, during the run; the message names the server."""
