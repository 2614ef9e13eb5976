"""`tandemrl serve` under load, and the cost of each weight-sync mode (issue 15).

The bench process is the trainer: it holds the model (random weights of a real architecture) and pushes it to a
`tandemrl serve` process started from the same weights, once per mode, timing each push (the server has applied
it when the push returns). Per mode it reads the GPU memory the weights take: the trainer's parameters, the bytes
of the served weights in the server's own memory (/metrics `weight_bytes_owned`: 0 when ipc maps the trainer's),
their sum in copies of the weights, and the whole device's memory in use. Then N concurrent streaming clients
(httpx, SSE) each decode --new-tokens tokens (EOS ignored; after an untimed warm-up round on other prompts):
per-request latency and time to first token p50/p99, and aggregate tokens/s, beside the in-process engine
decoding the same N sequences in one call (after the same warm-up). Two timed rounds: "load" on new connections
(a client opened for it: TCP connects inside the round), and "load_reused" on the connections the warm-up opened
and kept alive (one client for both rounds, as an OpenAI client reuses its pool), on a third set of prompts of the
same shape. The clients' connections come from tandemrl's ConnectionSlots: httpx's own pool (httpcore 1.0) costs
O(connections x requests) per request, which held 64 reused streams 1-2 s before they were even sent. The clients
run in client processes of their own (bench/serve_clients.py): all N in one by default, or split over several with
--client-procs (as environment processes send them; several values: the three rounds for each).

Each stage's numbers are written to --out as soon as they exist, and a stage that fails is recorded under
"errors" while the others still run (exit status 1 if any failed).

GPU:  python -m bench.serve                                   (Qwen2.5-0.5B arch, 64 clients, 256 tokens)
CPU:  python -m bench.serve --cpu-smoke                        (tiny tied arch, 8 clients, 16 tokens; no ipc)
nccl needs a second GPU (two NCCL ranks cannot share one): bench/nccl_sync.py measures it on two (bench/gpu_multi2.sh);
the CPU test tests/serve/test_nccl_sync_gloo.py runs its code over gloo.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from datetime import date
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

import torch

from bench.grpo_step import ARCHITECTURES, build_model
from bench.serve_clients import ClientProcesses
from bench.serve_process import ServerProcess, save_model_dir
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.models.lora import LoraSettings, apply_lora
from tandemrl.sync.client import ServerClient
from tandemrl.serve.weight_memory import owned_weight_bytes
from tandemrl.sync.base import InProcessSync
from tandemrl.sync.checkpoint import CheckpointSync
from tandemrl.sync.ipc import IpcSync
from tandemrl.sync.lora import LoraSync
from tandemrl.train.setup import set_cpu_threads
from tandemrl.types import Request, SamplingParams

MODES = ("inprocess", "checkpoint", "ipc", "lora")
# The targets for one push (seconds); checkpoint is the reference.
TARGET_S = {"inprocess": 0.01, "ipc": 0.2, "lora": 0.5}
PACKAGES = ("torch", "transformers", "peft", "fastapi", "starlette", "uvicorn", "httptools", "uvloop", "httpx", "openai",
            "pydantic")
GIB = 2**30


class Bench:
    """The run's shared pieces and its result, saved after every stage."""

    def __init__(self, args: argparse.Namespace, model, device: torch.device, workdir: Path) -> None:
        self.args, self.model, self.device, self.workdir = args, model, device, workdir
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self._prompt_gen = torch.Generator().manual_seed(0)
        self.prompts, self.warm_prompts, self.reuse_prompts = (self.draw_prompts() for _ in range(3))
        self.model_dir = save_model_dir(model, workdir / "model")
        self.result: dict = {"date": date.today().isoformat(), "arch": args.arch, "versions": _versions(),
                             "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                             else platform.processor() or "cpu", "clients": args.clients,
                             "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                             "weights_gib": self.weight_bytes / GIB, "sync": {}, "errors": {}, "complete": False}

    def draw_prompts(self) -> list[list[int]]:
        """--clients random prompts of --prompt-len tokens, new ones at every call."""
        shape = (self.args.clients, self.args.prompt_len)
        return torch.randint(0, self.model.config.vocab_size, shape, generator=self._prompt_gen).tolist()

    def save(self) -> None:
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        self.args.out.write_text(json.dumps(self.result, indent=2) + "\n")

    def stage(self, name: str, run: Callable[[], None]) -> None:
        started = time.perf_counter()
        try:
            run()
        except Exception:  # noqa: BLE001 - one stage's failure must not cost the other numbers of a GPU call
            self.result["errors"][name] = traceback.format_exc()[-4000:]
            print(f"stage {name} FAILED:\n{self.result['errors'][name]}", flush=True)
        print(f"stage {name}: {time.perf_counter() - started:.1f} s", flush=True)
        self.save()

    def server(self, name: str, lora: bool) -> ServerProcess:
        return ServerProcess(self.model_dir, self.device.type, self.args.kv_share, lora,
                             self.args.out.parent / f"server-{name}.log")

    def memory_row(self, model, server: ServerProcess | None) -> dict:
        trainer = sum(p.numel() * p.element_size() for p in model.parameters())
        served = server.metric("weight_bytes_owned") if server is not None else 0.0
        return {"trainer_weights_gib": trainer / GIB, "server_weights_gib": served / GIB,
                "weight_copies": (trainer + served) / self.weight_bytes, "device_used_gib": device_used_gib(self.device)}


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def device_used_gib(device: torch.device) -> float | None:
    """Memory in use on the whole device (both processes)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / GIB


def time_pushes(bench: Bench, sync, model, server: ServerProcess, mode: str, first_version: int) -> None:
    """A first push (ipc: the attach; the others: a cold push), then --repeats timed ones, each of a new version."""
    seconds, first, nbytes = [], None, 0
    for i in range(bench.args.repeats + 1):
        with torch.no_grad():
            next(p for p in model.parameters() if p.requires_grad).add_(1e-3)  # a new version each time
        report = sync.push(model, first_version + i)
        if i == 0:
            first = report.seconds
        else:
            seconds.append(report.seconds)
        nbytes = report.bytes
    row = {"first_push_s": first, "push_s": statistics.median(seconds), "push_max_s": max(seconds),
           "push_mb": nbytes / 2**20, "server_policy_version": server.metric("policy_version"),
           **bench.memory_row(model, server)}
    bench.result["sync"][mode] = _with_target(mode, row)
    sync.close()


def _with_target(mode: str, row: dict) -> dict:
    target = TARGET_S.get(mode)
    return {**row, "target_s": target, "meets_target": None if target is None else row["push_s"] <= target}


def server_load(bench: Bench, server: ServerProcess) -> None:
    """Per --client-procs value: the warm-up round (CUDA graphs, Triton, caches; the clients' kept connections), a
    round on new connections, a round on the kept ones. The first value's rounds run the in-process engine's prompts
    and are "load" / "load_reused"; every value's are under "by_client_procs" (each on prompts of its own: the
    prefix cache must not see a round's prompts twice)."""
    for i, procs in enumerate(bench.args.client_procs):
        warm, fresh, reused = ((bench.warm_prompts, bench.prompts, bench.reuse_prompts) if i == 0
                               else (bench.draw_prompts(), bench.draw_prompts(), bench.draw_prompts()))
        with ClientProcesses(server.url, procs) as clients:
            clients.round(warm, bench.args.new_tokens, fresh=False)
            rounds = {"load": timed_round(server, lambda: clients.round(fresh, bench.args.new_tokens, fresh=True)),
                      "load_reused": timed_round(server, lambda: clients.round(reused, bench.args.new_tokens,
                                                                               fresh=False))}
        bench.result.setdefault("by_client_procs", {})[str(procs)] = rounds
        if i == 0:
            bench.result.update(rounds)


def timed_round(server: ServerProcess, run_round: Callable[[], dict]) -> dict:
    before = server.metrics()
    load = run_round()
    return {**load, **server_side(before, server.metrics(), load["wall_s"])}


def server_side(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    """The server's own account of the timed round (/metrics differences): how long requests waited for the engine
    thread, arrival to first token sent (the rest of the client's TTFT is HTTP and delivery), the engine's busy
    share of the round's wall time."""
    change = {name: after[name] - before.get(name, 0.0) for name in after}
    return {"server_queue_wait_mean_s": change["queue_wait_seconds_total"] / max(change["requests_total"], 1),
            "server_first_token_mean_s": change["first_token_seconds_total"] / max(change["first_tokens_total"], 1),
            "engine_step_share": change["engine_step_seconds_total"] / wall_s,
            "engine_steps": change["engine_steps_total"]}


def in_process_load(bench: Bench) -> None:
    device = bench.device
    set_cpu_threads(None, bench.model, device)  # as the server does: on the CPU, one thread for a small model
    config = EngineConfig(gpu_memory_utilization=bench.args.kv_share,
                          num_blocks=None if device.type == "cuda" else 512)
    backend = EngineBackend(bench.model, None, config, device=device)
    params = SamplingParams(max_tokens=bench.args.new_tokens, temperature=1.0, ignore_eos=True)

    def run(tag: str, prompts: list[list[int]]):
        return backend.generate([Request(f"{tag}{i}", p, params) for i, p in enumerate(prompts)])

    try:
        run("warm", bench.warm_prompts)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = run("timed", bench.prompts)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    finally:
        backend.close()
    bench.result["in_process"] = {"tok_s": sum(len(r.completion_ids) for r in out) / seconds, "wall_s": seconds}


def run_full_model_server(bench: Bench) -> None:
    """One server for the load test, then the checkpoint pushes, then ipc (its attach frees the server's copy)."""
    server = bench.server("full", lora=False)
    try:
        bench.result["server_start"] = bench.memory_row(bench.model, server)
        if bench.args.clients:
            bench.stage("load", lambda: server_load(bench, server))
        if "checkpoint" in bench.args.modes:
            bench.stage("checkpoint", lambda: time_pushes(
                bench, CheckpointSync(ServerClient(server.url), bench.workdir / "sync"), bench.model, server,
                "checkpoint", 1))
        if "ipc" in bench.args.modes and bench.device.type == "cuda":
            bench.stage("ipc", lambda: time_pushes(bench, IpcSync(ServerClient(server.url)), bench.model, server,
                                                   "ipc", 100))
    finally:
        server.stop()


def run_lora_server(bench: Bench) -> None:
    lora_model = apply_lora(bench.model, LoraSettings())  # peft wraps the model's own modules: the last stage
    server = bench.server("lora", lora=True)
    try:
        time_pushes(bench, LoraSync(ServerClient(server.url)), lora_model, server, "lora", 1)
    finally:
        server.stop()


def run(bench: Bench) -> None:
    if "inprocess" in bench.args.modes:
        bench.result["sync"]["inprocess"] = _with_target("inprocess", {
            "push_s": InProcessSync().push(bench.model, 0).seconds, "push_mb": 0.0,
            **bench.memory_row(bench.model, None)})
    bench.stage("full-model server", lambda: run_full_model_server(bench))
    if bench.args.clients:
        bench.stage("in-process engine", lambda: in_process_load(bench))
    if "lora" in bench.args.modes:
        bench.stage("lora", lambda: run_lora_server(bench))
    if bench.device.type != "cuda":
        bench.result["sync"]["ipc"] = {"note": "needs CUDA (same GPU, two processes)"}
    bench.result["sync"]["nccl"] = {"note": "needs a second GPU: bench/nccl_sync.py; code tested over gloo on CPU"}
    if "in_process" in bench.result:
        in_process = bench.result["in_process"]["tok_s"]
        for rounds in bench.result.get("by_client_procs", {}).values():
            rounds["new_over_in_process"] = rounds["load"]["tok_s"] / in_process
            rounds["kept_over_in_process"] = rounds["load_reused"]["tok_s"] / in_process
        if "load" in bench.result:
            bench.result["server_over_in_process"] = bench.result["load"]["tok_s"] / in_process
            bench.result["server_reused_over_in_process"] = bench.result["load_reused"]["tok_s"] / in_process
    bench.result["complete"] = True
    bench.save()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--clients", type=int, help="concurrent streaming clients (0: no load test; default 64)")
    parser.add_argument("--prompt-len", type=int, help="default 128")
    parser.add_argument("--new-tokens", type=int, help="default 256")
    parser.add_argument("--repeats", type=int, help="timed pushes per mode, after a first one (default 5)")
    parser.add_argument("--client-procs", type=int, nargs="+", default=[1],
                        help="split the clients over this many processes; several values: a load test each (the "
                             "first is \"load\" / \"load_reused\"; all under \"by_client_procs\")")
    parser.add_argument("--kv-share", type=float, default=0.25, help="engine.gpu_memory_utilization of each engine")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny tied arch on the CPU; unless given: 8 clients, 8-token prompts, 16 tokens, "
                             "2 repeats")
    parser.add_argument("--out", type=Path, default=Path("bench/out/serve.json"))
    parser.add_argument("--print", type=Path, metavar="JSON", help="print the tables of a finished run and exit")
    args = parser.parse_args(argv)
    defaults = {"clients": 8, "prompt_len": 8, "new_tokens": 16, "repeats": 2} if args.cpu_smoke else \
        {"clients": 64, "prompt_len": 128, "new_tokens": 256, "repeats": 5}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.cpu_smoke:
        args.arch = "tiny-tied"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print:
        print_table(json.loads(args.print.read_text()))
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, gradient_checkpointing=False).eval()
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(args, model, device, Path(tmp))
        bench.save()
        run(bench)
    print_table(bench.result)
    return 1 if bench.result["errors"] else 0


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_table(result: dict) -> None:
    print(f"{result['arch']} on {result['device']}, weights {result['weights_gib']:.3f} GiB, "
          f"versions {result['versions']}")
    columns = ("first_push_s", "push_s", "push_max_s", "target_s", "meets_target", "push_mb", "trainer_weights_gib",
               "server_weights_gib", "weight_copies", "device_used_gib")
    print("| sync mode | first push s | push s (median) | push s (max) | target s | meets | MB sent | trainer weights "
          "GiB | server-owned weights GiB | weight copies on GPU | device used GiB |")
    print("|---" * (len(columns) + 1) + "|")
    for mode, row in result["sync"].items():
        if "note" in row:
            print(f"| {mode} | {row['note']} |" + " |" * (len(columns) - 1))
            continue
        print(f"| {mode} | " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    by_procs = rounds_by_procs(result)
    for procs, rounds in by_procs.items():
        for name, how in (("load", "new connections"), ("load_reused", "kept-alive connections")):
            if name in rounds:
                _print_load(rounds[name], f"{how}, {procs} client process{'es' if procs != '1' else ''}")
    engine = result.get("in_process")
    if engine:
        print(f"in-process engine, the same {result['clients']} sequences in one call: {engine['tok_s']:.0f} tok/s")
    for procs, rounds in by_procs.items():
        if "kept_over_in_process" in rounds:
            print(f"server / in-process throughput, {procs} client process{'es' if procs != '1' else ''}: "
                  f"{rounds['new_over_in_process']:.2f} (new connections), {rounds['kept_over_in_process']:.2f} "
                  f"(kept-alive)")
    for stage in result["errors"]:
        print(f"stage {stage} FAILED (traceback in the JSON's errors)")



def rounds_by_procs(result: dict) -> dict[str, dict]:
    """A run's load-test rounds and ratios by client-process count (runs before 2026-12-07: one process)."""
    if "by_client_procs" in result:
        return result["by_client_procs"]
    rounds = {name: result[name] for name in ("load", "load_reused") if name in result}
    if "server_reused_over_in_process" in result:
        rounds["new_over_in_process"] = result["server_over_in_process"]
        rounds["kept_over_in_process"] = result["server_reused_over_in_process"]
    return {"1": rounds}


def _print_load(load: dict, how: str) -> None:
    print(f"{load['clients']} streaming clients, {how}: {load['tok_s']:.0f} tok/s in {load['wall_s']:.3f} s, latency "
          f"p50 {load['latency_p50_s']:.2f} s p99 {load['latency_p99_s']:.2f} s, TTFT p50 {load['ttft_p50_s']:.3f} s "
          f"p99 {load['ttft_p99_s']:.3f} s")
    if "headers_p50_s" in load:  # runs before these were recorded lack them
        sent = f"; the client's share, until the request was written: p50 {load['sent_p50_s']:.3f} s, last " \
               f"{load['sent_max_s']:.3f} s" if "sent_p50_s" in load else ""
        print(f"  TTFT = to the response headers (connect, HTTP: p50 {load['headers_p50_s']:.3f} s, last "
              f"{load['headers_max_s']:.3f} s{sent}) + from them to the first token "
              f"(p50 {load['headers_to_first_token_p50_s']:.3f} s)")
    if "server_first_token_mean_s" in load:
        print(f"  server side: waits for the engine thread {load['server_queue_wait_mean_s']:.3f} s, arrival to "
              f"first token sent {load['server_first_token_mean_s']:.3f} s (means); engine stepping "
              f"{load['engine_step_share']:.0%} of the wall time, {load['engine_steps']:.0f} steps")


if __name__ == "__main__":
    sys.exit(main())
