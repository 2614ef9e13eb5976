"""Optional packages: a missing one is one line naming the extra to install, said before a run writes anything."""

from __future__ import annotations

import importlib.util


class MissingExtraError(ValueError):
    """An optional package a setting needs is not installed (a ValueError: the CLI prints it as one line)."""


def installed(package: str) -> bool:
    """Whether ``package`` can be imported (found on the path; not imported)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def require_extra(package: str, extra: str, why: str) -> None:
    """Raise :class:`MissingExtraError` unless ``package`` is installed. ``why`` names the setting that needs it,
    e.g. ``require_extra("datasets", "data", f"data.path = {path!r} is a hub dataset id")``."""
    if not installed(package):
        raise MissingExtraError(f"{why} but {package} is not installed: pip install 'tandemrl[{extra}]'")


def check_run_extras(tensorboard: bool | None, wandb_project: str | None, lora: bool) -> list[str]:
    """Every optional package a run's settings (log.tensorboard, log.wandb_project, model.lora.enabled) need,
    checked up front; the notes to print for settings that go without theirs (log.tensorboard unset: when
    installed)."""
    if wandb_project:
        require_extra("wandb", "wandb", f"log.wandb_project = {wandb_project!r} is set")
    if lora:
        require_extra("peft", "lora", "model.lora.enabled = true")
    if tensorboard:
        require_extra("tensorboard", "tensorboard", "log.tensorboard = true")
    if tensorboard is None and not installed("tensorboard"):
        return ["tensorboard is not installed: metrics go to metrics.jsonl only (pip install 'tandemrl[tensorboard]'; "
                "log.tensorboard = false says nothing)"]
    return []
