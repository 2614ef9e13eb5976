"""Diagnostic (not committed): where a speculative step's time goes, with a CUDA-only profiler and host wrappers."""
import sys, time, functools
from collections import defaultdict
import torch
from bench.speculative import make_engine, run, warm_up, decode_step_s, random_prompts
from bench.grpo_step import build_model
from bench.profile_engine import print_idle_gaps
from tandemrl.engine.speculative import DRAFT, SpeculativeConfig
from tandemrl.engine.step import TARGET
import tandemrl.engine.model.pending as pending
import tandemrl.engine.engine as eng
import tandemrl.engine.scheduler as sch
import tandemrl.engine.model.runner as rn

class Args: num_blocks = 4096; prompt_len = 128; new_tokens = 256
dev = torch.device("cuda")
target = build_model("qwen2.5-1.5b", dev, torch.bfloat16, False).eval()
draft = build_model("qwen2.5-0.5b", dev, torch.bfloat16, False).eval()
vocab = target.config.vocab_size
acc = defaultdict(float)
def wrap(obj, name, key):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **kw):
        t = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            acc[key] += time.perf_counter() - t
    setattr(obj, name, g)
wrap(pending.PendingTokens, "result", "wait(result)")
wrap(sch.Scheduler, "schedule", "schedule")
wrap(sch.Scheduler, "postprocess", "postprocess")
wrap(rn.ModelRunner, "launch", "launch")
for batch, k, a in [(1, 2, 0.8), (1, 4, 0.9), (8, 2, 0.8), (8, 4, 0.6)]:
    plain = decode_step_s(target, batch, Args, dev)
    engine = make_engine({TARGET: target, DRAFT: draft}, 4096, dev, SpeculativeConfig(method="draft", num_tokens=k), a)
    once = lambda seed=2: run(engine, random_prompts(batch, 128, vocab, seed), 256, dev)
    warm_up(engine, once)
    acc.clear(); s0 = engine.stats()["steps"]
    t = once(4)
    steps = engine.stats()["steps"] - s0
    print(f"batch {batch} k {k} a {a}: plain {plain*1e3:.2f} ms/token, run {t*1e3:.1f} ms, {steps} steps, "
          f"{t/steps*1e3:.2f} ms/step; host per step: " + ", ".join(f"{n} {v/steps*1e3:.3f}" for n, v in acc.items()))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        once(5)
    print_idle_gaps(prof)
    tot = defaultdict(float); cnt = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            tot[e.name[:60]] += e.time_range.end - e.time_range.start; cnt[e.name[:60]] += 1
    for n, v in sorted(tot.items(), key=lambda x: -x[1])[:25]:
        print(f"   {v/steps:9.1f} us/step  {cnt[n]/steps:5.1f}/step  {n}")
    engine = None; torch.cuda.empty_cache()
