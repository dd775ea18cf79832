"""The one registry class, and each registry built on it: duplicates refused, unknown names listed.

Mechanisms, datasets, networks, encoders and algorithms all use ldpbench.registry.Registry.
"""

import dataclasses

import pytest

from ldpbench.data import registry as datasets
from ldpbench.errors import ConfigError
from ldpbench.features import encoders
from ldpbench.fl import algorithms, network_declarations
from ldpbench.mechanisms import registry as mechanisms
from ldpbench.registry import Registry


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str


def test_register_get_and_list():
    registry: Registry[Entry] = Registry("widget")
    first = registry.register(Entry("b"))
    registry.register(Entry("ignored"), name="a")
    assert registry.get("b") is first
    assert registry.names() == ["a", "b"] == list(registry)
    assert "a" in registry and "ignored" not in registry
    assert len(registry) == 2


def test_entries_added_later_load_when_a_name_not_held_or_every_name_is_asked_for():
    """Installed plugins load so (ldpbench.plugins.load_when_needed): a campaign that names only built-in
    entries imports no plugin module, while any other name finds the plugins' entries."""
    registry: Registry[Entry] = Registry("widget")
    registry.register(Entry("built-in"))
    loads = []

    def load_plugins() -> list[str]:
        loads.append(registry.register(Entry("from-a-plugin")).name)
        return ["from-a-plugin"]

    registry.add_later(load_plugins)
    assert registry.get("built-in") == Entry("built-in") and "built-in" in registry
    assert loads == []
    assert registry.get("from-a-plugin") == Entry("from-a-plugin")
    assert registry.names() == ["built-in", "from-a-plugin"] and registry.added_later() == ["from-a-plugin"]
    assert loads == ["from-a-plugin"]
    with pytest.raises(ConfigError, match="unknown widget 'other'; registered widgets: built-in, from-a-plugin"):
        registry.get("other")
    assert loads == ["from-a-plugin"]

    listed: Registry[Entry] = Registry("widget")
    listed.add_later(lambda: [listed.register(Entry("late")).name])
    assert list(listed) == ["late"]


def test_register_works_as_a_class_decorator():
    registry: Registry[type] = Registry("widget")

    @registry.register
    class Widget:
        name = "w"

    assert registry.get("w") is Widget


REGISTRIES = {
    "algorithm": algorithms.ALGORITHMS,
    "mechanism": mechanisms.MECHANISMS,
    "dataset": datasets.DATASETS,
    "network": network_declarations.NETWORKS,
    "encoder": encoders.ENCODERS,
}


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_each_registry_refuses_duplicates(kind):
    registry = REGISTRIES[kind]
    name = registry.names()[0]
    before = registry.get(name)
    with pytest.raises(ValueError, match=f"{kind} '{name}' is registered twice"):
        registry.register(Entry(name))
    assert registry.get(name) is before


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_each_registry_names_its_entries_when_a_name_is_unknown(kind):
    registry = REGISTRIES[kind]
    assert len(registry) > 1
    with pytest.raises(ConfigError) as error:
        registry.get("no-such-entry")
    message = str(error.value)
    assert message.startswith(f"unknown {kind} 'no-such-entry'; registered {kind}s: ")
    assert message.endswith(", ".join(registry.names()))
