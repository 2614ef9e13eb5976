"""sync.kind = "nccl" between two GPUs (issue 36 point 3): this process is the trainer on --trainer-device, a
`tandemrl serve` process serves the same architecture on --server-device; the time of a full weight push (the push
returns once the server has applied it), the trainer's extra memory during a push (one bucket, not a second copy of
the weights) and a check that the served weights equal the trainer's (the server's checksum, GET
/v1/weights/checksum, against the trainer's; the server starts from other weights, so only a whole push makes them
equal).

Random bf16 weights of each architecture. Per architecture: a first push (joins the group, allocates the buckets
and the server's staging), then --pushes timed pushes (median, min, max). Targets: 0.5B <= 0.15 s (TRL's figure),
7B <= 1.0 s. The JSON is written after every architecture (a time-out keeps the finished ones).

GPU (2 GPUs):  python -m bench.nccl_sync --archs qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b
CPU (gloo):    python -m bench.nccl_sync --cpu-smoke
The table again: python -m bench.nccl_sync --print bench/out/nccl_sync.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import socket
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import httpx
import torch

TARGET_S = {"qwen2.5-0.5b": 0.15, "qwen2.5-7b": 1.0}
GIB = 2**30


def build_random(arch: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from bench.grpo_step import ARCHITECTURES
    from bench.multi_gpu import LARGE_ARCHITECTURES

    torch.manual_seed(0)
    with torch.device(device):  # initialised where it lives: no detour through host memory
        model = AutoModelForCausalLM.from_config(Qwen2Config(**{**ARCHITECTURES, **LARGE_ARCHITECTURES}[arch]),
                                                 dtype=dtype)
    return model.eval().requires_grad_(False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(arch: str, args: argparse.Namespace, work: Path) -> dict:
    from bench.serve_process import ServerProcess, save_model_dir
    from tandemrl.sync.checksum import weights_checksum
    from tandemrl.sync.client import ServerClient
    from tandemrl.sync.nccl import NcclSync, named_weights

    device = torch.device(args.trainer_device)
    model = build_random(arch, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    weights_gib = sum(p.numel() * p.element_size() for _, p in named_weights(model)) / GIB
    started = time.perf_counter()
    model_dir = save_model_dir(model, work / arch)
    server = ServerProcess(model_dir, args.server_device, args.server_kv_share, False, work / f"server-{arch}.log")
    print(f"[{arch}] {weights_gib:.2f} GiB of weights; saved and served in {time.perf_counter() - started:.0f} s",
          flush=True)
    sync = NcclSync(ServerClient(server.url), f"tcp://127.0.0.1:{free_port()}",
                    "nccl" if device.type == "cuda" else "gloo", timeout_s=args.timeout, bucket_mb=args.bucket_mb)
    try:
        with torch.no_grad():
            for _, p in named_weights(model):
                p.neg_()  # the server serves the saved weights: only a whole push makes the checksums equal
        ours = weights_checksum(named_weights(model))
        served_before = served_checksum(server.url)
        first = sync.push(model, 1).seconds
        sync_device(device)
        allocated = memory_allocated(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        pushes = [sync.push(model, 2 + i) for i in range(args.pushes)]
        extra_mib = (max_memory_allocated(device) - allocated) / 2**20
        served_after = served_checksum(server.url)
    finally:
        sync.close()
        server.stop()
        shutil.rmtree(model_dir, ignore_errors=True)
    seconds = [p.seconds for p in pushes]
    median = statistics.median(seconds)
    target = TARGET_S.get(arch)
    return {"weights_gib": weights_gib, "bucket_mib": args.bucket_mb, "first_push_s": first, "push_s": median,
            "min_s": min(seconds), "max_s": max(seconds), "gib_per_s": weights_gib / median,
            "mb_sent": pushes[-1].bytes / 2**20, "sender_extra_mib": extra_mib,
            "checksum_equal": served_after == ours, "checksum_differed_before": served_before != ours,
            "target_s": target, "met": None if target is None else median <= target}


def served_checksum(url: str) -> str:
    return httpx.get(url + "/v1/weights/checksum", timeout=600).json()["checksum"]


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def max_memory_allocated(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def report(rows: dict[str, dict]) -> None:
    print("| model | GiB | bucket MiB | first push s | push s (median) | min / max s | GiB/s | trainer's extra MiB | "
          "served = trainer's | target | met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for arch, r in rows.items():
        if "error" in r:
            print(f"| {arch} | {r['error']} |")
            continue
        checked = "yes" if r["checksum_equal"] and r["checksum_differed_before"] else "**NO**"
        target = f"<= {r['target_s']} s" if r["target_s"] else "-"
        met = "-" if r["met"] is None else ("**yes**" if r["met"] else "no")
        print(f"| {arch} | {r['weights_gib']:.2f} | {r['bucket_mib']:g} | {r['first_push_s']:.3f} | {r['push_s']:.3f} "
              f"| {r['min_s']:.3f} / {r['max_s']:.3f} | {r['gib_per_s']:.1f} | {r['sender_extra_mib']:.0f} | {checked} "
              f"| {target} | {met} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"])
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=256.0, help="sync.nccl_bucket_mb")
    parser.add_argument("--trainer-device", default="cuda:0")
    parser.add_argument("--server-device", default="cuda:1")
    parser.add_argument("--server-kv-share", type=float, default=0.05,
                        help="the server's engine.gpu_memory_utilization")
    parser.add_argument("--timeout", type=float, default=120.0, help="the group's timeout, seconds")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model, server on the CPU, gloo")
    parser.add_argument("--out", type=Path, default=Path("bench/out/nccl_sync.json"))
    parser.add_argument("--print", type=Path, help="print the table of this result file, run nothing")
    args = parser.parse_args()
    if args.print:
        report(json.loads(args.print.read_text())["rows"])
        return
    if args.cpu_smoke:
        args.archs, args.trainer_device, args.server_device, args.pushes, args.bucket_mb = \
            ["tiny"], "cpu", "cpu", 2, 0.05
    args.out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.cpu_smoke else \
        platform.processor() or "cpu"
    result = {"date": date.today().isoformat(), "torch": torch.__version__, "device": device,
              "trainer_device": args.trainer_device, "server_device": args.server_device, "rows": {}}
    with tempfile.TemporaryDirectory(prefix="nccl-sync-") as tmp:
        for arch in args.archs:
            try:
                result["rows"][arch] = measure(arch, args, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - recorded, the next architecture still runs
                result["rows"][arch] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                for log in Path(tmp).glob(f"server-{arch}.log"):
                    print(log.read_text(errors="replace")[-2000:])
            print(f"[{arch}] {result['rows'][arch]}", flush=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    report(result["rows"])
    if any("error" in r or not r["checksum_equal"] for r in result["rows"].values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
