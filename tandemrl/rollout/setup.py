"""Build the agent loop from the config: the task's tool setup, overridden by the ``tools`` section's keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandemrl.rollout.catalog import TASK_TOOLS, TaskTools, build_tools
from tandemrl.rollout.sandbox import SandboxLimits
from tandemrl.rollout.tool_format import HermesFormat, PlainFormat, ToolFormat
from tandemrl.rollout.tools import ToolRegistry
from tandemrl.rollout.trajectory import AgentLimits

if TYPE_CHECKING:
    from tandemrl.config import Config, ToolsConfig
    from tandemrl.rollout.agent_loop import AgentLoop

PLAIN_KEYS = ("call_open", "call_close", "result_open", "result_close")


def task_tools(cfg: Config) -> TaskTools:
    return TASK_TOOLS.get(cfg.data.task, TaskTools())


def tools_enabled(cfg: Config) -> bool:
    if cfg.tools.enabled is not None:
        return cfg.tools.enabled
    return bool(tool_names(cfg))


def tool_names(cfg: Config) -> list[str]:
    return list(cfg.tools.names) if cfg.tools.names is not None else list(task_tools(cfg).names)


def completion_budget(cfg: Config) -> int:
    """The most completion tokens a rollout can have (Dr.GRPO's constant normaliser): a trajectory's whole budget
    with tools, one turn's otherwise."""
    return cfg.tools.max_total_tokens if tools_enabled(cfg) else cfg.rollout.max_tokens


def build_format(cfg: Config, registry: ToolRegistry) -> ToolFormat:
    defaults = task_tools(cfg)
    kind = cfg.tools.format or defaults.format
    if kind == "hermes":
        return HermesFormat()
    fields = dict(defaults.plain)
    fields.update({key: getattr(cfg.tools, key) for key in PLAIN_KEYS if getattr(cfg.tools, key) is not None})
    if "default_tool" not in fields and len(registry.tools) == 1:
        fields["default_tool"] = next(iter(registry.tools))
    return PlainFormat(**fields)


def sandbox_limits(tools: ToolsConfig) -> SandboxLimits:
    return SandboxLimits(timeout_s=tools.sandbox_timeout_s, cpu_s=tools.sandbox_cpu_s,
                         memory_mb=tools.sandbox_memory_mb, max_file_mb=tools.sandbox_max_file_mb,
                         max_output_chars=tools.sandbox_max_output_chars)


def build_agent(cfg: Config, backend: Any, tokenizer: Any) -> AgentLoop | None:
    """The agent loop over the engine backend's engine, or None when tools are off."""
    if not tools_enabled(cfg):
        return None
    from tandemrl.rollout.agent_loop import AgentLoop

    engine = getattr(backend, "engine", None)
    if engine is None:
        raise ValueError(f"tools need the engine backend; {type(backend).__name__} has no request-level API "
                         "(the model's architecture is not supported by the engine, or rollout.backend = 'hf')")
    names = tool_names(cfg)
    if not names:
        raise ValueError(f"tools.enabled = true but no tools: set tools.names (built-in: python, calculator, peek); "
                         f"task {cfg.data.task!r} brings none")
    registry = ToolRegistry(build_tools(names, sandbox_limits(cfg.tools)))
    max_calls = cfg.tools.max_tool_calls or task_tools(cfg).max_tool_calls
    limits = AgentLimits(cfg.tools.max_turns, max_calls, cfg.tools.max_total_tokens)
    return AgentLoop(engine, tokenizer, build_format(cfg, registry), registry, limits,
                     max_concurrent_tools=cfg.tools.max_concurrent_calls)
