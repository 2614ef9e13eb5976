"""The benchmarks run on a CPU with the tiny architecture (the GPU numbers come from the same scripts)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_bench(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, check=True, capture_output=True,
                          timeout=300, text=True)


def run_in_process(main, *args: str):
    """A bench's main in this process: a second interpreter's imports cost more than a smoke run. The bench's
    thread count and global random draws stay inside it."""
    import torch

    threads = torch.get_num_threads()
    with torch.random.fork_rng():
        try:
            return main(list(args))
        finally:
            torch.set_num_threads(threads)


def test_engine_throughput_prints_engine_and_hf_numbers(tmp_path):
    from bench.engine_throughput import main

    out = tmp_path / "throughput.json"
    run_in_process(main, "--arch", "tiny", "--batches", "1", "8", "--hf-batch", "8",
                   "--prompt-len", "16", "--new-tokens", "24", "--kv-gib", "0.01", "--out", str(out))
    result = json.loads(out.read_text())
    assert [row["batch"] for row in result["engine"]] == [1, 8]
    assert all(row["engine_tok_s"] > 0 for row in result["engine"])
    assert result["hf"]["tok_s"] > 0 and result["speedup_vs_hf"] > 0


def test_engine_throughput_with_an_adapter_and_an_fp8_cache(tmp_path):
    from bench.engine_throughput import main

    out = tmp_path / "throughput.json"
    run_in_process(main, "--arch", "tiny", "--batches", "4", "--skip-hf", "--lora-rank", "4",
                   "--kv-cache-dtype", "fp8_e4m3", "--logprob-drift", "--prompt-len", "16", "--new-tokens", "12",
                   "--kv-gib", "0.01", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["lora_rank"] == 4 and result["kv_cache_dtype"] == "fp8_e4m3"
    drift = result["logprob_drift"]
    assert drift["tokens_compared"] > 0 and 0 < drift["max_abs_logprob_diff"] < 1


def test_grpo_step_runs_with_both_backends(tmp_path):
    from bench.grpo_step import main

    for backend in ("hf", "engine"):
        out = tmp_path / f"{backend}.json"
        run_in_process(main, "--arch", "tiny", "--backend", backend, "--prompts", "2", "--group", "4",
                       "--prompt-len", "8", "--new-tokens", "16", "--repeats", "1", "--out", str(out))
        result = json.loads(out.read_text())
        assert result["backend"] == backend and result["runs"][0]["tokens"] == 2 * 4 * 16


@pytest.mark.parametrize("attn", ["sdpa", "varlen"])
def test_realistic_step_reports_drawn_lengths_packed_and_padded(tmp_path, attn):
    from bench.realistic_step import main

    out = tmp_path / "realistic.json"
    run_in_process(main, "--tiny", "--padded-too", "--attn", attn, "--out", str(out))
    result = json.loads(out.read_text())
    run = result["median"]
    assert result["model"] == "tiny" and result["attn_implementation"] == attn
    assert run["update_s"] > 0 and run["padded_update_s"] > 0
    # each row stopped at its drawn length: the completions are not all as long as the cap
    assert run["completion_tokens"] == run["drawn_tokens"] < 2 * 4 * result["shape"]["cap"]
    assert run["trained_tokens"] == run["completion_tokens"] + 2 * 4 * 8  # + prompts, no padding
    assert run["padded_tokens"] > run["trained_tokens"] and 0 < result["padding_waste"] < 1


def test_memory_trace_prints_each_steps_update_forwards_and_restores_the_loop(tmp_path, capsys):
    import tandemrl.train.loop as loop
    from bench.memory_trace import main

    before = loop.policy_update, loop.train_step
    assert run_in_process(main, "--snapshot", str(tmp_path / "snapshot.pickle"), "--", "train", "--set",
                          "train.max_steps=2", "--set", "eval.limit=2", "--out", str(tmp_path / "run")) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("memory_trace step")]
    assert len(lines) == 2 and "update forwards 1, largest " in lines[0]
    assert (loop.policy_update, loop.train_step) == before


def test_async_step_bench_times_every_mode_with_long_tailed_lengths(tmp_path):
    """sync, sync-dp (torchrun, 2 gloo ranks) and async over the same global batch; 512 / 4 = 128 of the tiny
    model's 512 ids end a completion (the tokenizer's EOS among them): lengths ~geometric, mean ~4, cut at 16."""
    from bench.async_step import main

    out = tmp_path / "async_step.json"
    code = run_in_process(main, "--arch", "tiny", "--steps", "3", "--warmup", "1", "--new-tokens", "16",
                          "--mean-tokens", "4", "--prompts", "2", "--group", "4", "--modes", "sync", "sync-dp",
                          "async", "--out", str(out))
    assert code == 0  # no mode's launch failed
    result = json.loads(out.read_text())
    assert result["stop_ids"] == 128  # round(512 / 4)
    for mode in ("sync", "sync-dp", "async"):
        assert result[mode]["steps"] == 3 and result[mode]["samples_per_s"] > 0, mode
        lengths = result[mode]["lengths"]
        assert lengths["samples"] == 2 * 8 // (2 if mode == "sync-dp" else 1)  # steps 2-3; torchrun: rank 0's half
        assert 1 <= lengths["min"] <= lengths["p50"] <= lengths["max"] <= 16 and lengths["min"] < 16, (mode, lengths)
        assert 2 <= lengths["mean"] <= 8, (mode, lengths)
    assert 0 <= result["async"]["version_lag_mean"] <= 1 and result["async"]["dropped_groups"] == 0
    assert min(result["async_over_sync"], result["async_over_sync_dp"], result["sync_dp_over_sync"]) > 0


def test_tandem_step_bench_times_tandem_with_and_without_async_scheduling(tmp_path):
    from bench.tandem_step import main

    out = tmp_path / "tandem_step.json"
    run_in_process(main, "--arch", "tiny-qwen3", "--prompts", "2", "--group", "2", "--prompt-len", "8",
                   "--new-tokens", "16", "--repeats", "1", "--ps", "0.5", "--sync-too", "--turns-too",
                   "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"vanilla", "tandem p=0.5", "tandem p=0.5 sync", "tandem p=0.5 turns"}
    assert all(row["step_s"] > 0 for row in rows.values())
    # EOS ignored: the same bursts either way, so the same forwards per token (on the CPU bursts run in turns)
    for key in ("hot_passes_per_token", "frozen_passes_per_token"):
        assert rows["tandem p=0.5"][key] == rows["tandem p=0.5 sync"][key] == rows["tandem p=0.5 turns"][key] > 0


def test_speculative_bench_times_verify_rounds_against_the_model(tmp_path):
    from bench.speculative import main

    out = tmp_path / "speculative.json"
    run_in_process(main, "--target", "tiny", "--draft", "tiny-draft", "--batches", "2", "--ks", "2",
                   "--rates", "0.8", "1.0", "--new-tokens", "16", "--rounds", "3", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["rounds"] == 3 and [row["a"] for row in result["rows"]] == [0.8, 1.0]
    for row in result["rows"]:
        assert row["predicted"] > 0 and row["achieved"] > 0 and 0 <= row["telemetry_overhead"] < 1
        assert row["slowest_row_rounds"] >= 1.0
    assert result["rows"][1]["slowest_row_rounds"] == 1.0  # a = 1: every row keeps every proposal
    assert result["rows"][1]["realized_a_fastest_run"] == result["rows"][1]["realized_a_mean"] == 1.0
    assert 0 < result["rows"][0]["realized_a_mean"] < 1  # a = 0.8: some draws miss


def test_verify_cost_bench_times_plain_and_verify_forwards(tmp_path):
    from bench.verify_cost import main

    out = tmp_path / "verify_cost.json"
    run_in_process(main, "--target", "tiny", "--batches", "2", "--ks", "2", "3", "--repeats", "2",
                   "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(row["batch"], row["k"]) for row in rows] == [(2, 2), (2, 3)]
    assert all(row["verify_forward_us"] > 0 and row["plain_logits_us"] > 0 and row["verify_over_plain"] > 0
               for row in rows)


def test_agent_loop_bench_runs_both_loops_on_one_script(tmp_path):
    """Correctness of the benchmark only (timings on a shared CI machine are not asserted)."""
    from bench.agent_loop import main

    out = tmp_path / "agent.json"
    run_in_process(main, "--arch", "tiny", "--trajectories", "12", "--max-calls", "3", "--tool-min-ms", "1",
                   "--tool-max-ms", "5", "--turn-tokens-min", "2", "--turn-tokens-max", "7", "--prompt-len", "8",
                   "--repeats", "1", "--kv-gib", "0.01", "--out", str(out))
    result = json.loads(out.read_text())
    runs = {r["loop"]: r for r in result["runs"]}
    assert list(runs) == ["async", "turn-synchronous"]
    assert runs["async"]["tool_calls"] == runs["turn-synchronous"]["tool_calls"] == 12 * result["calls_per_trajectory"]
    assert runs["async"]["generated_tokens"] == runs["turn-synchronous"]["generated_tokens"]  # the same script
    assert runs["async"]["check"] == runs["turn-synchronous"]["check"]
    assert runs["async"]["check"].endswith("finish ['max_tool_calls']")
    assert runs["async"]["check"] != "calls per trajectory [3], finish ['max_tool_calls']"  # 1..3 calls, not all 3
    for r in runs.values():
        assert 0 < r["engine_busy_fraction"] <= 1
    assert result["throughput_ratio"] > 0 and min(result["ratio_bound"], result["ratio_bound_tools_only"]) >= 1.0


def test_agent_loop_ratio_bound_is_the_critical_paths_quotient():
    from bench.agent_loop import Script, ratio_bound

    scripts = [Script((0.1, 0.3), (1, 1, 1)), Script((0.2,), (2, 1))]
    assert ratio_bound(scripts, 0.0) == pytest.approx((0.2 + 0.3) / (0.1 + 0.3))
    # turn by turn: (2 tokens + 0.2 s) + (1 + 0.3) + 1 vs the first trajectory's 0.4 s + 3 tokens
    assert ratio_bound(scripts, 1.0) == pytest.approx(4.5 / 3.4)


def test_run_report_gives_accuracy_intervals_and_step_times(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    evaluation = {"pass_at_k": None, "k": 0, "num_prompts": 100}
    (run / "summary.json").write_text(json.dumps({"initial": {"accuracy": 0.09, **evaluation}, "steps": 2,
                                                  "final": {"accuracy": 0.4, **evaluation}, "task": "arith2",
                                                  "seconds": 12.5}))
    rows = [{"step": s, "time/step": 1.0 + s, "time/rollout": 0.5, "tokens_per_s": 100.0 * s,
             "response_length/mean": 60.0 - s} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from bench.run_report import main

    run_in_process(main, str(run))
    result = json.loads((run / "report.json").read_text())
    assert result["before"]["correct"] == 9 and result["before"]["ci95"] == [
        pytest.approx(0.048, abs=1e-3), pytest.approx(0.162, abs=1e-3)]
    assert result["significant"] is True and result["step_s_median"] == 2.5 and result["tokens_per_s_median"] == 150


def test_curriculum_overhead_runs_on_the_cpu(tmp_path):
    from bench.curriculum_overhead import main

    out = tmp_path / "curriculum.json"
    run_in_process(main, "--cpu-smoke", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["median"]["rollout_s"] > 0 and result["median"]["terms_s"] > 0 and result["end_epoch_s"] > 0
    assert 0 < result["terms_pct_of_rollout"] < 100 and 0 < result["curriculum_pct_of_epoch"] < 100


def test_multi_gpu_bench_runs_on_two_gloo_ranks(tmp_path, monkeypatch, capfd):
    """The FSDP worker under torchrun on the CPU: tandem (replica, gather, a frozen model per rank) and one
    tensor-parallel engine over both ranks (its slices refreshed from the shards); timings are not asserted."""
    from bench.multi_gpu import main

    monkeypatch.chdir(ROOT)  # the launches put the working directory on PYTHONPATH
    out = tmp_path / "multi_gpu.json"
    run_in_process(main, "--cpu-smoke", "--settings", "2 gpu tandem", "2 gpu tp", "--strategies", "shard",
                   "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    for setting in ("2 gpu tandem", "2 gpu tp"):
        row = rows[f"{setting} / shard"]
        assert "error" not in row, f"{row['error']}\n{capfd.readouterr().err[-8000:]}"
        assert row["processes"] == 2 and row["global_samples"] == 2 * 2 * 2
        assert row["tensor_parallel_size"] == (2 if setting == "2 gpu tp" else 1)
        assert row["gather_s"] > 0 and 0 < row["gather_share"] < 1


def test_tp_decode_bench_compares_one_engine_over_two_gloo_ranks_with_one(tmp_path):
    """bench.tp_decode --cpu-smoke under torchrun: step times of both engines, greedy parity (float32: exact, the
    teacher-forced logit noise tiny)."""
    out = tmp_path / "tp_decode.json"
    run_bench("torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "bench.tp_decode", "--cpu-smoke",
              "--out", str(out))
    result = json.loads(out.read_text())
    assert result["whole"][0]["decode_step_ms"] > 0
    assert result["split"][0]["decode_step_ms"] > 0 and result["ratio"][0] > 0
    parity = result["parity"]
    assert (parity["sequences"], parity["exact"], parity["differences"]) == (4, 4, [])
    assert parity["positions"] == 4 * 8 and 0 <= parity["noise_max"] < 1e-3


def test_tp_decode_profile_breaks_one_decode_step_down_for_both_engines(tmp_path):
    """bench.tp_decode --cpu-smoke --profile: per-step op counts and times by category for both engines (CPU ops
    here); only the shard's step all-reduces (the tiny model: 2 layers x 2 + the embedding's)."""
    run_bench("torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "bench.tp_decode", "--cpu-smoke",
              "--profile", str(tmp_path), "--profile-steps", "4")
    result = json.loads((tmp_path / "tp_profile_rank0.json").read_text())
    (whole,), (split,) = result["whole"], result["split"]
    for row in (whole, split):
        assert row["steps"] == 4 and row["kernels"] > 0 and row["wall_us"] > 0
        assert math.isfinite(row["unprofiled_wall_us"])  # a difference of two timings: a busy CPU can make it < 0
        assert row["by_category"]["gemm"] > 0 and len(row["top"]) == 15
    # present in the split engine's step only; its time is a difference of two runs' (gloo waits for the other rank,
    # so on a busy CPU the long run's can be the shorter: -1,942 us once)
    assert "all-reduce/nccl" not in whole["by_category"] and "all-reduce/nccl" in split["by_category"]
    allreduces = sum(k["calls"] for k in split["top"] if k["name"] == "c10d::allreduce_")
    assert allreduces in (0, 5)  # listed only when among the top 15
    assert sorted(p.name for p in tmp_path.glob("trace_*")) == ["trace_tp2_b2_p8.json.gz", "trace_whole_b2_p8.json.gz"]


def test_serve_bench_pushes_every_cpu_mode_and_loads_the_server(tmp_path, capsys):
    """bench.serve --cpu-smoke end to end (two `tandemrl serve` children); timings are not asserted."""
    pytest.importorskip("fastapi")
    from bench.serve import main, print_table  # print_table: what `--print JSON` shows (for bench/RESULTS.md)

    out = tmp_path / "serve.json"
    assert run_in_process(main, "--cpu-smoke", "--client-procs", "1", "3", "--out", str(out)) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and result["errors"] == {}
    sync = result["sync"]
    assert sync["inprocess"]["weight_copies"] == 1.0 and sync["inprocess"]["push_mb"] == 0.0
    for mode in ("checkpoint", "lora"):  # the last of 1 + 2 pushes landed; the server keeps its own copy
        row = sync[mode]
        assert row["server_policy_version"] == 3 and 0 < row["first_push_s"] and 0 < row["push_s"] <= row["push_max_s"]
        assert row["push_mb"] > 0 and row["weight_copies"] >= 2.0
    assert sync["checkpoint"]["weight_copies"] == pytest.approx(2.0)
    assert "note" in sync["ipc"] and "note" in sync["nccl"]
    assert result["load"]["clients"] == 8 and result["load"]["tok_s"] > 0 and result["in_process"]["tok_s"] > 0
    assert result["load"]["latency_p50_s"] <= result["load"]["latency_p99_s"]
    for load in (result["load"], result["load_reused"]):  # the TTFT's split: to the response headers, then on
        assert 0 < load["headers_p50_s"] <= load["headers_max_s"] and load["headers_to_first_token_p50_s"] > 0
        assert load["headers_p50_s"] < load["ttft_p99_s"] and 0 < load["sent_p50_s"] < load["headers_p50_s"]
    assert result["load_reused"]["clients"] == 8 and result["server_reused_over_in_process"] > 0
    split = result["by_client_procs"]["3"]  # 8 streams over 3 processes (3 + 3 + 2), each stream in full
    assert split["load"]["clients"] == split["load_reused"]["clients"] == 8 and split["load"]["client_procs"] == 3
    assert split["kept_over_in_process"] > 0 and result["by_client_procs"]["1"]["load"] == result["load"]
    assert "serving bench on http://127.0.0.1:" in (tmp_path / "server-full.log").read_text()
    capsys.readouterr()
    print_table(result)
    table = capsys.readouterr().out
    assert "| checkpoint | " in table and "8 streaming clients, kept-alive connections, 1 client process:" in table
    assert "server / in-process throughput, 1 client process:" in table and "3 client processes:" in table


def test_nccl_sync_bench_pushes_over_gloo_and_checks_the_served_weights(tmp_path):
    """bench.nccl_sync --cpu-smoke: a `tandemrl serve` child, bucketed pushes over gloo, equal checksums."""
    pytest.importorskip("fastapi")
    out = tmp_path / "nccl_sync.json"
    run_bench("bench.nccl_sync", "--cpu-smoke", "--out", str(out))
    row = json.loads(out.read_text())["rows"]["tiny"]
    assert row["checksum_equal"] and row["checksum_differed_before"]
    assert row["mb_sent"] > 10 * row["bucket_mib"] and 0 < row["push_s"] <= row["max_s"]


def test_agent_loop_lognormal_tool_delays_are_long_tailed_within_the_bounds():
    import argparse
    import random

    from bench.agent_loop import tool_delay

    args = argparse.Namespace(tool_dist="lognormal", tool_min_ms=50.0, tool_max_ms=5000.0)
    rng = random.Random(0)
    delays = sorted(tool_delay(rng, args) for _ in range(4000))
    assert 0.05 <= delays[0] and delays[-1] <= 5.0
    assert 0.4 < delays[len(delays) // 2] < 0.6  # the median: the bounds' geometric mean, 0.5 s
    assert sum(delays) / len(delays) > 1.3 * delays[len(delays) // 2]  # the mean well above it: a long tail


def test_ngram_real_bench_on_a_finished_runs_prompts(tmp_path):
    """A 2-step run of the offline model, then its final checkpoint on the run's own prompts (topped up with train
    rows), plain and with n-gram speculation: greedy tokens identical, the telemetry's acceptance in [0, 1]."""
    from bench.ngram_real import main as ngram_real
    from tandemrl.cli import main as cli

    run = tmp_path / "run"
    assert cli(["train", "--out", str(run), "--set", f'model.tiny_dir="{tmp_path / "tiny"}"', "--set",
                "model.device=cpu", "--set", "train.max_steps=2", "--set", "eval.limit=2", "--set", "eval.pass_k=0",
                "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2"]) == 0
    trained = {json.loads(line)["sample"] for line in (run / "samples.jsonl").read_text().splitlines()}
    out = tmp_path / "ngram.json"
    ngram_real(["--run", str(run), "--set", "rollout.max_tokens=16", "--prompts", str(len(trained) + 2),
                "--batch", "3", "--num-tokens", "2", "3", "--warmup", "0", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["prompts"] == len(trained) + 2 and result["prompts_from_run"] == len(trained)
    assert result["checkpoint"].endswith("step-00000002") and result["max_tokens"] == 16
    rows = {(r["temperature"], r["num_tokens"]): r for r in result["rows"]}
    assert set(rows) == {(t, k) for t in (1.0, 0.0) for k in (None, 2, 3)}
    for (temperature, k), row in rows.items():
        assert row["tokens"] > 0 and row["tokens_per_s"] > 0 and row["speedup"] > 0, row
        if k is None:
            assert row["acceptance_rate"] is None and row["speedup"] == 1.0
        else:
            assert 0.0 <= row["acceptance_rate"] <= 1.0 and 1.0 <= row["tokens_per_verify"] <= k + 1, row
        if temperature == 0.0 and k is not None:
            assert row["differing_prompts"] == 0 and row["tokens"] == rows[(0.0, None)]["tokens"]


def test_serve_host_cost_answers_every_request_and_prints_the_cost():
    out = run_bench("bench.serve_host_cost", "--rounds", "2").stdout  # its own process: it freezes the collector
    assert out.startswith("event-loop CPU per request: ") and "2 rounds of 64, gc freeze" in out, out
    assert float(out.split(": ")[1].split(" us")[0]) > 0


@pytest.mark.parametrize("group", ["SPECULATIVE", "TANDEM"])
def test_host_timeline_names_functions_that_exist(group):
    """A renamed or removed engine function must not silently drop out of the host timeline."""
    from bench import host_timeline

    names = getattr(host_timeline, group)
    with host_timeline.HostTimeline(names) as timeline:
        assert set(timeline.totals) == set(names)


def test_vllm_rows_table_puts_each_shape_of_both_sides_in_one_row(tmp_path, capsys):
    import tarfile

    from bench.vllm_rows_table import main

    ours = tmp_path / "raw"
    ours.mkdir()
    (ours / "ours-7b-long.json").write_text(json.dumps({
        "arch": "qwen2.5-7b", "prompt_len": 1024, "new_tokens": 4096,
        "engine": [{"batch": 32, "engine_tok_s": 3000.0, "step_over_floor": 1.25, "prefill_s": 0.5}]}))
    (ours / "ours-7b-prefill.json").write_text(json.dumps({
        "arch": "qwen2.5-7b", "prompt_len": 4096, "new_tokens": 2,
        "engine": [{"batch": 8, "engine_tok_s": 30.0, "step_over_floor": 1.5, "prefill_s": 0.25}]}))
    vllm = tmp_path / "vllm-7b-long.jsonl"
    vllm.write_text("\n".join(json.dumps(r) for r in (
        {"engine": "vllm", "kind": "info", "arch": "qwen2.5-7b"},
        {"engine": "vllm", "arch": "qwen2.5-7b", "batch": 32, "prompt_len": 1024, "gen_len": 4096, "tok_s": 2000.0},
        {"engine": "vllm", "arch": "qwen2.5-7b", "batch": 64, "prompt_len": 128, "gen_len": 512, "tok_s": 8000.0},
        {"engine": "vllm", "arch": "qwen2.5-7b", "batch": 8, "prompt_len": 4096, "gen_len": 1, "tok_s": 20.0,
         "wall_s": 0.4})))
    packed = tmp_path / "raw.tar.gz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(vllm, arcname="raw/vllm-7b-long.jsonl")
    main([str(ours), str(packed)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| qwen2.5-7b | 128 + 512 | 64 | - | 8,000 | - | - |"
    assert lines[3] == "| qwen2.5-7b | 1024 + 4096 | 32 | 3,000 | 2,000 | 1.50 | 1.25 |"
    # prefill: only shapes both sides ran (vLLM's one-token run), vLLM's time over ours
    assert lines[-1] == "| qwen2.5-7b | 4096 | 8 | 250.0 | 400.0 | 1.60 |" and len(lines) == 8
