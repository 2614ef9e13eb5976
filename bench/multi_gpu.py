"""GRPO steps on 1 and 2 GPUs under torchrun + FSDP2: samples/s, the weight gather's share of the step, peak memory
per GPU, and tandem (a frozen copy per rank) against vanilla at 2 GPUs. Random weights of a real architecture and a
fixed output length (EOS ignored): speed does not depend on the weights' values.

Settings (each one torchrun launch, run one after another by this script):
  1 gpu plain       the single-process trainer (no FSDP: the engine reads the trained tensors in place)
  1 gpu fsdp        torchrun --nproc-per-node 1: FSDP2 shards (whole) + the engine's replica + the gather
  2 gpu strong      2 ranks, the same global batch as 1 gpu (each rank samples half the prompts)
  2 gpu weak        2 ranks, each with the 1-gpu batch (twice the global batch): the usual way to scale
  2 gpu tandem      2 gpu weak with tandem rollouts, the frozen model on every rank (p = --tandem-p)

GPU (2x H200):  python -m bench.multi_gpu
CPU (gloo):     python -m bench.multi_gpu --cpu-smoke
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import torch

SETTINGS = {  # name: (processes, prompts multiplier per rank vs the 1-gpu batch, fsdp, tandem)
    "1 gpu plain": (1, 1.0, False, False),
    "1 gpu fsdp": (1, 1.0, True, False),
    "2 gpu strong": (2, 0.5, True, False),
    "2 gpu weak": (2, 1.0, True, False),
    "2 gpu tandem": (2, 1.0, True, True),
}


@dataclass
class StepTimes:
    rollout_s: float
    update_s: float
    gather_s: float

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.update_s + self.gather_s


# ------------------------------------------------------------------------------------------------ one rank


def run_worker(args: argparse.Namespace) -> None:
    """One rank of one setting (launched by torchrun, or directly for '1 gpu plain')."""
    from bench.grpo_step import build_model
    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.config import DistributedConfig, TrainConfig
    from tandemrl.distributed.env import destroy_process_group, init_process_group
    from tandemrl.distributed.fsdp import WeightGather, plain_replica
    from tandemrl.train.sharding import shard_model
    from tandemrl.distributed.parallel import Distributed, SingleProcess
    from tandemrl.engine.config import EngineConfig
    from tandemrl.engine.tandem import TandemConfig
    from tandemrl.train.optim import build_optimizer, build_scheduler

    processes, per_rank, fsdp, tandem = SETTINGS[args.setting]
    info = init_process_group(DistributedConfig(), "cpu" if args.cpu_smoke else "auto") if fsdp else None
    device = info.device if info else torch.device("cpu" if args.cpu_smoke else "cuda")
    parallel = Distributed(info) if info else SingleProcess()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.arch, device, dtype, args.gradient_checkpointing)
    frozen = copy.deepcopy(model).eval().requires_grad_(False) if tandem else None
    engine_model, gather = model, None
    if fsdp:
        engine_model = plain_replica(model)
        shard_model(model)
        gather = WeightGather(model, engine_model)
    cfg = TrainConfig(lr=1e-6, micro_batch_size=args.micro_batch, max_steps=args.repeats + 1)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg)
    tandem_cfg = TandemConfig(enabled=True, p=args.tandem_p, max_run_tokens=args.max_run_tokens) if tandem else None
    backend = EngineBackend(engine_model, None, EngineConfig(num_blocks=args.num_blocks), device=device,
                            tandem=tandem_cfg, frozen_model=frozen)
    prompts = max(1, round(args.prompts * per_rank))
    step = functools.partial(one_step, model, backend, optimizer, scheduler, cfg, args, device, parallel, gather,
                             prompts)
    step(1000)  # warm-up at full shape: allocator pools, graphs, optimizer state
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runs = [step(seed) for seed in range(args.repeats)]
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    peaks = gather_all(parallel, peak)
    median = sorted(runs, key=lambda t: t.step_s)[len(runs) // 2]
    if parallel.is_main:
        samples = prompts * args.group * parallel.world_size
        row = {"processes": processes, "global_samples": samples, **asdict(median), "step_s": median.step_s,
               "samples_per_s": samples / median.step_s, "gather_share": median.gather_s / median.step_s,
               "peak_gib_per_gpu": peaks}
        Path(args.result).write_text(json.dumps(row) + "\n")
    backend.close()
    if info is not None:
        parallel.barrier()  # no rank closes its connections while another still uses them
        destroy_process_group()


def one_step(model, backend, optimizer, scheduler, cfg, args, device, parallel, gather, prompts: int,
             seed: int) -> StepTimes:
    """Rollout of this rank's prompts, the GRPO update over all ranks' rows, the gather into the engine's replica.
    Each phase is timed to its slowest rank (a barrier-like max), as the job waits for it."""
    from tandemrl.algo.advantages import ADVANTAGES
    from tandemrl.train.batch import build_batch
    from tandemrl.train.update import policy_update
    from tandemrl.types import Request, SamplingParams

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed * 1000 + parallel.rank)
    ids = torch.randint(0, vocab, (prompts, args.prompt_len), generator=gen).tolist()
    params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, seed=seed)
    requests = [Request(f"{i}-{j}", p, params) for i, p in enumerate(ids) for j in range(args.group)]
    start = synced(device)
    rollouts = backend.generate(requests)
    rollout_s = synced(device) - start
    rewards = torch.rand(len(rollouts), generator=gen)
    advantages = ADVANTAGES.get("grpo")(rewards, torch.ones_like(rewards, dtype=torch.bool), args.group)
    start = synced(device)
    backend.sleep()
    batch = build_batch(rollouts, advantages, pad_id=0, device=device)
    policy_update(model, batch, optimizer, scheduler, cfg, temperature=1.0, max_completion_length=args.new_tokens,
                  global_norm=parallel.global_norm)
    update_s = synced(device) - start
    gather_s = gather.refresh() if gather is not None else 0.0
    backend.wake()
    return StepTimes(*(slowest(parallel, t) for t in (rollout_s, update_s, gather_s)))


def synced(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def slowest(parallel, seconds: float) -> float:
    return max(gather_all(parallel, seconds))


def gather_all(parallel, value: float) -> list[float]:
    if parallel.world_size == 1:
        return [value]
    import torch.distributed as dist

    out: list[float | None] = [None] * parallel.world_size
    dist.all_gather_object(out, value)
    return [float(v) for v in out]


# ------------------------------------------------------------------------------------------------ driver


def launch(setting: str, args: argparse.Namespace, result: Path) -> dict:
    processes, _, fsdp, _ = SETTINGS[setting]
    worker = ["-m", "bench.multi_gpu", "--worker", "--setting", setting, "--result", str(result),
              *forwarded(args)]
    if fsdp:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
                   *worker]
    else:
        command = [sys.executable, *worker]
    print(f"[{setting}] {' '.join(command)}", flush=True)
    # the repository in front of PYTHONPATH, keeping what is there (a GPU machine's carried wheels)
    paths = os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": paths})
    if done.returncode != 0:
        return {"error": f"exit status {done.returncode}"}
    return json.loads(result.read_text())


def forwarded(args: argparse.Namespace) -> list[str]:
    flags = ["--arch", args.arch, "--prompts", str(args.prompts), "--group", str(args.group),
             "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
             "--micro-batch", str(args.micro_batch), "--repeats", str(args.repeats),
             "--num-blocks", str(args.num_blocks), "--tandem-p", str(args.tandem_p),
             "--max-run-tokens", str(args.max_run_tokens)]
    return flags + (["--gradient-checkpointing"] if args.gradient_checkpointing else []) + \
        (["--cpu-smoke"] if args.cpu_smoke else [])


def report(rows: dict[str, dict]) -> dict:
    base = rows.get("1 gpu plain", {}).get("samples_per_s")
    vanilla = rows.get("2 gpu weak", {}).get("step_s")
    print("| setting | ranks | global samples | step s | rollout s | update s | gather s | gather share | "
          "samples/s | vs 1 gpu plain | peak GiB per GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        if "error" in row:
            print(f"| {name} | {row['error']} |")
            continue
        ratio = f"{row['samples_per_s'] / base:.2f}x" if base else "-"
        peaks = " / ".join(f"{p:.1f}" for p in row["peak_gib_per_gpu"])
        print(f"| {name} | {row['processes']} | {row['global_samples']} | {row['step_s']:.2f} | {row['rollout_s']:.2f} "
              f"| {row['update_s']:.2f} | {row['gather_s']:.3f} | {100 * row['gather_share']:.1f} % | "
              f"{row['samples_per_s']:.1f} | {ratio} | {peaks} |")
    tandem = rows.get("2 gpu tandem", {}).get("step_s")
    summary = {
        "speedup_2gpu_weak": rows["2 gpu weak"]["samples_per_s"] / base if base and vanilla else None,
        "speedup_2gpu_strong": (rows["2 gpu strong"]["samples_per_s"] / base
                                if base and "samples_per_s" in rows.get("2 gpu strong", {}) else None),
        "tandem_over_vanilla_2gpu": tandem / vanilla if tandem and vanilla else None,
    }
    print(json.dumps(summary))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from bench.grpo_step import add_step_shape_args  # deferred like the other imports of the model code

    add_step_shape_args(parser, repeats=3, prompts_help="prompts per step on 1 GPU")
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--tandem-p", type=float, default=0.5)
    parser.add_argument("--max-run-tokens", type=int, default=3)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model, short rollouts, CPU and gloo")
    parser.add_argument("--out", type=Path, default=Path("bench/out/multi_gpu.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpu_smoke and not args.worker:
        args.arch, args.prompts, args.group, args.prompt_len, args.new_tokens = "tiny", 2, 2, 8, 8
        args.repeats, args.num_blocks, args.micro_batch = 1, 64, 4
    if args.worker:
        run_worker(args)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = {name: launch(name, args, args.out.with_name(f".{args.out.stem}-{i}.json"))
            for i, name in enumerate(args.settings)}
    summary = report(rows)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.cpu_smoke else \
        platform.processor() or "cpu"
    result = {"date": date.today().isoformat(), "torch": torch.__version__, "device": device, "arch": args.arch,
              "shape_per_gpu": f"{args.prompts}x{args.group}x{args.new_tokens}", "rows": rows, **summary}
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
