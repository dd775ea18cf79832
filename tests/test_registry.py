"""The one registry class, and each registry built on it: duplicates refused, unknown names listed.

Mechanisms, datasets, networks, encoders and algorithms all use ldpbench.registry.Registry.
"""

import dataclasses

import pytest

from ldpbench.data import registry as datasets
from ldpbench.errors import ConfigError
from ldpbench.features import encoders
from ldpbench.fl import algorithms, networks
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
    "network": networks.NETWORKS,
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
