"""`tandemrl serve` under load, and the cost of each weight-sync mode (issue 15).

The bench process is the trainer: it holds the model (random weights of a real architecture) and pushes it to a
`tandemrl serve` process started from the same weights, once per mode, timing each push (the server has applied
it when the push returns) and reading the GPU memory both processes use. Then N concurrent streaming clients
(httpx, SSE) each decode --new-tokens tokens (EOS ignored): per-request latency and time to first token
p50/p99, and aggregate tokens/s, beside the in-process engine decoding the same N sequences in one call.

GPU:  python -m bench.serve                                   (Qwen2.5-0.5B arch, 64 clients, 256 tokens)
CPU:  python -m bench.serve --cpu-smoke                        (tiny arch, 8 clients, 16 tokens; no ipc)
nccl needs a second GPU (two NCCL ranks cannot share one): its GPU number belongs to the multi-GPU issue; the CPU
test tests/serve/test_nccl_sync_gloo.py runs its code over gloo.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import httpx
import torch

from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.models.lora import LoraSettings, apply_lora
from tandemrl.models.tokenizer import build_char_tokenizer, save_char_tokenizer
from tandemrl.serve.client import ServerClient
from tandemrl.sync.base import InProcessSync
from tandemrl.sync.checkpoint import CheckpointSync
from tandemrl.sync.ipc import IpcSync
from tandemrl.sync.lora import LoraSync
from tandemrl.types import Request, SamplingParams

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def save_model_dir(model, directory: Path) -> Path:
    """The model's weights + the project's character tokenizer (the bench sends token ids; text is not read)."""
    model.save_pretrained(str(directory), safe_serialization=True)
    save_char_tokenizer(build_char_tokenizer(model_max_length=model.config.max_position_embeddings), directory)
    return directory


class ServerProcess:
    def __init__(self, model_dir: Path, device: str, kv_gib_share: float, lora: bool) -> None:
        sets = [f'model.device="{device}"', f"engine.gpu_memory_utilization={kv_gib_share}",
                "engine.max_num_seqs=256"]
        if device == "cpu":
            sets.append("engine.num_blocks=512")
        if lora:
            sets += ["model.lora.enabled=true"]
        command = [sys.executable, "-m", "tandemrl.cli", "serve", str(model_dir), "--port", "0",
                   "--served-model-name", "bench"] + (["--allow-ipc"] if device != "cpu" else [])
        for item in sets:
            command += ["--set", item]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("serving"):
            self.proc.kill()
            raise RuntimeError(f"the server did not start: {line!r}\n{self.proc.stderr.read()[-3000:]}")
        self.url = line.split(" on ")[1].split()[0]

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith(f"tandemrl_{name} "):
                return float(line.split()[1])
        raise KeyError(name)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def device_used_gib(device: torch.device) -> float | None:
    """Memory in use on the whole device (both processes)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**30


def time_pushes(sync, model, server: ServerProcess, device: torch.device, repeats: int, first_version: int) -> dict:
    seconds, nbytes = [], 0
    first = None
    for i in range(repeats + 1):
        with torch.no_grad():
            next(p for p in model.parameters() if p.requires_grad).add_(1e-3)  # a new version each time
        report = sync.push(model, first_version + i)
        if i == 0:
            first = report.seconds  # ipc: the attach; others: a cold first push
        else:
            seconds.append(report.seconds)
        nbytes = report.bytes
    return {"first_push_s": first, "push_s": statistics.median(seconds), "push_mb": nbytes / 2**20,
            "server_gpu_allocated_gib": server.metric("gpu_memory_allocated_bytes") / 2**30,
            "device_used_gib": device_used_gib(device)}


async def one_client(http: httpx.AsyncClient, prompt: list[int], new_tokens: int) -> dict:
    body = {"model": "bench", "prompt": prompt, "max_tokens": new_tokens, "temperature": 1.0, "stream": True,
            "ignore_eos": True, "return_token_ids": True}
    start = time.perf_counter()
    first, tokens = None, 0
    async with http.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ids = json.loads(line[6:])["choices"][0].get("token_ids", [])
            if ids and first is None:
                first = time.perf_counter() - start
            tokens += len(ids)
    return {"latency": time.perf_counter() - start, "ttft": first or 0.0, "tokens": tokens}


async def load_test(url: str, prompts: list[list[int]], new_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(one_client(http, p, new_tokens) for p in prompts))
        wall = time.perf_counter() - start
    if any(r["tokens"] != new_tokens for r in results):
        raise RuntimeError("a stream ended early")
    latency, ttft = [r["latency"] for r in results], [r["ttft"] for r in results]
    return {"clients": len(prompts), "wall_s": wall, "tok_s": sum(r["tokens"] for r in results) / wall,
            "latency_p50_s": percentile(latency, 50), "latency_p99_s": percentile(latency, 99),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99)}


def in_process_tok_s(model, prompts: list[list[int]], new_tokens: int, device: torch.device, kv_share: float) -> float:
    config = EngineConfig(gpu_memory_utilization=kv_share, num_blocks=None if device.type == "cuda" else 512)
    backend = EngineBackend(model, None, config, device=device)
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    run = lambda tag: backend.generate([Request(f"{tag}{i}", p, params) for i, p in enumerate(prompts)])  # noqa: E731
    run("warm")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = run("timed")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    backend.close()
    return sum(len(r.completion_ids) for r in out) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5, help="timed pushes per mode (after a first one)")
    parser.add_argument("--kv-share", type=float, default=0.25, help="engine.gpu_memory_utilization of each engine")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny arch, 8 clients, 16 tokens, on the CPU")
    parser.add_argument("--out", type=Path, default=Path("bench/out/serve.json"))
    args = parser.parse_args()
    if args.cpu_smoke:
        args.arch, args.clients, args.prompt_len, args.new_tokens, args.repeats = "tiny", 8, 8, 16, 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, gradient_checkpointing=False).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size, (args.clients, args.prompt_len), generator=gen).tolist()
    weight_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    result: dict = {"date": date.today().isoformat(), "arch": args.arch, "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
                    or "cpu", "weights_gib": weight_gib, "sync": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_model_dir(model, Path(tmp) / "model")
        result["sync"]["inprocess"] = {"push_s": InProcessSync().push(model, 0).seconds, "push_mb": 0.0,
                                       "device_used_gib": device_used_gib(device)}
        server = ServerProcess(model_dir, device.type, args.kv_share, lora=False)
        try:
            result["load"] = asyncio.run(load_test(server.url, prompts, args.new_tokens))
            result["sync"]["checkpoint"] = time_pushes(CheckpointSync(ServerClient(server.url), Path(tmp) / "sync"),
                                                       model, server, device, args.repeats, 1)
            if device.type == "cuda":
                result["sync"]["ipc"] = time_pushes(IpcSync(ServerClient(server.url)), model, server, device,
                                                    args.repeats, 100)
        finally:
            server.stop()
        result["in_process_tok_s"] = in_process_tok_s(model, prompts, args.new_tokens, device, args.kv_share)
        lora_model = apply_lora(model, LoraSettings())
        server = ServerProcess(model_dir, device.type, args.kv_share, lora=True)
        try:
            result["sync"]["lora"] = time_pushes(LoraSync(ServerClient(server.url)), lora_model, server, device,
                                                 args.repeats, 1)
        finally:
            server.stop()
    result["sync"]["nccl"] = {"note": "needs a second GPU (multi-GPU issue); code tested over gloo on CPU"}
    result["server_over_in_process"] = result["load"]["tok_s"] / result["in_process_tok_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)


def print_table(result: dict) -> None:
    print(f"{result['arch']} on {result['device']}, weights {result['weights_gib']:.2f} GiB")
    print("| sync mode | first push s | push s (median) | MB sent | server GPU alloc GiB | device used GiB |")
    print("|---|---|---|---|---|---|")
    for mode, row in result["sync"].items():
        if "note" in row:
            print(f"| {mode} | {row['note']} |||||")
            continue
        cells = [row.get("first_push_s"), row["push_s"], row["push_mb"], row.get("server_gpu_allocated_gib"),
                 row.get("device_used_gib")]
        print(f"| {mode} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    load = result["load"]
    print(f"{load['clients']} streaming clients: {load['tok_s']:.0f} tok/s, latency p50 {load['latency_p50_s']:.2f} s "
          f"p99 {load['latency_p99_s']:.2f} s, TTFT p50 {load['ttft_p50_s']:.3f} s p99 {load['ttft_p99_s']:.3f} s; "
          f"in-process engine {result['in_process_tok_s']:.0f} tok/s (server / in-process "
          f"{result['server_over_in_process']:.2f})")


if __name__ == "__main__":
    main()
