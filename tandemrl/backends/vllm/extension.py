"""Methods that vLLM mixes into its worker (``LLM(worker_extension_cls=...)`` or the server's
``--worker-extension-cls``), called through ``collective_rpc``.

This module must not import vLLM or tandemrl's heavy modules: vLLM imports it by name inside its worker.
"""

from __future__ import annotations

import base64
from typing import Iterable

import torch

EXTENSION = "tandemrl.backends.vllm.extension.TandemrlWorkerExtension"


class TandemrlWorkerExtension:
    """Loads the trainer's weights into the running engine.

    The weights arrive plain: Hugging Face names and layouts, as the trainer's ``state_dict`` holds them. They go
    through the worker's in-place reload in checkpoint format, which runs the model's own name mapping (q/k/v into
    qkv_proj, gate/up into gate_up_proj) and then its post-load processing again. Calling the model's
    ``load_weights`` directly would not do: on CPU, vLLM repacks linear weights at load and drops the plain
    tensors, so a second ``load_weights`` fails, or updates only the embeddings and norms.
    """

    def tandemrl_load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        weights = list(named_tensors)
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(weights)

    def tandemrl_load_encoded_weights(self, payload: str) -> int:
        """Server mode over HTTP: the weights as base64 safetensors bytes (``transfer.encode_weights``)."""
        from safetensors.torch import load

        return self.tandemrl_load_weights(load(base64.b64decode(payload)).items())
