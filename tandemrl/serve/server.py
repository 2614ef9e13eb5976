"""`tandemrl serve MODEL`: load the model as the trainer would (model.* and engine.* of the config), put the
engine behind the HTTP API and run uvicorn on HOST:PORT (port 0: a free one, printed on the first line)."""

from __future__ import annotations

import gc
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from tandemrl.config import Config
from tandemrl.extras import installed
from tandemrl.serve.engine_loop import EngineLoop
from tandemrl.serve.state import Arrivals, ServerState
from tandemrl.serve.warmup import warm_up
from tandemrl.sync.receiver import WeightReceiver
from tandemrl.types import Request

if TYPE_CHECKING:
    import uvicorn

    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.engine.engine import LLMEngine


SWITCH_INTERVAL_S = 0.0005  # bench/RESULTS.md (issue 40): a socket write then waits 0.26 ms for the GIL, not 0.6


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    log_level: str = "warning"
    allow_ipc: bool = False
    warmup: bool = True  # on CUDA: run every decode batch bucket once before listening (warmup.py)


def build_state(cfg: Config, served_name: str, allow_ipc: bool = False, checkpoint: Path | None = None) -> ServerState:
    """Model, tokenizer, engine (tandemrl's own, continuous batching) and its loop thread, not yet started.
    ``checkpoint``: a run's checkpoint (``cfg`` is that run's config); a LoRA adapter is merged into its base."""
    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.models.load import resolve_device
    from tandemrl.train.eval_run import load_merged
    from tandemrl.train.setup import load_policy, set_cpu_threads

    device = resolve_device(cfg.model.device)
    # a run's checkpoint is served as one plain model; otherwise model.lora keeps its adapter (sync.kind = "lora")
    if checkpoint is not None:
        model, tokenizer = load_merged(cfg, checkpoint, device)
    else:
        model, tokenizer = load_policy(cfg.model, device)
    set_cpu_threads(cfg.model.cpu_threads, model, device)
    model.eval().requires_grad_(False)
    backend = EngineBackend(model, tokenizer, cfg.engine, device=device)
    engine = backend.engine
    arrivals = Arrivals()
    loop = serving_loop(engine, arrivals, _seed_reset(backend))
    vocab = _vocab_size(model)
    state = ServerState(loop=loop, tokenizer=tokenizer, model_name=served_name,
                        max_model_len=int(engine.config.max_model_len or 2**31), vocab_size=vocab, arrivals=arrivals)
    state.weights = WeightReceiver(model, loop, "ipc" if allow_ipc else "any")
    return state


def serving_loop(engine: LLMEngine, arrivals: Arrivals,
                 prepare: Callable[[Request, bool], None] | None = None) -> EngineLoop:
    """``engine``'s loop thread, whose idle starts wait for the requests the server is taking in (``arrivals``)."""
    return EngineLoop(engine, prepare=prepare, arriving=lambda: arrivals.count, settle=arrivals.settle)


def _vocab_size(model: nn.Module) -> int:
    return int(model.get_input_embeddings().num_embeddings)


def _seed_reset(backend: EngineBackend) -> Callable[[Request, bool], None]:
    """A seeded request that arrives at an idle engine starts its seed's stream afresh, so the same request with
    the same seed gives the same completion. (Batched with others, the batch shares the first seed's stream.)"""
    def prepare(request: Request, idle: bool) -> None:
        if idle and request.params.seed is not None:
            backend.runner.reset_rng()
    return prepare


def bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections made before uvicorn runs wait in the backlog instead of being refused
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class HttpIO:
    """uvicorn's event loop and HTTP parser."""

    loop: str
    http: str


def fastest_io(available: Callable[[str], bool] = installed) -> HttpIO:
    """uvloop and httptools (C) where installed, else asyncio's own loop and the pure-Python h11, as uvicorn's "auto"
    does; named here so that the server can say which it runs on. Neither is in the `serve` extra: they did not
    measure faster (bench/RESULTS.md, issue 40)."""
    return HttpIO("uvloop" if available("uvloop") else "asyncio", "httptools" if available("httptools") else "h11")


def uvicorn_config(app: Any, io: HttpIO, log_level: str = "warning") -> uvicorn.Config:
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, lifespan="off", loop=io.loop, http=io.http)


def freeze_startup_heap() -> None:
    """Move everything alive after start-up (torch, transformers, the model, the app: ~400k objects) out of the
    garbage collector's reach. Requests allocate fast, and each of the collector's older-generation passes walked
    that whole heap while holding the GIL: freezing it cut the event loop's CPU per request from 0.87 to 0.53 ms on
    the CPU (bench/RESULTS.md, issue 40). Objects made later are collected as usual."""
    gc.collect()
    gc.freeze()


def serve(cfg: Config, options: ServeOptions, checkpoint: Path | None = None) -> None:
    import uvicorn

    from tandemrl.serve.app import build_app

    served = options.served_model_name or cfg.model.name_or_path
    state = build_state(cfg, served, options.allow_ipc, checkpoint)
    device = next(state.weights.model.parameters()).device
    if options.warmup and device.type == "cuda":  # CPU runs have no graphs to capture nor kernels to compile
        done = warm_up(state.loop.engine, state.vocab_size)
        print(f"warmed up decode batches {done.batches} in {done.seconds:.1f} s", flush=True)
    # Two busy threads share the GIL: the event loop gives it up at every socket write and the engine thread at
    # every torch call, and each then waits for the other to let go, up to the switch interval (5 ms by default).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    io = fastest_io()
    server = uvicorn.Server(uvicorn_config(build_app(state), io, options.log_level))
    freeze_startup_heap()
    state.loop.start()
    sock = bind_socket(options.host, options.port)
    host, port = sock.getsockname()[:2]
    print(f"serving {served} on http://{host}:{port} (policy version {state.policy_version}, "
          f"ipc {'on' if options.allow_ipc else 'off'}, device {device}, {io.loop} + {io.http})", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        state.loop.stop()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        sys.stdout.flush()
