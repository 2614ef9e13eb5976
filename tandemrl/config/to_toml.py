"""The resolved config written back as TOML (a run's config.toml, `tandemrl config`)."""

from __future__ import annotations

from typing import Any

from tandemrl.config.root import Config


def config_to_toml(cfg: Config) -> str:
    """Resolved config as TOML (None values are left out: TOML has no null)."""
    lines: list[str] = []
    _emit_table(cfg.model_dump(), [], lines)
    return "\n".join(lines).strip() + "\n"


def _emit_table(table: dict[str, Any], prefix: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    sections = {k: v for k, v in table.items() if isinstance(v, dict)}
    if prefix and (scalars or not sections):
        lines.append(f"\n[{'.'.join(prefix)}]")
    for key, value in scalars.items():
        lines.append(f"{_toml_key(key)} = {toml_literal(value)}")
    for key, value in sections.items():
        _emit_table(value, prefix + [key], lines)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else toml_literal(key)


def toml_literal(value: Any) -> str:
    """A value as a TOML literal (an inline table for a dict)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} to TOML")
