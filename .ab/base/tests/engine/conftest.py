"""Shared by the engine's kernel tests."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _interpreter_scalar_bounds(monkeypatch):
    """Triton 3.6's interpreter turns a loop bound into an int with int(<array of shape (1,)>), which numpy >= 2.4
    refuses; read the single element instead (kernels with a dynamic `range(lo, hi)` need it). Interpreter only."""
    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        return
    try:
        from triton.runtime import interpreter
    except Exception:  # no Triton: the kernel tests skip
        return
    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch)
