"""torch.compile for the decode forward, so inductor fuses the many small elementwise ops of a step (RMSNorm,
RoPE, SiLU*mul, residual adds) before DecodeGraphs captures it; degrades step by step instead of failing.

Stages, each tried on the first call that reaches it (the CUDA-graph warm-up, outside any capture):
1. the whole forward compiled, the Triton decode kernel traced as a user-defined kernel;
2. the same with the attention call hidden from dynamo (``DecodeMeta.opaque_attention``: a graph break per
   layer, the rest still compiles);
3. the eager forward.
Each fallback logs one warning line. HF modules are called as they are (zero copy, LoRA): nothing is replaced.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch
from torch import Tensor

from tandemrl.engine.attention import DecodeMeta

logger = logging.getLogger(__name__)


class CompiledDecode:
    """Runs `forward(input_ids, meta, *rest)` through torch.compile (inductor, default mode), falling back as
    above. Build it once and keep it: dynamo caches its compilations per code object and guards."""

    def __init__(self, forward: Callable[..., Tensor]) -> None:
        self.eager = forward
        self.compiled: Callable[..., Tensor] | None = torch.compile(forward, fullgraph=False)
        self.opaque_attention = False

    @property
    def active(self) -> bool:
        """Whether calls still go through the compiled forward."""
        return self.compiled is not None

    def __call__(self, input_ids: Tensor, meta: DecodeMeta, *rest: Any) -> Tensor:
        while self.compiled is not None:
            call_meta = dataclasses.replace(meta, opaque_attention=True) if self.opaque_attention else meta
            try:
                return self.compiled(input_ids, call_meta, *rest)
            except Exception as exc:  # noqa: BLE001 - any compiler failure: fall back, never stop decoding
                self._fall_back(exc)
        return self.eager(input_ids, meta, *rest)

    def _fall_back(self, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        if not self.opaque_attention:
            self.opaque_attention = True
            logger.warning("torch.compile of the decode forward failed (%s); retrying with attention run "
                           "outside the compiled graph", reason)
        else:
            self.compiled = None
            logger.warning("torch.compile of the decode forward failed (%s); decoding with the eager forward",
                           reason)
