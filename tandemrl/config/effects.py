"""Keys that are set but have no effect are errors that say what to set.

A key counts as set when the user gave it (pydantic's ``model_fields_set`` of its section; for the plain-dataclass
sections, whose instances do not record that, a value other than the default) with a value other than its default,
and the task's preset (tandemrl/data/task_defaults.py) did not fill it in. The value check keeps a run's own
``config.toml``, which writes every key, loadable for ``--resume`` and ``eval``. Each :class:`Switch` names keys that
only act while it is on; a set key under a switch that is off is an error naming the key and the switch to set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tandemrl.config.base import section_fields

# tandemrl.config.root.Config, not imported: root.py calls this module from its validator (no import circle)
Config = Any


@dataclass(frozen=True)
class Switch:
    """``scopes``: sections ("tandem") or single keys ("rollout.server_url") that act only while ``is_on``;
    ``state``: how the switch stands now, in the user's terms; ``fix``: what to set (or a function of the config
    saying it); ``exempt``: the switch's own keys inside a scope. The first switch whose scope holds a key speaks for it."""

    scopes: tuple[str, ...]
    is_on: Callable[[Config], bool]
    state: Callable[[Config], str]
    fix: str | Callable[[Config], str]
    exempt: tuple[str, ...] = ()

    def covers(self, key: str) -> bool:
        return key not in self.exempt and any(key == s or key.startswith(s + ".") for s in self.scopes)


def _backend(cfg: Config) -> str:
    return f"rollout.backend = {cfg.rollout.backend!r}"


def _method(cfg: Config) -> str:
    method = cfg.rollout.speculative.method
    return "rollout.speculative.method is unset" if method is None else f"rollout.speculative.method = {method!r}"


SWITCHES: tuple[Switch, ...] = (
    Switch(("model.lora",), lambda c: c.model.lora.enabled, lambda c: "model.lora.enabled = false",
           "model.lora.enabled = true", exempt=("model.lora.enabled",)),
    Switch(("tandem",), lambda c: c.tandem.enabled, lambda c: "tandem.enabled = false", "tandem.enabled = true",
           exempt=("tandem.enabled",)),
    Switch(("curriculum",), lambda c: c.curriculum.enabled, lambda c: "curriculum.enabled = false",
           "curriculum.enabled = true", exempt=("curriculum.enabled",)),
    Switch(("tools",), lambda c: c.tools.active,
           lambda c: "tools.enabled = false" if c.tools.enabled is False else "tools.names is empty",
           lambda c: "tools.enabled = true" if c.tools.names else "tools.names (e.g. ['python'])",
           exempt=("tools.enabled",)),
    Switch(("rollout.speculative.draft_model", "rollout.speculative.rounds"),
           lambda c: c.rollout.speculative.method == "draft", _method, "rollout.speculative.method = 'draft'"),
    Switch(("rollout.speculative.ngram_max", "rollout.speculative.ngram_min"),
           lambda c: c.rollout.speculative.method == "ngram", _method, "rollout.speculative.method = 'ngram'"),
    Switch(("rollout.speculative",), lambda c: c.rollout.speculative.enabled, _method,
           "rollout.speculative.method = 'draft' or 'ngram'", exempt=("rollout.speculative.method",)),
    Switch(("rollout.vllm.weight_transfer", "rollout.vllm.weights_dir", "rollout.vllm.timeout_s"),
           lambda c: c.rollout.backend == "vllm" and c.rollout.vllm.mode == "server",
           lambda c: f"rollout.vllm.mode = {c.rollout.vllm.mode!r}" if c.rollout.backend == "vllm" else _backend(c),
           "rollout.backend = 'vllm' with rollout.vllm.mode = 'server'"),
    Switch(("rollout.vllm",), lambda c: c.rollout.backend == "vllm", _backend, "rollout.backend = 'vllm'"),
    Switch(("rollout.async_device",), lambda c: c.rollout.mode == "async" and c.rollout.backend == "engine",
           lambda c: f"rollout.mode = {c.rollout.mode!r}" if c.rollout.mode != "async" else _backend(c),
           "rollout.mode = 'async' with rollout.backend = 'engine'"),
    Switch(("rollout.env_port",), lambda c: c.rollout.mode == "async", lambda c: f"rollout.mode = {c.rollout.mode!r}",
           "rollout.mode = 'async'"),
    Switch(("train.tis_mode",), lambda c: c.train.tis_cap > 0, lambda c: "train.tis_cap = 0",
           "train.tis_cap > 0 (e.g. 2.0)"),
    Switch(("rollout.server_url", "rollout.server_retries", "rollout.server_backoff_s", "rollout.server_timeout_s"),
           lambda c: c.rollout.backend == "server", _backend, "rollout.backend = 'server'"),
    # a `tandemrl serve` process reads engine.* from its own config, so rollout.backend = 'server' keeps them
    Switch(("engine",), lambda c: c.rollout.backend in ("engine", "server"), _backend, "rollout.backend = 'engine'"),
    Switch(("sync.dir",), lambda c: c.sync.kind == "checkpoint", lambda c: f"sync.kind = {c.sync.kind!r}",
           "sync.kind = 'checkpoint'"),
    Switch(("sync.nccl_init_method", "sync.nccl_backend", "sync.nccl_bucket_mb"), lambda c: c.sync.kind == "nccl",
           lambda c: f"sync.kind = {c.sync.kind!r}", "sync.kind = 'nccl'"),
    Switch(("log.sample_text_per_step",), lambda c: c.log.samples, lambda c: "log.samples = false",
           "log.samples = true"),
    Switch(("log.num_completions_to_print",), lambda c: c.log.print_completions_every > 0,
           lambda c: "log.print_completions_every = 0", "log.print_completions_every to a number of steps"),
)


def check_effects(cfg: Config, preset: dict[str, Any] | None = None, switches: tuple[Switch, ...] = SWITCHES) -> None:
    """Raise ValueError naming every set key whose switch is off, grouped by switch. ``preset``: the dotted keys
    and values the task's defaults filled in (not the user's doing)."""
    preset = preset or {}
    silent: dict[Switch, list[str]] = {}
    for key, value in set_keys(cfg):
        if key in preset and preset[key] == value:
            continue
        switch = next((s for s in switches if s.covers(key)), None)
        if switch is not None and not switch.is_on(cfg):
            silent.setdefault(switch, []).append(key)
    if silent:
        raise ValueError("\n  ".join(_message(cfg, switch, keys) for switch, keys in silent.items()))


def _message(cfg: Config, switch: Switch, keys: list[str]) -> str:
    named, one = ", ".join(keys), len(keys) == 1
    fix = switch.fix if isinstance(switch.fix, str) else switch.fix(cfg)
    return (f"{named} {'is' if one else 'are'} set but {'has' if one else 'have'} no effect while "
            f"{switch.state(cfg)}: set {fix}, or remove {named if one else 'them'}")


def set_keys(section: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every key set to a value other than its default, sections walked recursively."""
    for name, value, default in _fields(section):
        key = f"{prefix}{name}"
        if _is_section(value):
            yield from set_keys(value, key + ".")
        elif value != default:
            yield key, value


def _fields(section: Any) -> Iterator[tuple[str, Any, Any]]:
    """(name, value, default) of each key of a section object; of a pydantic one only the keys the user gave."""
    given = section.model_fields_set if isinstance(section, BaseModel) else None
    for spec in section_fields(type(section)):
        if given is None or spec.name in given:
            yield spec.name, getattr(section, spec.name), spec.default


def _is_section(value: Any) -> bool:
    return isinstance(value, BaseModel) or dataclasses.is_dataclass(value) and not isinstance(value, type)


def preset_keys(cfg: Config) -> dict[str, Any]:
    """The dotted keys and values the preset of ``cfg.data.task`` fills in."""
    from tandemrl.data.task_defaults import with_task_defaults

    return dict(_flatten(with_task_defaults({}, cfg.data.task), cfg))


def _flatten(tree: dict[str, Any], section: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted keys of a nested dict; a dict is walked into only where the config has a section (reward.weights is
    one value)."""
    for name, value in tree.items():
        inner = getattr(section, name, None)
        if isinstance(value, dict) and _is_section(inner):
            yield from _flatten(value, inner, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value
