"""GRPO steps on 1 and 2 GPUs under torchrun, replicated (a full copy per rank, gradients all-reduced once per
optimizer step, the engine decoding the trained tensors) or FSDP2-sharded (the engine's replica refreshed by an
all-gather): samples/s, the gradient all-reduce's and the weight gather's share of the step, peak memory per GPU, and
tandem (a frozen copy per rank) at 2 GPUs. Random weights of a real architecture and a fixed output length (EOS
ignored): speed does not depend on the weights' values.

Settings (each one launch, run one after another; the multi-GPU ones once per --strategies entry, e.g.
"2 gpu weak / replicate"):
  1 gpu plain       the single-process trainer (the engine reads the trained tensors in place)
  1 gpu fsdp        torchrun --nproc-per-node 1, sharded: FSDP2 (whole) + the engine's replica + the gather
  2 gpu strong      2 ranks, the same global batch as 1 gpu (each rank samples half the prompts)
  2 gpu weak        2 ranks, each with the 1-gpu batch (twice the global batch): the usual way to scale
  2 gpu tandem      2 gpu weak with tandem rollouts, the frozen model on every rank (p = --tandem-p)
  4 gpu strong      4 ranks, the 1-gpu global batch (each rank a quarter of the prompts)
  4 gpu weak        4 ranks, each with the 1-gpu batch
  2 gpu tp          2 gpu weak's global batch through one tensor-parallel engine over both ranks
                    (engine.tensor_parallel_size = 2: each rank holds half the engine's weights and KV cache,
                    refreshed slice by slice from the trained model; each rank trains on half the rollouts)
  4 gpu tp          the same with one engine over 4 ranks (engine.tensor_parallel_size = 4)

GPU (2 GPUs):   python -m bench.multi_gpu --strategies replicate shard
GPU (4 GPUs):   python -m bench.multi_gpu --settings "1 gpu plain" "4 gpu weak" "4 gpu strong"
7B:             python -m bench.multi_gpu --arch qwen2.5-7b --gradient-checkpointing --strategies shard \
                    --settings "2 gpu weak"          (full fine-tune, sharded);  add --lora: LoRA, replicated
CPU (gloo):     python -m bench.multi_gpu --cpu-smoke
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import torch

SETTINGS = {  # name: (processes, prompts multiplier per rank vs the 1-gpu batch, torchrun, tandem)
    "1 gpu plain": (1, 1.0, False, False),
    "1 gpu fsdp": (1, 1.0, True, False),
    "2 gpu strong": (2, 0.5, True, False),
    "2 gpu weak": (2, 1.0, True, False),
    "2 gpu tandem": (2, 1.0, True, True),
    "4 gpu strong": (4, 0.25, True, False),
    "4 gpu weak": (4, 1.0, True, False),
    "2 gpu tp": (2, 1.0, True, False),
    "4 gpu tp": (4, 1.0, True, False),
}
TENSOR_PARALLEL = {"2 gpu tp": 2, "4 gpu tp": 4}  # engine.tensor_parallel_size of a setting (1 when absent)
FIXED_STRATEGY = {"1 gpu plain": "none", "1 gpu fsdp": "shard"}
UPDATE_SPAN = "grpo_update"  # the profiled step's annotation around the update (bench/comm_overlap.py)

# Architectures beyond bench/grpo_step.py's (Qwen2.5-7B's published configuration).
LARGE_ARCHITECTURES = {
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwen2.5-14b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                        num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=32768,
                        rope_theta=1_000_000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
}


@dataclass
class StepTimes:
    rollout_s: float
    update_s: float  # the gradient all-reduce included
    gather_s: float
    reduce_s: float  # of update_s: the replicated gradients' all-reduce (0 when sharded: FSDP's is inside backward)

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.update_s + self.gather_s


# ------------------------------------------------------------------------------------------------ one rank


def build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from bench.grpo_step import build_model

    if args.arch not in LARGE_ARCHITECTURES:
        model = build_model(args.arch, device, dtype, args.gradient_checkpointing)
    else:
        from transformers import AutoModelForCausalLM, Qwen2Config

        torch.manual_seed(0)
        with torch.device(device):  # initialised on the GPU: no 30 GB detour through host memory
            model = AutoModelForCausalLM.from_config(Qwen2Config(**LARGE_ARCHITECTURES[args.arch]), dtype=dtype)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    if args.lora:
        from tandemrl.models.lora import LoraSettings, apply_lora

        model = apply_lora(model, LoraSettings(rank=args.lora_rank, alpha=2 * args.lora_rank))
    return model


def run_worker(args: argparse.Namespace) -> None:
    """One rank of one setting (launched by torchrun, or directly for '1 gpu plain')."""
    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.config import DistributedConfig, TrainConfig
    from tandemrl.distributed.env import destroy_process_group, init_process_group
    from tandemrl.distributed.parallel import Distributed, SingleProcess
    from tandemrl.engine.config import EngineConfig
    from tandemrl.tandem.config import TandemConfig
    from tandemrl.train.optim import build_optimizer, build_scheduler
    from tandemrl.train.sharding import distribute_model

    processes, per_rank, torchrun, tandem = SETTINGS[args.setting]
    tp = TENSOR_PARALLEL.get(args.setting, 1)
    info = init_process_group(DistributedConfig(), "cpu" if args.cpu_smoke else "auto") if torchrun else None
    device = info.device if info else torch.device("cpu" if args.cpu_smoke else "cuda")
    parallel = Distributed(info, tp) if info else SingleProcess()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build(args, device, dtype)
    frozen = copy.deepcopy(model).eval().requires_grad_(False) if tandem else None
    engine_model, gather, reduce, group = model, None, None, None
    if torchrun:
        placed = distribute_model(model, args.strategy, parallel.world_size, device, lora=args.lora,
                                  tensor_parallel_size=tp)
        engine_model, gather, reduce = placed.engine_model, placed.engine_weights, placed.reduce_gradients
        group = placed.tensor_parallel
    cfg = TrainConfig(lr=1e-6, micro_batch_size=args.micro_batch, max_steps=args.repeats + 1)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg)
    tandem_cfg = TandemConfig(enabled=True, p=args.tandem_p, max_run_tokens=args.max_run_tokens) if tandem else None
    backend = EngineBackend(engine_model, None, EngineConfig(num_blocks=args.num_blocks, tensor_parallel_size=tp),
                            device=device, tandem=tandem_cfg, frozen_model=frozen, tensor_parallel=group)
    prompts = max(1, round(args.prompts * per_rank)) * tp  # an engine's prompts: its ranks train on 1/tp each
    timed_reduce = TimedReduce(reduce, device) if reduce is not None else None
    step = functools.partial(one_step, model, backend, optimizer, scheduler, cfg, args, device, parallel, gather,
                             timed_reduce, prompts)
    step(1000)  # warm-up at full shape: allocator pools, graphs, optimizer state
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runs = [step(seed) for seed in range(args.repeats)]
    comm_overlap = profile_step(step, args, parallel) if args.profile else None
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    peaks = gather_all(parallel, peak)
    median = sorted(runs, key=lambda t: t.step_s)[len(runs) // 2]
    if parallel.is_main:
        samples = prompts * args.group * parallel.world_size // tp
        strategy = placed.choice.strategy if torchrun else "none"
        row = {"processes": processes, "strategy": strategy, "tensor_parallel_size": tp, "global_samples": samples,
               **asdict(median),
               "step_s": median.step_s, "samples_per_s": samples / median.step_s,
               "gather_share": median.gather_s / median.step_s, "reduce_share": median.reduce_s / median.step_s,
               "peak_gib_per_gpu": peaks, **({"overlap": comm_overlap} if comm_overlap else {})}
        Path(args.result).write_text(json.dumps(row) + "\n")
    backend.close()
    if info is not None:
        parallel.barrier()  # no rank closes its connections while another still uses them
        destroy_process_group()


@dataclass
class TimedReduce:
    """The replicated gradients' all-reduce, timed (synchronised before and after: a few ms of lost overlap)."""

    reduce: object
    device: torch.device
    seconds: float = 0.0

    def __call__(self) -> None:
        start = synced(self.device)
        self.reduce()
        self.seconds += synced(self.device) - start


def profile_step(step, args: argparse.Namespace, parallel) -> dict | None:
    """One more step, its update under torch.profiler; rank 0's Chrome trace into --profile (communication vs
    compute) and the share of the update's NCCL kernel time that ran beside compute kernels (None on other ranks)."""
    from torch.profiler import ProfilerActivity, profile

    from bench.comm_overlap import overlap

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities)
    step(2000, profiler=prof)
    if not parallel.is_main:
        return None
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{args.arch}-{args.setting.replace(' ', '_')}-{args.strategy}.json"
    prof.export_chrome_trace(str(out / name))
    summary = overlap(json.loads((out / name).read_text()), UPDATE_SPAN)
    with open(out / name, "rb") as raw, gzip.open(out / f"{name}.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)  # a tenth of the size; chrome://tracing and Perfetto read it
    (out / name).unlink()
    return summary


def one_step(model, backend, optimizer, scheduler, cfg, args, device, parallel, gather, reduce, prompts: int,
             seed: int, profiler=None) -> StepTimes:
    """Rollout of this rank's prompts, the GRPO update over all ranks' rows, the gather into the engine's replica
    (sharded only). Each phase is timed to its slowest rank (a barrier-like max), as the job waits for it.
    ``profiler``: a torch.profiler.profile that records the update only."""
    from tandemrl.algo.advantages import ADVANTAGES
    from tandemrl.train.batch import build_batch
    from tandemrl.train.update import policy_update
    from tandemrl.types import Request, SamplingParams

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(parallel.rollout_seed(seed * 1000))  # the ranks of one engine: one seed
    ids = torch.randint(0, vocab, (prompts, args.prompt_len), generator=gen).tolist()
    params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, seed=seed)
    requests = [Request(f"{i}-{j}", p, params) for i, p in enumerate(ids) for j in range(args.group)]
    start = synced(device)
    rollouts = backend.generate(requests)
    rollout_s = synced(device) - start
    rewards = torch.rand(len(rollouts), generator=gen)
    advantages = ADVANTAGES.get("grpo")(rewards, torch.ones_like(rewards, dtype=torch.bool), args.group)
    if reduce is not None:
        reduce.seconds = 0.0
    with profiler or contextlib.nullcontext(), torch.profiler.record_function(UPDATE_SPAN):  # --profile's window
        start = synced(device)
        backend.sleep()
        rows = parallel.train_rows(len(rollouts))  # a tensor-parallel engine's rank trains on its share
        batch = build_batch(rollouts[rows], advantages[rows], pad_id=0, device=device)
        policy_update(model, batch, optimizer, scheduler, cfg, temperature=1.0, max_completion_length=args.new_tokens,
                      global_norm=parallel.global_norm, any_rank=parallel.any if parallel.world_size > 1 else None,
                      reduce_gradients=reduce)
        update_s = synced(device) - start
    gather_s = gather.refresh() if gather is not None else 0.0
    backend.wake()
    reduce_s = reduce.seconds if reduce is not None else 0.0
    return StepTimes(*(slowest(parallel, t) for t in (rollout_s, update_s, gather_s, reduce_s)))


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


def planned_rows(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(row name, setting, strategy) in launch order: a multi-GPU setting once per strategy."""
    rows = []
    for setting in args.settings:
        if setting in FIXED_STRATEGY:
            rows.append((setting, setting, FIXED_STRATEGY[setting]))
        else:
            rows += [(f"{setting} / {strategy}", setting, strategy) for strategy in args.strategies]
    return rows


def launch(setting: str, strategy: str, args: argparse.Namespace, result: Path) -> dict:
    processes, _, torchrun, _ = SETTINGS[setting]
    worker = ["-m", "bench.multi_gpu", "--worker", "--setting", setting, "--strategy", strategy,
              "--result", str(result), *forwarded(args)]
    if torchrun:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
                   *worker]
    else:
        command = [sys.executable, *worker]
    print(f"[{setting} / {strategy}] {' '.join(command)}", flush=True)
    # the repository in front of PYTHONPATH, keeping what is there (a GPU machine's carried wheels)
    paths = os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])
    result.unlink(missing_ok=True)
    try:
        done = subprocess.run(command, env={**os.environ, "PYTHONPATH": paths}, timeout=args.launch_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over --launch-timeout {args.launch_timeout:g} s"}
    if done.returncode != 0 or not result.is_file():
        return {"error": f"exit status {done.returncode}"}
    return json.loads(result.read_text())


def forwarded(args: argparse.Namespace) -> list[str]:
    flags = ["--arch", args.arch, "--prompts", str(args.prompts), "--group", str(args.group),
             "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
             "--micro-batch", str(args.micro_batch), "--repeats", str(args.repeats),
             "--num-blocks", str(args.num_blocks), "--tandem-p", str(args.tandem_p),
             "--max-run-tokens", str(args.max_run_tokens), "--lora-rank", str(args.lora_rank)]
    return flags + (["--gradient-checkpointing"] if args.gradient_checkpointing else []) + \
        (["--cpu-smoke"] if args.cpu_smoke else []) + (["--lora"] if args.lora else []) + \
        (["--profile", str(args.profile)] if args.profile else [])


def report(rows: dict[str, dict]) -> dict:
    base = rows.get("1 gpu plain", {}).get("samples_per_s")
    print("| setting | ranks | global samples | step s | rollout s | update s | grad all-reduce s | gather s | "
          "samples/s | vs 1 gpu plain | peak GiB per GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        if "error" in row:
            print(f"| {name} | {row['error']} |")
            continue
        ratio = f"{row['samples_per_s'] / base:.2f}x" if base else "-"
        peaks = " / ".join(f"{p:.1f}" for p in row["peak_gib_per_gpu"])
        print(f"| {name} | {row['processes']} | {row['global_samples']} | {row['step_s']:.2f} | {row['rollout_s']:.2f} "
              f"| {row['update_s']:.2f} | {row.get('reduce_s', 0.0):.3f} | {row['gather_s']:.3f} | "
              f"{row['samples_per_s']:.1f} | {ratio} | {peaks} |")
    overlap_table([(name, row) for name, row in rows.items()])
    summary: dict[str, float | None] = {}
    for name, row in rows.items():
        if not name.startswith("1 gpu") and "samples_per_s" in row:
            key = "speedup_" + name.replace(" / ", "_").replace(" ", "_")
            summary[key] = row["samples_per_s"] / base if base else None
    for strategy in ("replicate", "shard"):
        tandem = rows.get(f"2 gpu tandem / {strategy}", {}).get("step_s")
        vanilla = rows.get(f"2 gpu weak / {strategy}", {}).get("step_s")
        if tandem and vanilla:
            summary[f"tandem_over_vanilla_2gpu_{strategy}"] = tandem / vanilla
    print(json.dumps(summary))
    return summary


def overlap_table(rows: list[tuple[str, dict]]) -> None:
    """The profiled rows (--profile): rank 0's update, NCCL kernel time and the share of it beside compute."""
    profiled = [(name, row["overlap"]) for name, row in rows if row.get("overlap")]
    if not profiled:
        return
    print("| profiled (rank 0, one update) | update ms | compute kernels ms | NCCL kernels | NCCL ms | "
          "of it beside compute |")
    print("|---|---|---|---|---|---|")
    for name, o in profiled:
        share = f"{o['overlapped_share']:.0%}" if o["overlapped_share"] is not None else "-"
        window = f"{o['window_ms']:.0f}" if o["window_ms"] is not None else "-"
        print(f"| {name} | {window} | {o['compute_ms']:.0f} | {o['nccl_kernels']} | {o['comm_ms']:.1f} | {share} |")


def summarize(files: list[Path]) -> None:
    """One table over several runs' JSON (architectures, strategies): each row against its architecture's 1 gpu
    plain, wherever that row was measured."""
    runs = [json.loads(f.read_text()) for f in files if f.is_file()]
    base = {(r["arch"], r.get("lora", False)): r["rows"].get("1 gpu plain", {}).get("samples_per_s")
            for r in runs if "1 gpu plain" in r["rows"]}
    print("| model | setting | samples/s | vs 1 gpu plain | step s (rollout / update / grad all-reduce / gather) | "
          "peak GiB per GPU |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        model = run["arch"] + (" LoRA" if run.get("lora") else "")
        for name, row in run["rows"].items():
            if "error" in row:
                print(f"| {model} | {name} | {row['error']} | | | |")
                continue
            ref = base.get((run["arch"], run.get("lora", False)))
            ratio = f"{row['samples_per_s'] / ref:.2f}x" if ref else "-"
            peaks = " / ".join(f"{p:.1f}" for p in row["peak_gib_per_gpu"])
            print(f"| {model} | {name} | {row['samples_per_s']:.1f} | {ratio} | {row['step_s']:.2f} "
                  f"({row['rollout_s']:.2f} / {row['update_s']:.2f} / {row.get('reduce_s', 0.0):.3f} / "
                  f"{row['gather_s']:.3f}) | {peaks} |")
    overlap_table([(f"{r['arch']} {name}", row) for r in runs for name, row in r["rows"].items()])
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"no result in: {', '.join(missing)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from bench.grpo_step import ARCHITECTURES, add_step_shape_args  # deferred like the other model code

    add_step_shape_args(parser, repeats=3, prompts_help="prompts per step on 1 GPU")
    for action in parser._actions:  # the large architectures beside grpo_step's
        if action.dest == "arch":
            action.choices = sorted({*ARCHITECTURES, *LARGE_ARCHITECTURES})
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--tandem-p", type=float, default=0.5)
    parser.add_argument("--max-run-tokens", type=int, default=3)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (rank --lora-rank, every linear "
                        "layer); replicated under torchrun")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--settings", nargs="+", default=["1 gpu plain", "2 gpu strong", "2 gpu weak"],
                        choices=list(SETTINGS))
    parser.add_argument("--strategies", nargs="+", default=["replicate"], choices=["replicate", "shard", "auto"],
                        help="distributed.strategy of the multi-GPU settings, one row each")
    parser.add_argument("--launch-timeout", type=float, default=600.0, help="seconds one launch may take")
    parser.add_argument("--profile", type=Path, help="also trace one more step's update per launch (torch.profiler, "
                        "rank 0's Chrome trace into this folder; the NCCL time beside compute in the table)")
    parser.add_argument("--summarize", type=Path, nargs="+", help="print one table of these result files, run nothing")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model, short rollouts, CPU and gloo")
    parser.add_argument("--out", type=Path, default=Path("bench/out/multi_gpu.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cpu_smoke and not args.worker:
        args.arch, args.prompts, args.group, args.prompt_len, args.new_tokens = "tiny", 2, 2, 8, 8
        args.repeats, args.num_blocks, args.micro_batch = 1, 64, 4
    if args.worker:
        run_worker(args)
        return
    if args.summarize:
        summarize(args.summarize)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.cpu_smoke else \
        platform.processor() or "cpu"
    result = {"date": date.today().isoformat(), "torch": torch.__version__, "device": device, "arch": args.arch,
              "lora": args.lora, "shape_per_gpu": f"{args.prompts}x{args.group}x{args.new_tokens}", "rows": {}}
    for i, (name, setting, strategy) in enumerate(planned_rows(args)):
        result["rows"][name] = launch(setting, strategy, args, args.out.with_name(f".{args.out.stem}-{i}.json"))
        args.out.write_text(json.dumps(result, indent=2) + "\n")  # after each row: a timeout keeps the rest
    result.update(report(result["rows"]))
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
