"""Build the agent loop from the config's ``tools`` section (a task's own tool setup is already in it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tandemrl.rollout.catalog import build_tools
from tandemrl.rollout.sandbox import SandboxLimits
from tandemrl.rollout.tool_format import HermesFormat, PlainFormat, ToolFormat
from tandemrl.rollout.tools import ToolRegistry
from tandemrl.rollout.trajectory import AgentLimits

if TYPE_CHECKING:
    from tandemrl.config import Config, ToolsConfig
    from tandemrl.engine.engine import LLMEngine
    from tandemrl.rollout.agent_loop import AgentLoop, TurnEngine


def completion_budget(cfg: Config) -> int:
    """The most completion tokens a rollout can have (Dr.GRPO's constant normaliser): a trajectory's whole budget
    with tools, one turn's otherwise."""
    return cfg.tools.max_total_tokens if cfg.tools.active else cfg.rollout.max_tokens


def build_format(tools: ToolsConfig, registry: ToolRegistry) -> ToolFormat:
    if tools.format == "hermes":
        return HermesFormat()
    only_tool = next(iter(registry.tools)) if len(registry.tools) == 1 else None  # what an empty call means
    return PlainFormat(tools.call_open, tools.call_close, tools.result_open, tools.result_close, only_tool)


def sandbox_limits(tools: ToolsConfig) -> SandboxLimits:
    return SandboxLimits(timeout_s=tools.sandbox_timeout_s, cpu_s=tools.sandbox_cpu_s,
                         memory_mb=tools.sandbox_memory_mb, max_file_mb=tools.sandbox_max_file_mb,
                         max_output_chars=tools.sandbox_max_output_chars, isolation=tools.sandbox)


def build_agent(cfg: Config, backend: Any, tokenizer: Any,
                tools: Mapping[str, Callable[..., Any]] | None = None) -> AgentLoop | None:
    """The agent loop over the engine backend's engine, or None when tools are off. ``tools``: the Python API's
    tool callables, by the name ``tools.names`` records them under."""
    if not cfg.tools.active:
        return None
    engine = getattr(backend, "engine", None)
    if engine is None:
        raise ValueError(f"tools need the engine backend; {type(backend).__name__} has no request-level API "
                         "(the model's architecture is not supported by the engine, or rollout.backend = 'hf')")
    return agent_over(cfg, engine, tokenizer, tools)


def agent_over(cfg: Config, engine: LLMEngine | TurnEngine, tokenizer: Any,
               tools: Mapping[str, Callable[..., Any]] | None = None) -> AgentLoop:
    """The config's agent loop over ``engine``: an ``LLMEngine``, or a server's turns (backends/server_turns.py)."""
    from tandemrl.rollout.agent_loop import AgentLoop

    registry = ToolRegistry(build_tools(cfg.tools.names, sandbox_limits(cfg.tools), tools),
                            max_result_chars=cfg.tools.max_result_chars)
    limits = AgentLimits(cfg.tools.max_turns, cfg.tools.max_tool_calls, cfg.tools.max_total_tokens)
    return AgentLoop(engine, tokenizer, build_format(cfg.tools, registry), registry, limits,
                     max_concurrent_tools=cfg.tools.max_concurrent_calls)
