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
