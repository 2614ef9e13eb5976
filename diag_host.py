"""Host time per tandem burst vs time waiting for the device (no profiler)."""
import copy, time, sys
import torch
from bench.grpo_step import build_model
from bench.engine_throughput import engine_run, random_prompts
from tandemrl.backends.engine_backend import EngineBackend
from tandemrl.engine.config import EngineConfig
from tandemrl.engine.tandem import TandemConfig
from tandemrl.engine.model import pending as pending_mod
from tandemrl.engine.model.runner import ModelRunner
from tandemrl.engine import scheduler as sched_mod

import os
from bench.grpo_step import ARCHITECTURES
ARCHITECTURES["qwen3-0.6b"]["num_hidden_layers"] = int(os.environ.get("LAYERS", 28))
device = torch.device("cuda")
model = build_model("qwen3-0.6b", device, torch.bfloat16, False).eval()
frozen = copy.deepcopy(model)
timers = {"launch": 0.0, "wait": 0.0, "schedule": 0.0, "postprocess": 0.0}
counts = {k: 0 for k in timers}

def timed(cls, name, key):
    orig = getattr(cls, name)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            timers[key] += time.perf_counter() - t
            counts[key] += 1
    setattr(cls, name, wrapper)

timed(ModelRunner, "launch", "launch")
timed(pending_mod.PendingTokens, "result", "wait")
timed(sched_mod.Scheduler, "schedule", "schedule")
timed(sched_mod.Scheduler, "postprocess", "postprocess")
for p in [None] + [float(x) for x in sys.argv[1:]]:
    tandem = TandemConfig(enabled=True, p=p) if p is not None else None
    backend = EngineBackend(model, None, EngineConfig(num_blocks=4096), device=device, tandem=tandem,
                            frozen_model=frozen if tandem else None)
    prompts = random_prompts(64, 128, model.config.vocab_size, seed=0)
    for _ in range(2):
        engine_run(backend, prompts, 512)
    for k in timers:
        timers[k] = 0.0; counts[k] = 0
    torch.cuda.synchronize(); t = time.perf_counter()
    engine_run(backend, prompts, 512)
    torch.cuda.synchronize(); total = time.perf_counter() - t
    print(f"p={p}: rollout {total:.3f} s; " + ", ".join(f"{k} {timers[k]:.3f} s / {counts[k]}" for k in timers), flush=True)
    backend.close()
