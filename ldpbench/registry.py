"""Name → entry registries: mechanisms, datasets, networks and encoders share this one class.

A registry is filled at import time by its module (class decorators or explicit calls) and only
read afterwards. A name registered twice is a programming error (ValueError); an unknown name is
the campaign's error (ConfigError naming the kind and listing every registered name).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from ldpbench.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind ("mechanism", "dataset", ...) by name; iterates over the sorted names."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, entry: T, name: str | None = None) -> T:
        """Register `entry` under `name` (default: its `name` attribute); usable as a class decorator."""
        key = entry.name if name is None else name  # type: ignore[attr-defined]
        if key in self._entries:
            raise ValueError(f"{self.kind} '{key}' is registered twice")
        self._entries[key] = entry
        return entry

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} '{name}'; registered {self.kind}s: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
