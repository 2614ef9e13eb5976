"""Where the engine's Triton kernel tests run: on CUDA, or on the CPU under Triton's interpreter
(TRITON_INTERPRET=1, float32/float16 only: the interpreter has no bfloat16)."""

from __future__ import annotations

import os

import pytest
import torch

from tandemrl.engine import fused

HAS_CUDA = torch.cuda.is_available()
INTERPRET = fused.triton is not None and os.environ.get("TRITON_INTERPRET") == "1" and not HAS_CUDA
DEVICE = "cuda" if HAS_CUDA else "cpu"
DTYPES = [torch.bfloat16, torch.float32] if HAS_CUDA else [torch.float16, torch.float32]
needs_kernels = pytest.mark.skipif(fused.triton is None or not (HAS_CUDA or INTERPRET),
                                   reason="needs Triton and CUDA (or TRITON_INTERPRET=1)")
