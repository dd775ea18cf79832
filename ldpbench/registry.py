"""Name → entry registries: mechanisms, datasets, networks and encoders share this one class.

A registry is filled at import time by its module (class decorators or explicit calls), and by
installed plugins the first time it is asked for a name it does not hold or for all its names
(`add_later`: a campaign that names only built-in entries imports no plugin); it is only read
afterwards. A name registered twice is a programming error (ValueError); an unknown name is the
campaign's error (ConfigError naming the kind and listing every registered name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ldpbench.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind ("mechanism", "dataset", ...) by name; iterates over the sorted names."""

    def __init__(self, kind: str, entry_of: Callable[[object], T] | None = None):
        self.kind = kind
        # What is held for a registered object (the networks hold a declaration for a class); default: itself.
        self._entry_of = entry_of or (lambda entry: entry)
        self._entries: dict[str, T] = {}
        self._later: Callable[[], list[str]] | None = None  # registers the plugins' entries, returns their names
        self._added_later: list[str] = []

    def add_later(self, loader: Callable[[], list[str]]) -> None:
        """Have `loader` register more entries (returning their names) when the registry is first asked
        for a name it does not hold, or for all its names."""
        self._later = loader

    def added_later(self) -> list[str]:
        """The names the `add_later` loader registered (it runs now if it has not run yet)."""
        self._add_pending()
        return list(self._added_later)

    def _add_pending(self) -> None:
        if self._later is not None:
            loader, self._later = self._later, None  # once, even if it fails: its error names its plugin
            self._added_later = loader()

    def register(self, entry: T, name: str | None = None) -> T:
        """Register `entry` under `name` (default: its `name` attribute); usable as a class decorator."""
        key = entry.name if name is None else name  # type: ignore[attr-defined]
        if key in self._entries:
            raise ValueError(f"{self.kind} '{key}' is registered twice")
        self._entries[key] = self._entry_of(entry)
        return entry

    def holds(self, entry: object) -> bool:
        """Whether what `entry` registers as is what the registry holds under its name."""
        return self._entries.get(entry.name) == self._entry_of(entry)  # type: ignore[attr-defined]

    def get(self, name: str) -> T:
        if name not in self:
            raise ConfigError(
                f"unknown {self.kind} '{name}'; registered {self.kind}s: {', '.join(self.names())}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        self._add_pending()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            self._add_pending()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
