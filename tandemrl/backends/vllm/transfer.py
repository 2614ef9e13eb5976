"""The trainer's weights in the forms a vLLM server takes them (server mode), without importing vLLM.

- disk: one ``model.safetensors`` in a directory the server reads; vLLM's worker reloads it in place
  (``reload_weights(weights_path=...)`` through ``/collective_rpc``), in checkpoint format: the model's own name
  mapping and post-load processing run again, as at start-up.
- http: the same safetensors bytes, base64, inside the ``/collective_rpc`` request; the worker extension
  (``extension.py``) decodes them, so the server may run on any host.

Every entry of the trainer's ``state_dict`` goes, tied ones included: vLLM 0.32's in-place reload leaves a tied LM
head at the old embedding when the file has no ``lm_head.weight`` (the probe catches it; see ``_compat.py``).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import torch
from safetensors.torch import save, save_file

WEIGHTS_FILE = "model.safetensors"


def plain_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors; a tensor sharing storage with an earlier one (tied weights) is copied,
    since safetensors refuses shared storage."""
    seen: set[int] = set()
    tensors = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().to("cpu").contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return tensors


def write_weights(state_dict: dict[str, torch.Tensor], directory: Path) -> Path:
    """Write the weights for vLLM to reload; atomic, so the server never reads half a file. Returns the file."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / WEIGHTS_FILE
    partial = directory / (WEIGHTS_FILE + ".partial")  # not *.safetensors: vLLM's loader does not glob it
    save_file(plain_tensors(state_dict), str(partial))
    os.replace(partial, target)
    return target


def encode_weights(state_dict: dict[str, torch.Tensor]) -> str:
    """The weights as one base64 string (safetensors bytes): a JSON-safe argument of ``/collective_rpc``."""
    return base64.b64encode(save(plain_tensors(state_dict))).decode("ascii")
