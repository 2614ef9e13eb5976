"""A tiny name -> object registry, so algorithms are chosen by name (never by if/elif chains)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """Raised by :meth:`Registry.get` for a name that was never registered.

    It is both a ``KeyError`` (a failed lookup) and a ``ValueError`` (a bad config value), so callers
    may catch either.
    """

    def __str__(self) -> str:  # KeyError would otherwise repr() the message, adding quotes
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Maps names to objects of one kind (e.g. advantage estimators).

    >>> FOO = Registry("foo")
    >>> @FOO.register("a")
    ... def a(): ...
    >>> FOO.get("a") is a
    True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name`` and returns it unchanged."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid choices: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
