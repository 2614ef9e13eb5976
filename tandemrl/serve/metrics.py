"""/metrics in Prometheus' text format: the queues, running sequences, KV use, tokens/s, request counts, version."""

from __future__ import annotations

import torch

from tandemrl.serve.state import ServerState
from tandemrl.serve.weight_memory import owned_weight_bytes

PREFIX = "tandemrl_"


def prometheus_text(state: ServerState) -> str:
    """A snapshot read from the engine thread's counters (plain ints: a torn read costs one scrape's accuracy)."""
    loop = state.loop
    load = loop.engine.load()
    engine = loop.engine.stats()
    kv = load["kv_blocks_used"] / load["kv_blocks"] if load["kv_blocks"] else 0.0
    gauges = {
        "requests_queued": ("sequences received that the engine thread has not taken yet (it is stepping or "
                            "applying a weight push)", loop.queued),
        "requests_waiting": ("sequences waiting for their first prefill", load["waiting"]),
        "requests_running": ("sequences being decoded", load["running"]),
        "kv_cache_usage": ("fraction of the KV cache's blocks in use", kv),
        "kv_blocks_used": ("KV blocks in use", load["kv_blocks_used"]),
        "tokens_per_second": ("generated tokens per second over the last window", loop.tokens_per_second()),
        "policy_version": ("the weights version being served", loop.policy_version),
        "running_version_lag": ("versions the oldest running request is behind the served weights (pushes that "
                                "landed while it ran)", loop.version_lag),
        "gpu_memory_allocated_bytes": ("this process's allocated GPU memory (0 on CPU; with ipc sync the weights "
                                       "are the trainer's allocation)", _gpu_allocated(state)),
        "weight_bytes_owned": ("bytes of the served weights in this process's own memory (0 with ipc sync: they "
                               "are mapped from the trainer's)", owned_weight_bytes(state.weights.model)
                               if state.weights else 0),
    }
    counters = {
        "requests_total": ("sequences received (a request with n choices counts n)", loop.counters["requests"]),
        "requests_finished_total": ("sequences finished", loop.counters["finished"]),
        "requests_aborted_total": ("sequences aborted (client went away)", loop.counters["aborted"]),
        "requests_failed_total": ("sequences failed by an engine error", loop.counters["failed"]),
        "generated_tokens_total": ("tokens sent to clients", loop.counters["generated_tokens"]),
        "queue_wait_seconds_total": ("seconds sequences waited for the engine thread to take them (over "
                                     "requests_total)", loop.seconds["queue_wait"]),
        "first_tokens_total": ("streamed sequences whose first tokens went out before they finished",
                               loop.counters["first_tokens"]),
        "first_token_seconds_total": ("seconds from arrival to the first token sent, over first_tokens_total (the "
                                      "server's share of the time to first token)", loop.seconds["first_token"]),
        "engine_step_seconds_total": ("seconds the engine thread spent in steps (the rest: idle, taking requests, "
                                      "weight pushes)", loop.seconds["steps"]),
        "engine_steps_total": ("engine steps", engine["steps"]),
        "decode_steps_total": ("decode steps (a burst of k counts k)", engine["decode_steps"]),
        "decode_tokens_total": ("tokens computed by decode steps, over every sequence", engine["decode_tokens"]),
        "weight_pushes_total": ("complete weight pushes applied", state.weights.pushes if state.weights else 0),
        "weight_push_failures_total": ("weight pushes refused or interrupted",
                                       state.weights.failures if state.weights else 0),
    }
    lines = []
    for kind, table in (("gauge", gauges), ("counter", counters)):
        for name, (help_text, value) in table.items():
            lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}",
                      f"{PREFIX}{name} {_number(value)}"]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """Whole numbers in full (byte counts past a million would lose digits to %g), others as %g."""
    return str(int(value)) if float(value).is_integer() else f"{float(value):g}"


def _gpu_allocated(state: ServerState) -> int:
    if state.weights is None:
        return 0
    device = next(state.weights.model.parameters()).device
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
