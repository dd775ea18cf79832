"""Mechanisms, datasets and networks from the user's own package, registered through entry points.

A package declares, in its pyproject.toml (examples/ldpbench-plugin-example is one),

    [project.entry-points."ldpbench.mechanisms"]
    my-mechanism = "my_package.mechanism"

and, once it is installed beside ldpbench, every registry of ldpbench holds its entries: campaigns name
them like built-in ones, the contract suite (tests/mechanisms/test_mechanism_contract.py) runs over
them, and `ldpbench check <name>` checks one. An entry point names a module, which registers its
entries with the decorator ldpbench's own modules use (`ldpbench.mechanisms.register`,
`ldpbench.data.registry.register`, `ldpbench.fl.network_declarations.register`), or an entry itself
(a mechanism or network class, a DatasetEntry), which is registered under its `name`.

Each registry loads its group after its built-in entries (`load_when_needed`: the first time it is
asked for a name it does not hold, or for all its names), so a plugin cannot replace a built-in name
(the registry refuses a name registered twice), and a campaign that names only built-in entries
imports no plugin: the workflow's parse then imports no torch for a plugin's module.
"""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points

from ldpbench.errors import LdpbenchError
from ldpbench.registry import Registry

GROUPS = {"mechanism": "ldpbench.mechanisms", "dataset": "ldpbench.datasets", "network": "ldpbench.networks"}


class PluginError(LdpbenchError):
    """An installed plugin could not be loaded; the message names its package and entry point."""


def load_when_needed(registry: Registry) -> None:
    """Load `registry`'s plugins when it is first asked for a name it does not hold or for all its names
    (`Registry.added_later` then lists what they added)."""
    registry.add_later(lambda: load(registry))


def load(registry: Registry) -> list[str]:
    """Load the entry points of `registry`'s kind; returns the names they added to it."""
    group = GROUPS[registry.kind]
    before = set(registry.names())
    for entry_point in sorted(entry_points(group=group), key=lambda point: point.name):
        source = f"entry point '{entry_point.name} = {entry_point.value}' of group {group}" + (
            f" (package {entry_point.dist.name})" if entry_point.dist is not None else "")
        try:
            loaded = entry_point.load()
            # An entry object (not a module) is registered, unless its module registered it already.
            if not inspect.ismodule(loaded) and not registry.holds(loaded):
                registry.register(loaded)
        except Exception as error:  # noqa: BLE001 - any failure of foreign code, reported with its source
            raise PluginError(f"{source} failed to load: {type(error).__name__}: {error}") from error
    return sorted(set(registry.names()) - before)
