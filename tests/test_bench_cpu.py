"""The benchmarks run on a CPU with the tiny architecture (the GPU numbers come from the same scripts)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(module: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, check=True, capture_output=True, timeout=300)


def test_engine_throughput_prints_engine_and_hf_numbers(tmp_path):
    out = tmp_path / "throughput.json"
    run_bench("bench.engine_throughput", "--arch", "tiny", "--batches", "1", "8", "--hf-batch", "8",
              "--prompt-len", "16", "--new-tokens", "24", "--kv-gib", "0.01", "--out", str(out))
    result = json.loads(out.read_text())
    assert [row["batch"] for row in result["engine"]] == [1, 8]
    assert all(row["engine_tok_s"] > 0 for row in result["engine"])
    assert result["hf"]["tok_s"] > 0 and result["speedup_vs_hf"] > 0


def test_grpo_step_runs_with_both_backends(tmp_path):
    for backend in ("hf", "engine"):
        out = tmp_path / f"{backend}.json"
        run_bench("bench.grpo_step", "--arch", "tiny", "--backend", backend, "--prompts", "2", "--group", "4",
                  "--prompt-len", "8", "--new-tokens", "16", "--repeats", "1", "--out", str(out))
        result = json.loads(out.read_text())
        assert result["backend"] == backend and result["runs"][0]["tokens"] == 2 * 4 * 16


def test_agent_loop_bench_runs_both_loops(tmp_path):
    """Correctness of the benchmark only (timings on a shared CI machine are not asserted)."""
    import torch

    from bench.agent_loop import main as agent_bench

    out, threads = tmp_path / "agent.json", torch.get_num_threads()
    try:  # in this process: a second interpreter's imports cost more than the run
        agent_bench(["--arch", "tiny", "--trajectories", "6", "--calls", "2", "--tool-min-ms", "1",
                     "--tool-max-ms", "5", "--turn-tokens", "4", "--prompt-len", "8", "--repeats", "1",
                     "--kv-gib", "0.01", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    assert [r["loop"] for r in result["runs"]] == ["async", "turn-synchronous"]
    for r in result["runs"]:
        assert r["tool_calls"] == 6 * 2 and r["check"] == "calls per trajectory [2], finish ['max_tool_calls']"
        assert 0 < r["engine_busy_fraction"] <= 1
    assert result["throughput_ratio"] > 0


def test_multi_gpu_bench_runs_tandem_on_two_gloo_ranks(tmp_path):
    """The FSDP worker (replica, gather, tandem per rank) under torchrun on the CPU; timings are not asserted."""
    out = tmp_path / "multi_gpu.json"
    run_bench("bench.multi_gpu", "--cpu-smoke", "--settings", "2 gpu tandem", "--out", str(out))
    row = json.loads(out.read_text())["rows"]["2 gpu tandem"]
    assert row["processes"] == 2 and row["global_samples"] == 2 * 2 * 2
    assert row["gather_s"] > 0 and 0 < row["gather_share"] < 1
