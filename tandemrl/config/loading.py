"""A config from the user's words: a TOML file, `--set section.key=value` overrides, and errors that name the key."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Mapping, Sequence

from pydantic import ValidationError

from tandemrl.config.base import section_fields
from tandemrl.config.data import DataConfig
from tandemrl.config.root import Config
from tandemrl.config.trl_names import trl_hint


class ConfigError(ValueError):
    """A config problem, phrased for the user: names the key and what would be valid."""


ConfigPaths = str | Path | Sequence[str | Path] | None


def load_config(path: ConfigPaths = None, overrides: list[str] | None = None) -> Config:
    """Read TOML files (none, one, or several merged in order: a later file's keys win), apply `a.b=c` overrides on
    top, validate everything."""
    paths = [] if path is None else [path] if isinstance(path, (str, Path)) else list(path)
    raw: dict[str, Any] = {}
    for one in paths:
        merge_sections(raw, read_toml(Path(one)))
    for item in overrides or []:
        _apply_override(raw, item)
    return validate_config(raw)


def validate_config(raw: dict[str, Any]) -> Config:
    """The config from the user's keys; the task's own defaults (tandemrl/data/task_defaults.py) fill the keys the
    user left out."""
    from tandemrl.data.task_defaults import with_task_defaults

    data = raw.get("data")
    task = data.get("task", DataConfig.model_fields["task"].default) if isinstance(data, dict) else None
    raw = with_task_defaults(raw, task)
    _check_registered_names(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def read_toml(path: Path) -> dict[str, Any]:
    """The file's keys, not yet validated; an unknown key is an error naming the file (once merged with overrides
    and arguments, nothing could say where it came from)."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    check_keys(raw, str(path))
    return raw


def merge_sections(raw: dict[str, Any], top: Mapping[str, Any], section: Any = Config) -> None:
    """Merge ``top`` into ``raw`` in place: a config section merges key by key (so a second --config changes only
    the keys it names); a key's value, a list or a table-valued key such as reward.weights, is replaced whole (a
    merged weights table could keep a weight for a function the later file no longer lists)."""
    fields = _field_names(section)
    for key, value in top.items():
        inner = fields.get(key)
        if isinstance(value, Mapping) and isinstance(raw.get(key), dict) and inner is not None and _field_names(inner):
            merge_sections(raw[key], value, inner)
        else:
            raw[key] = _copy(value)


def _copy(value: Any) -> Any:
    # a later merge writes into raw's tables: they must not be the file's own (a caller may reuse those)
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def check_keys(raw: Mapping[str, Any], where: str) -> None:
    """Raise a ConfigError naming ``where`` (a file, a --set) and every key of ``raw`` that the config lacks."""
    messages = [_unknown_key_message(loc) for loc in unknown_keys(raw)]
    if len(messages) == 1:  # one problem, one line
        raise ConfigError(f"{where}: {messages[0]}")
    if messages:
        raise ConfigError(f"{where}:\n  " + "\n  ".join(messages))


def unknown_keys(raw: Mapping[str, Any], section: Any = Config, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The keys of ``raw`` (nested dicts) that ``section`` has no field for, each as its path from the root."""
    fields = _field_names(section)
    found: list[tuple[str, ...]] = []
    for key, value in raw.items():
        if key not in fields:
            found.append((*prefix, key))
        elif isinstance(value, Mapping) and _field_names(fields[key]):  # a section, not a dict-valued key
            found += unknown_keys(value, fields[key], (*prefix, key))
    return found


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects section.key=value, got {item!r}")
    where, value = f"--set {item!r}", _parse_value(text.strip())
    alone: dict[str, Any] = {}  # the override's key alone, checked before it merges with the rest
    set_key(alone, key.strip(), value, where)
    check_keys(alone, where)
    set_key(raw, key.strip(), value, where)


def set_key(raw: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    """Set ``section.key`` in the user's nested dicts; a mapping merges into a section already there. ``where``
    names the key's source in an error."""
    *sections, name = dotted.split(".")
    node = raw
    for section in sections:
        node = node.setdefault(section, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {section!r} is a value, not a section")
    if isinstance(value, Mapping) and isinstance(node.get(name), dict):
        for key, inner in value.items():
            set_key(node[name], key, inner, where)
    else:
        node[name] = dict(value) if isinstance(value, Mapping) else value


def _parse_value(text: str) -> Any:
    """TOML literal if it parses (3, 1e-4, true, [..], "x"), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _check_registered_names(raw: dict[str, Any]) -> None:
    # Imported here: algorithm registries pull in torch, which the config module itself should not need.
    from tandemrl.algo.advantages import ADVANTAGES
    from tandemrl.algo.losses import AGGREGATIONS, POLICY_LOSSES

    train = raw.get("train", {})
    if not isinstance(train, dict):
        return
    for key, registry in (("advantage", ADVANTAGES), ("aggregation", AGGREGATIONS), ("policy_loss", POLICY_LOSSES)):
        if key in train and train[key] not in registry.names():
            raise ConfigError(
                f"train.{key} = {train[key]!r} is not known; valid choices: {', '.join(registry.names())}"
            )


def _describe(err: ValidationError) -> str:
    messages = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            messages.append(_unknown_key_message(e["loc"]))
        elif e["type"] == "value_error":  # our own checks: their messages name the keys
            messages.append(str(e.get("ctx", {}).get("error", e["msg"])))
        else:
            messages.append(f"{key}: {e['msg']} (got {e.get('input')!r})")
    if len(messages) == 1:  # one problem, one line
        return f"invalid config: {messages[0]}"
    return "invalid config:\n  " + "\n  ".join(messages)


def _unknown_key_message(loc: tuple[Any, ...]) -> str:
    section: type = Config
    for part in loc[:-1]:
        field = _field_names(section).get(str(part))
        if field is None or not _field_names(field):
            break
        section = field
    valid = list(_field_names(section))
    key = ".".join(str(p) for p in loc)
    # TRL's name first: it says the key exactly, where spelling would guess ('beta' is not 'adam_betas')
    hint = trl_hint(str(loc[-1]))
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
    suggestion = f" ({hint})" if hint else f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown config key {key!r}{suggestion}; valid keys here: {', '.join(valid)}"


def _field_names(section: Any) -> dict[str, Any]:
    """A section's keys and their types ({} for a plain value)."""
    return {spec.name: spec.annotation for spec in section_fields(section)}
