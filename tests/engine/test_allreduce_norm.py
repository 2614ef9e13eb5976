"""The fused all-reduce + residual add + RMSNorm (kernels/allreduce_norm.py) on the CPU: its reference against an
all-reduce's sum then add_rmsnorm_ref, the Triton kernel under TRITON_INTERPRET=1 with plain tensors as the "peer"
partials (the cross-process barrier off), and the wiring's decisions (RowParallelLinear.partial, forward._add_norm
and _project). The cross-GPU runs are tests/engine/test_tp_fused_gpu.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from tandemrl.engine.config import EngineConfig
from tandemrl.engine.kernels import allreduce_norm as ar
from tandemrl.engine.kernels import fused as fk
from tandemrl.engine.model import forward
from tandemrl.engine.model.tensor_parallel import RowParallelLinear, TensorParallelGroup

from .kernel_env import DEVICE, DTYPES, needs_kernels


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reference_is_an_all_reduce_then_add_rmsnorm(world, dtype):
    g = torch.Generator().manual_seed(world)
    parts = [torch.randn(5, 64, generator=g).to(dtype) for _ in range(world)]
    residual = torch.randn(5, 64, generator=g).to(dtype)
    weight = (torch.rand(64, generator=g) + 0.5).to(dtype)
    fp32_sum = parts[0].float()
    for p in parts[1:]:
        fp32_sum = fp32_sum + p.float()  # rank order, float32
    out, new_res = ar.allreduce_add_rmsnorm_ref(parts, residual, weight, 1e-6)
    ref_out, ref_res = fk.add_rmsnorm_ref(fp32_sum.to(dtype), residual, weight, 1e-6)
    assert torch.equal(out, ref_out) and torch.equal(new_res, ref_res)
    if world == 2:  # two ranks: one rounding of the pair's sum, what NCCL's in-dtype sum gives
        assert torch.equal(new_res, residual + (parts[0] + parts[1]))
    none_out, none_res = ar.allreduce_add_rmsnorm_ref(parts, None, weight, 1e-6)
    assert torch.equal(none_res, fp32_sum.to(dtype))
    assert torch.equal(none_out, fk.add_rmsnorm_ref(none_res, None, weight, 1e-6)[0])


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("rows,programs", [(1, 64), (7, 64), (70, 16), (9, 4)])
def test_kernel_sums_plain_peer_tensors_as_the_reference(dtype, world, rows, programs):
    hidden = 96
    g = torch.Generator().manual_seed(rows * world)
    parts = [torch.randn(rows + 2, hidden, generator=g).to(DEVICE, dtype) for _ in range(world)]  # max_rows > rows
    residual = torch.randn(rows, hidden, generator=g).to(DEVICE, dtype)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(DEVICE, dtype)
    ptrs = torch.tensor([p.data_ptr() for p in parts], dtype=torch.int64, device=DEVICE)
    for res in (residual, None):
        for rank in range(world):  # every rank's launch gives the same bits
            out, new_res = ar.allreduce_add_rmsnorm(ptrs, rows, hidden, dtype, res, weight, 1e-6, rank,
                                                    programs=programs)
            ref, ref_res = ar.allreduce_add_rmsnorm_ref([p[:rows] for p in parts], res, weight, 1e-6)
            assert torch.equal(new_res, ref_res)
            # the norm's arithmetic is fused.add_rmsnorm's, step for step: the same bits given the same sum
            assert torch.equal(out, fk.add_rmsnorm(ref_res, None, weight, 1e-6)[0])
            torch.testing.assert_close(out, ref, atol=1e-2 if dtype != torch.float32 else 1e-5, rtol=1e-2)


class _LocalReducer:
    """A stand-in for SymmetricAllReduceNorm in one process: a world of one, so the sum is the partial itself."""

    max_rows, calls = 4, 0

    def fits(self, x):
        return x.shape[0] <= self.max_rows

    def partial(self, x, weight):
        return ar.PartialSum(x @ weight.t(), self)

    def add_rmsnorm(self, partial, residual, weight, eps):
        self.calls += 1
        return ar.allreduce_add_rmsnorm_ref([partial], residual, weight, eps)


def _row_parallel(bias: bool, reducer) -> RowParallelLinear:
    layer = RowParallelLinear(8, 16, bias, TensorParallelGroup(rank=0, size=1))
    nn.init.normal_(layer.weight)
    if bias:
        nn.init.normal_(layer.bias)
    layer.reducer = reducer
    return layer


def test_row_parallel_leaves_a_partial_only_with_a_reducer_no_bias_and_rows_that_fit():
    x = torch.randn(3, 8)
    assert _row_parallel(False, None).partial(x) is None  # no reducer: NCCL
    assert _row_parallel(True, _LocalReducer()).partial(x) is None  # a bias is added after the sum
    assert _row_parallel(False, _LocalReducer()).partial(torch.randn(5, 8)) is None  # rows past max_rows
    layer = _row_parallel(False, _LocalReducer())
    partial = layer.partial(x)
    assert isinstance(partial, ar.PartialSum) and torch.equal(partial.tensor, x @ layer.weight.t())
    # forward._project hands the fused path the partial (the torch path calls the module: NCCL's all-reduce)
    assert isinstance(forward._project(layer, x, fused=True), ar.PartialSum)
    assert isinstance(forward._project(nn.Linear(8, 16), x, fused=True), torch.Tensor)


def test_add_norm_sums_a_partial_in_the_fused_kernel_or_reduces_it_first():
    reducer = _LocalReducer()
    partial = ar.PartialSum(torch.randn(3, 16), reducer)
    residual = torch.randn(3, 16)
    norm = Qwen2RMSNorm(16, eps=1e-6)
    nn.init.uniform_(norm.weight, 0.5, 1.5)
    out, new_res = forward._add_norm(norm, partial, residual, fused=True)
    assert reducer.calls == 1
    assert torch.equal(new_res, residual + partial.tensor) and torch.equal(out, norm(residual + partial.tensor))

    class OtherNorm(nn.Module):  # not a plain RMSNorm: the sum alone (NCCL), then the module
        def forward(self, h):
            return h * 2

    reduced = []
    partial.reduced = lambda: reduced.append(1) or partial.tensor.clone()
    out, new_res = forward._add_norm(OtherNorm(), partial, residual, fused=True)
    assert reduced == [1] and reducer.calls == 1 and torch.equal(out, 2 * (residual + partial.tensor))


def test_no_reducer_off_cuda_and_the_config_key_is_a_bool():
    assert ar.SymmetricAllReduceNorm.create(None, 8, 16, torch.float32, torch.device("cpu")) is None
    assert EngineConfig().tensor_parallel_fused_allreduce is True
    assert TensorParallelGroup(rank=0, size=2).fused_allreduce is True
    with pytest.raises(ValueError, match="tensor_parallel_fused_allreduce"):
        EngineConfig(tensor_parallel_fused_allreduce="yes").validate()
