"""Loading a user's function from a spec: ``"package.module:function"`` (imported; the working directory is
searched too) or ``"path/to/file.py:function"`` (loaded from that file). Reward functions and tools both name
functions this way; this module imports nothing from tandemrl, so any layer may use it."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


INLINE = "inline:"  # how a config records a Python API callable (a reward, a tool), which no file can bring back


class UserCodeError(ValueError):
    """A spec that names no loadable callable; the message names the spec, the module or file, and what it has."""


def is_user_spec(name: str) -> bool:
    """``module:function`` or ``file.py:function`` (both parts non-empty), as opposed to a registered name."""
    module_name, sep, attr = name.partition(":")
    return bool(sep and module_name and attr)


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """The callable ``spec`` names; ``what`` (``reward``, ``tool``) starts every error message."""
    module_name, _, attr = spec.partition(":")
    try:
        module = _load_file(module_name, what) if _is_file(module_name) else _import_module(module_name)
    except ImportError as err:
        raise UserCodeError(f"{what} {spec!r}: cannot import module {module_name!r}: {err}") from err
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            have = public_callables(obj)
            listed = f"; the callables it defines: {', '.join(have)}" if have else "; it defines no functions"
            raise UserCodeError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}"
                                f"{did_you_mean(part, have)}{listed}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserCodeError(f"{what} {spec!r}: {attr!r} in {module_name!r} is not callable")
    return obj


def inline_message(spec: str, function: str, what: str, argument: str, key: str, also: str) -> str:
    """Why ``spec`` (``inline:<name>``, a Python API callable) cannot be loaded from a run's config, and how to give
    ``function`` again: ``what`` (reward, tool), the Trainer ``argument`` that took it, the config ``key``, and
    ``also``, what else to pass beside it."""
    return (f"{what} {spec!r} was a Python callable ({function}) given to Trainer({argument}=...); a callable is not "
            "saved with the run, so it cannot be loaded from the run's config. Give it again: in Python, "
            f"Trainer(..., {argument}=[{function}], out_dir=<the run>).evaluate(); on the command line, put it in a "
            f"file and add --set '{key}=[\"file.py:{function}\"]' ({also})")


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def public_callables(obj: Any) -> list[str]:
    """The public functions and classes a module defines itself (not those it imports); for any other object, its
    public callable attributes."""
    if inspect.ismodule(obj):
        return sorted(n for n, v in vars(obj).items() if not n.startswith("_") and callable(v)
                      and getattr(v, "__module__", None) == obj.__name__)
    return sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None)))


def _is_file(module_name: str) -> bool:
    return module_name.endswith(".py") or "/" in module_name or os.sep in module_name


def _load_file(path_text: str, what: str) -> Any:
    """A user's file, loaded as a module of its own (its name cannot shadow an installed module)."""
    path = Path(os.path.expanduser(path_text)).resolve()
    if not path.is_file():
        raise ImportError(f"no such file: {path_text}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"tandemrl_user_{what}_{path.stem}_{digest}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path_text} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's file raised while loading: say where
        raise ImportError(f"{path_text} raised {type(err).__name__}: {err}") from err
    return module


def _import_module(module_name: str) -> Any:
    """Import a user's module, looking in the working directory too (as TRL users expect: the console script's
    sys.path does not include it); sys.path is restored afterwards so nothing else is shadowed."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        # Only retry when the missing module is the user's own (or its package), not a dependency it imports.
        if err.name is None or not (module_name == err.name or module_name.startswith(err.name + ".")):
            raise
        cwd = os.getcwd()
        if cwd in sys.path or "" in sys.path:
            raise
    sys.path.insert(0, cwd)
    try:
        importlib.invalidate_caches()
        return importlib.import_module(module_name)
    finally:
        if cwd in sys.path:
            sys.path.remove(cwd)
