"""A module imported where it is first used rather than where it is named: torch, for the registries.

The workflow's parse imports the mechanisms' and networks' registries (to validate a campaign and
plan its runs) but runs no mechanism and builds no network; importing torch would be most of its
start (`benchmarks/frozen_imports.py` measures the imports). The modules on that path bind it with

    if TYPE_CHECKING:
        import torch
    else:
        torch = deferred("torch", globals())

and use no torch attribute while they are imported (no torch value as a default argument, for one).
The first attribute read imports the module and rebinds the name in the namespace that holds it, so
every later read is the plain global read of an imported module. tests/test_parse_imports.py checks
that validating and planning the campaigns imports no torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class DeferredModule:
    """Stands for module `name` in `namespace` until an attribute of it is first read."""

    __slots__ = ("_binding", "_name", "_namespace")

    def __init__(self, name: str, namespace: dict[str, Any], binding: str):
        self._name, self._namespace, self._binding = name, namespace, binding

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self._name)
        self._namespace[self._binding] = module
        return getattr(module, attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported at its first use>"


def deferred(name: str, namespace: dict[str, Any]) -> ModuleType:
    """Module `name` for the global of the same (last) name in `namespace`, imported at its first use."""
    return DeferredModule(name, namespace, name.rpartition(".")[2])  # type: ignore[return-value]
