"""Programmatic dependent launch (PDL, Hopper and newer) for the engine's Triton kernels.

A decode step is a chain of short kernels; between two of them the GPU drains the first, then launches and ramps
up the second. A kernel launched with PDL may start while the kernel ahead of it in the stream is still running,
so its launch overlaps the other's tail. Such a kernel must not touch memory before that kernel has finished:
``pdl_enter`` waits for it (``griddepcontrol.wait``, which also makes its writes visible) as the first thing every
program does, after allowing the next kernel to launch early in turn. Kernels that are not ours (cuBLAS) launch as
usual and are waited for in full. CUDA graphs keep these launches' programmatic edges.

Off in Triton's CPU interpreter (no PTX), before Hopper, and with the environment variable TANDEMRL_PDL=0 (an
escape hatch, and the benches' A/B switch); there the launches are ordinary.
"""

from __future__ import annotations

import functools
import os

import torch

try:  # optional: without Triton nothing launches with PDL
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except Exception:  # pragma: no cover - missing or broken install
    triton = None


def launch_options(device: torch.device) -> dict:
    """Keyword arguments for a launch of a kernel that calls ``pdl_enter(PDL)``: PDL on capable devices."""
    return {"PDL": True, "launch_pdl": True} if _supported(device) else {"PDL": False}


def _supported(device: torch.device) -> bool:
    if triton is None or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("TANDEMRL_PDL", "1") == "0":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


if triton is not None:

    @triton.jit
    def pdl_enter(PDL: tl.constexpr):
        """First thing in a kernel launched with ``launch_options``: let the next kernel launch, then wait for the
        previous one to finish (a no-op for an ordinary launch)."""
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
