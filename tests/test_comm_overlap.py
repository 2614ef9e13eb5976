"""bench/comm_overlap.py: the share of NCCL kernel time that runs beside compute kernels, inside the window."""

from bench.comm_overlap import overlap


def kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_overlap_counts_the_nccl_time_under_compute_inside_the_window():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "grpo_update", "ts": 100, "dur": 1000},
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 50, 40),  # before the window: not counted
        kernel("gemm", 100, 300), kernel("gemm", 350, 100),  # compute 100-450
        kernel("ncclDevKernel_ReduceScatter", 400, 200),  # 400-600: 50 beside compute
        kernel("ncclDevKernel_AllGather", 500, 200),  # 500-700: merged with the above, 400-700
        kernel("elementwise", 650, 100),  # 650-750: 50 more beside
    ]}
    got = overlap(trace)
    assert got["nccl_kernels"] == 2 and got["comm_ms"] == 0.3 and got["overlapped_ms"] == 0.1
    assert abs(got["overlapped_share"] - 1 / 3) < 1e-9 and got["window_ms"] == 1.0 and got["compute_ms"] == 0.45
    whole = overlap(trace, window=None)
    assert whole["nccl_kernels"] == 3 and whole["window_ms"] is None


def test_no_nccl_kernels_give_no_share():
    assert overlap({"traceEvents": [kernel("gemm", 0, 10)]})["overlapped_share"] is None
