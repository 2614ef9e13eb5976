"""Which kernel runs a group of a layer's projections (`route_group`): our grouped launch (fused_linear.py), cuBLAS
base projections plus the LoRA shrink and expand (an adapted group the grouped launch declines), or the modules.

The rule (`grouped_launch_wins`) follows H100 A/Bs against cuBLAS of every linear op at Qwen2.5-1.5B/7B shapes,
rows 1/64/256 (bench/results/session-1126g/linear-ab/), and at 0.5B, rows 64/128/256 (engine-v5/kernel_sweep.json):
- o_proj, down_proj (one weight, no adapter): cuBLAS, always. One GEMM has no launch to save; ours never beat it by
  more than 4 % (1.5B o_proj) and lost by up to 1.6x (1.5B down_proj at 1 row: 22.2 vs 13.8 us per layer).
- q/k/v and gate/up + SiLU up to 64 rows: ours at every size (q/k/v 1.5-2.9x faster than cuBLAS's three GEMMs,
  gate/up + SiLU 1.1-1.3x): one launch instead of two or three, each weight read once.
- above 64 rows, ours for reductions (the hidden size) up to `_MAX_K_ABOVE_GEMV[op]`: cuBLAS's larger GEMMs reach
  1.3-1.6x our kernel's TFLOP/s (7B, 256 rows), so the launches ours saves pay only while the GEMMs are short.
  At 256 rows, q/k/v: ours at K 896 (5.9 vs 14.1 us) and 1536 (7.9 vs 17.5), cuBLAS at 3584 (32.7 vs 40.9);
  gate/up: ours at 896 (15.1 vs 19.8), a tie at 1536 (38.2 us each: cuBLAS), cuBLAS at 3584 (146.9 vs 201.9).
  The whole 1.5B batch-256 decode step agrees: 3.542 / 3.550 ms with q/k/v grouped against 3.823 ms with cuBLAS
  (two alternating runs, one H100, bench/results/session-1127b/dispatch; an earlier hold's 4.295 ms did not repeat).
- an adapter keeps these limits for q/k/v and gate/up. Past them: cuBLAS base projections, then the shrink and
  `lora_expand_` (batch 256: 1.67x the adapter-free step at 1.5B and 1.49x at 7B, against 2.42x and 2.00x through
  peft's modules).
- o_proj / down_proj with an adapter: cuBLAS + the shrink and expand at every size. Timed together, shrink and
  consumer, at 1.5B and 7B, rank 64 (bench.lora_shrink_sweep, bench/results/session-1127f/): down_proj 30.1 vs
  36.0 us per layer at 1.5B 64 rows, 76.5 vs 84.3 at 7B; o_proj 10.8 vs 10.1-10.9 (1.5B) and 19.2 vs 20.5 (7B).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _torch_module

from tandemrl.engine.kernels.linear_tiles import GEMV_ROWS
from tandemrl.engine.kernels.lora import LoraParts, lora_parts

try:  # optional: without Triton the callers keep the module calls
    import triton
except Exception:  # pragma: no cover - missing or broken install
    triton = None

# Inputs with more rows go to the modules (prefill-size GEMMs are cuBLAS's); the largest decode batch bucket.
GROUPED_LINEAR_MAX_ROWS = 256
# Above GEMV_ROWS rows, the longest reduction (K) at which each op's grouped launch was measured to beat cuBLAS:
_MAX_K_ABOVE_GEMV = {"qkv": 2048, "gate_up": 1024}
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (tests)


@dataclass(frozen=True)
class GroupRoute:
    """How a group of projections runs: our grouped launch (grouped), or, for an adapted group the grouped launch
    declines (above the GEMV range with a long reduction), cuBLAS base projections + the LoRA shrink and expand."""

    operands: list[tuple[nn.Linear, LoraParts | None]]
    grouped: bool


def grouped_launch_wins(op: str, rows: int, k: int, adapted: bool) -> bool:
    """The dispatch rule (module doc): whether our grouped launch serves `op` for rows x k inputs, rather than
    cuBLAS (the module calls). op: "qkv" (q/k/v), "gate_up" (gate/up + SiLU) or "proj" (o_proj / down_proj);
    adapted: a peft adapter on one of its projections (o_proj / down_proj are cuBLAS's with or without one)."""
    if op == "proj":
        return False
    return rows <= GEMV_ROWS or k <= _MAX_K_ABOVE_GEMV[op]


def route_group(op: str, modules: list[nn.Module | None], x: Tensor, max_rows: int | None) -> GroupRoute | None:
    """(base Linear, LoRA parts or None) of each module and the route, or None where neither route serves them all
    (the caller runs the modules): a module missing, hooked or neither a plain nn.Linear nor a plain peft LoRA
    Linear over one (lora.py), adapters of mixed dtypes, an input the kernels do not take, or a plain group at a
    shape where cuBLAS wins (`grouped_launch_wins`)."""
    if not _no_global_hooks():
        return None
    operands = []
    for module in modules:
        if module is None:
            return None
        if _plain_linear(module, x):
            operands.append((module, None))
            continue
        parts = lora_parts(module, x)
        if parts is None or not _plain_linear(parts.base, x):
            return None
        operands.append((parts.base, parts))
    adapters = [parts for _, parts in operands if parts is not None]
    if len({parts.a.dtype for parts in adapters}) > 1:
        return None
    rows = x.numel() // max(1, x.shape[-1])
    grouped = grouped_launch_wins(op, rows, x.shape[-1], bool(adapters))
    if not (grouped or adapters) or not _launchable(x, max_rows):
        return None
    return GroupRoute(operands, grouped)


def _plain_linear(module: nn.Module, x: Tensor) -> bool:
    """nn.Linear (or a subclass keeping its forward) without hooks whose weight/bias the kernel can read as is."""
    if not isinstance(module, nn.Linear) or type(module).forward is not nn.Linear.forward:
        return False  # peft LoRA layers are not nn.Linear; subclasses with their own forward compute more
    if module._forward_hooks or module._forward_pre_hooks:
        return False
    weight, bias = module.weight, module.bias
    if type(weight) not in (Tensor, nn.Parameter) or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        return False  # tensor subclasses (DTensor/FSDP shards) are not plain memory
    if weight.dtype != x.dtype or weight.device != x.device or not weight.is_contiguous():
        return False
    if bias is not None and (type(bias) not in (Tensor, nn.Parameter) or bias.dtype != x.dtype
                             or bias.shape != (weight.shape[0],) or not bias.is_contiguous()):
        return False
    # The kernel records no autograd graph: only take it where none is wanted.
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                             or (bias is not None and bias.requires_grad)))


def _launchable(x: Tensor, max_rows: int | None) -> bool:
    """Triton present, x on CUDA (or the interpreter), a float dtype, unit-stride features, few enough rows."""
    if triton is None or not (x.is_cuda or _INTERPRET):
        return False
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.dim() < 1 or x.stride(-1) != 1:
        return False
    limit = GROUPED_LINEAR_MAX_ROWS if max_rows is None else max_rows
    return x.numel() // max(1, x.shape[-1]) <= limit


def _no_global_hooks() -> bool:
    """torch.nn.modules.module.register_module_forward_hook applies to every module: respect it."""
    return not (_torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks)
