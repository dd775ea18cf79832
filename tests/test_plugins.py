"""Plugins (ldpbench.plugins): entries of other packages, registered through entry points.

The example plugin package (examples/ldpbench-plugin-example, installed by the README's test command)
is the real thing, with its own tests; here each path of the loader, with entry points made up.
"""

import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from ldpbench import plugins
from ldpbench.registry import Registry


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A package `my_plugin` whose module `my_plugin.networks` registers into `my_plugin.REGISTRY` on
    import, and which defines an entry object `my_plugin.Thing`."""
    package = tmp_path / "my_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent("""
        from ldpbench.registry import Registry

        REGISTRY = Registry("network")

        class Thing:
            name = "thing"
        """))
    (package / "networks.py").write_text(textwrap.dedent("""
        from my_plugin import REGISTRY

        @REGISTRY.register
        class Registered:
            name = "registered-by-its-module"
        """))
    (package / "broken.py").write_text("raise RuntimeError('the plugin cannot start')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name.startswith("my_plugin")]:
        monkeypatch.delitem(sys.modules, name)
    return package


def with_entry_points(monkeypatch, group: str, *values: str) -> None:
    points = [EntryPoint(name=f"entry{i}", value=value, group=group) for i, value in enumerate(values)]
    monkeypatch.setattr(plugins, "entry_points", lambda group: [p for p in points if p.group == group])


def test_a_module_registers_its_entries_and_an_object_is_registered_under_its_name(plugin_module, monkeypatch):
    import my_plugin

    # The class its module registered, named again as an object, is not registered twice.
    with_entry_points(monkeypatch, "ldpbench.networks", "my_plugin.networks", "my_plugin:Thing",
                      "my_plugin.networks:Registered")
    assert plugins.load(my_plugin.REGISTRY) == ["registered-by-its-module", "thing"]
    assert my_plugin.REGISTRY.get("thing") is my_plugin.Thing


def test_a_network_class_is_held_as_its_declaration_once(tmp_path, monkeypatch):
    """A plugin's network class, registered by its module and named again by an entry point: the networks'
    registry holds one declaration of it, read without building it."""
    from ldpbench.fl.network_declarations import NetworkDeclaration, declaration_of

    (tmp_path / "my_networks.py").write_text(textwrap.dedent("""
        from ldpbench.fl.networks import MultilayerPerceptron
        from my_registry import REGISTRY

        @REGISTRY.register
        class Wide(MultilayerPerceptron):
            name = "wide-mlp"

            def __init__(self, input_shape, classes, hidden=(4096,)):
                super().__init__(input_shape, classes, hidden)
        """))
    (tmp_path / "my_registry.py").write_text("from ldpbench.fl.network_declarations import declaration_of\n"
                                             "from ldpbench.registry import Registry\n"
                                             "REGISTRY = Registry('network', entry_of=declaration_of)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_registry

    with_entry_points(monkeypatch, "ldpbench.networks", "my_networks", "my_networks:Wide")
    assert plugins.load(my_registry.REGISTRY) == ["wide-mlp"]
    declaration = my_registry.REGISTRY.get("wide-mlp")
    assert isinstance(declaration, NetworkDeclaration) and declaration.parameters == {"hidden": (4096,)}
    assert declaration == declaration_of(declaration.implementation_class())


def test_each_kind_reads_its_own_group(plugin_module, monkeypatch):
    with_entry_points(monkeypatch, "ldpbench.networks", "my_plugin:Thing")
    assert plugins.load(Registry("mechanism")) == [] and plugins.load(Registry("dataset")) == []
    assert plugins.load(Registry("network")) == ["thing"]


def test_a_plugin_that_fails_to_load_is_named(plugin_module, monkeypatch):
    with_entry_points(monkeypatch, "ldpbench.mechanisms", "my_plugin.broken")
    with pytest.raises(plugins.PluginError, match=r"entry point 'entry0 = my_plugin.broken' of group "
                                                  r"ldpbench.mechanisms failed to load: RuntimeError: the plugin"):
        plugins.load(Registry("mechanism"))


def test_a_plugin_cannot_take_a_built_in_name(plugin_module, monkeypatch):
    registry = Registry("network")
    registry.register(type("BuiltIn", (), {"name": "thing"}))
    with_entry_points(monkeypatch, "ldpbench.networks", "my_plugin:Thing")
    with pytest.raises(plugins.PluginError, match="network 'thing' is registered twice"):
        plugins.load(registry)


def test_every_registry_of_ldpbench_loads_its_plugins():
    """The real registries, in a fresh process: the installed example plugin's mechanism is there
    (when it is installed), and each registry says what its plugins added."""
    code = ("import ldpbench.mechanisms as m, ldpbench.data.registry as d, ldpbench.fl.network_declarations as n; "
            "print(*(r.added_later() for r in (m.registry.MECHANISMS, d.DATASETS, n.NETWORKS)))")
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    try:
        import ldpbench_plugin_example  # noqa: F401
    except ImportError:
        assert printed.split() == ["[]", "[]", "[]"]
    else:
        assert printed.split() == ["['one-coordinate-rr']", "[]", "[]"]
