"""The run's agent loop (tools): over the engine backend's engine, or turn by turn over a server."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tandemrl.backends.server_backend import ServerBackend
from tandemrl.backends.server_turns import ServerTurns
from tandemrl.config import Config
from tandemrl.rollout.agent_loop import AgentLoop
from tandemrl.rollout.setup import agent_over, build_agent


def run_agent_loop(cfg: Config, backend: Any, tokenizer: Any, eos_ids: Sequence[int],
                   tools: Mapping[str, Callable[..., Any]] | None = None) -> AgentLoop | None:
    """None when tools are off. ``eos_ids``: the model's end-of-turn tokens (a server's turns need them);
    ``tools``: the Python API's tool callables (RunInputs.tools)."""
    if cfg.tools.active and isinstance(backend, ServerBackend):
        return agent_over(cfg, ServerTurns(backend, eos_ids, backend.max_concurrency), tokenizer, tools)
    return build_agent(cfg, backend, tokenizer, tools)
