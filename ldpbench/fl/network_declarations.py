"""The networks a campaign may name, declared without torch: each one's name, its own parameters with
their defaults, the checks of their values, whether its gradients have a closed form, and the class
that implements it (in ldpbench.fl.networks, which imports torch).

The workflow's parse validates a campaign and plans its runs with these declarations alone, so it
imports no torch; a run builds its network with `ldpbench.fl.networks.create_network`. A network class
registered as it is (a plugin's, through `register`) is declared from the class itself. The network
tests check each built-in declaration against its class: the same parameters and defaults, the same
closed form.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ldpbench import plugins
from ldpbench.errors import ConfigError
from ldpbench.registry import Registry

IMPLEMENTATIONS = "ldpbench.fl.networks"  # the module of the built-in networks' classes


@dataclass(frozen=True)
class NetworkDeclaration:
    """What a campaign's validation and plans need of a network, and where its class is."""

    name: str
    implementation: str  # "module:Class" of the network's class, a subclass of ldpbench.fl.networks.Network
    parameters: Mapping[str, Any] = field(default_factory=dict)  # its own (beyond input_shape, classes): defaults
    closed_form_gradients: bool = False  # the engine computes its gradients by formula (ClosedFormGradients)
    fused_gradients: bool = False  # its products write its gradients scaled and added (FusedGradients)
    # Refuses (ConfigError) a value that no input could make valid: (network, parameter, value).
    check: Callable[[str, str, Any], None] | None = field(default=None, compare=False)
    # The class itself, for a class registered as it is (it was imported already, maybe not at module level).
    registered_class: type | None = field(default=None, repr=False)

    def check_parameter(self, parameter: str, value: Any) -> None:
        """What can be checked of a value before any data is loaded; the rest when the network is built."""
        if self.check is not None:
            self.check(self.name, parameter, value)

    def implementation_class(self) -> type:
        if self.registered_class is not None:
            return self.registered_class
        module, _, attribute = self.implementation.partition(":")
        return getattr(importlib.import_module(module), attribute)

    @classmethod
    def of_class(cls, network: type) -> NetworkDeclaration:
        """The declaration of a network class registered as it is: its parameters are those of its
        constructor, its checks its `check_parameter`."""
        signature = inspect.signature(network.__init__)
        return cls(
            name=network.name,
            implementation=f"{network.__module__}:{network.__qualname__}",
            parameters={parameter.name: parameter.default for parameter in signature.parameters.values()
                        if parameter.name not in ("self", "input_shape", "classes")},
            closed_form_gradients=network.has_closed_form_gradients(),
            fused_gradients=network.has_fused_gradients(),
            check=lambda _name, parameter, value: network.check_parameter(parameter, value),
            registered_class=network,
        )


def declaration_of(entry: NetworkDeclaration | type) -> NetworkDeclaration:
    return entry if isinstance(entry, NetworkDeclaration) else NetworkDeclaration.of_class(entry)


# A declaration by name; a class registered as it is (a plugin's) is held as its declaration.
NETWORKS: Registry[NetworkDeclaration] = Registry("network", entry_of=declaration_of)
# Registers a declaration, or a network class as it is (a class decorator).
register = NETWORKS.register


def network_parameters(name: str) -> dict[str, Any]:
    """The network's own parameters (beyond input_shape and classes) with their defaults."""
    return dict(NETWORKS.get(name).parameters)


def check_network_params(name: str, params: dict[str, Any]) -> None:
    """What can be checked of network `name`'s parameters without its input: their names, and their
    values as far as they do not depend on the input shape."""
    declaration = NETWORKS.get(name)
    unknown = sorted(set(params) - set(declaration.parameters))
    if unknown:
        raise ConfigError(f"network '{name}' has no parameter(s) {unknown}; its parameters are "
                          f"{sorted(declaration.parameters) or 'none'}")
    for parameter, value in params.items():
        declaration.check_parameter(parameter, value)


def check_gradients(requested: str, name: str, closed_form: bool, fused: bool) -> None:
    """Refuse (ConfigError) training.gradients `requested` where network `name` lacks what it needs: a
    closed form (closed-form) or fused gradients (fused). The plan checks a declaration before any job,
    the engine the network's class when it builds a run."""
    if requested == "closed-form" and not closed_form:
        raise ConfigError(f"training.gradients is 'closed-form' but network '{name}' has no formula; "
                          "use auto, vmap or per-client")
    if requested == "fused" and not fused:
        raise ConfigError(f"training.gradients is 'fused' but network '{name}' does not fuse its "
                          "gradients; use auto, vmap or per-client")


def require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"network '{name}': {message}")


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_hidden_widths(name: str, parameter: str, value: Any) -> None:
    if parameter == "hidden":
        require(isinstance(value, (list, tuple)) and len(value) > 0 and all(map(positive_int, value)),
                name, f"hidden must be a non-empty list of positive ints, got {value!r}")


def check_recurrent_sizes(name: str, parameter: str, value: Any) -> None:
    if parameter in ("embedding_dim", "hidden_size", "layers"):
        require(positive_int(value), name, f"{parameter} must be a positive int, got {value!r}")


def check_residual_sizes(name: str, parameter: str, value: Any) -> None:
    if parameter == "in_channels":
        require(value is None or positive_int(value), name,
                f"in_channels must be a positive int (or null: from the input), got {value!r}")
    elif parameter == "norm_groups":
        require(positive_int(value) and 16 % value == 0, name,
                f"norm_groups must divide 16 (the narrowest stage), got {value!r}")


def _built_in(name: str, implementation: str, **declared: Any) -> None:
    register(NetworkDeclaration(name, f"{IMPLEMENTATIONS}:{implementation}", **declared))


_built_in("lr", "LogisticRegressionNetwork", closed_form_gradients=True)
_built_in("svm", "LinearSVMNetwork", closed_form_gradients=True)
_built_in("softmax", "SoftmaxRegression", closed_form_gradients=True)
_built_in("mlp", "MultilayerPerceptron", parameters={"hidden": (1500, 1500)}, check=check_hidden_widths,
          fused_gradients=True)
_built_in("lenet5", "LeNet5")
_built_in("cnn-femnist", "FemnistCNN")
_built_in("char-lstm", "CharLSTM", parameters={"embedding_dim": 8, "hidden_size": 256, "layers": 2},
          check=check_recurrent_sizes)
for _depth in (20, 56, 110):
    _built_in(f"resnet{_depth}", f"ResNet{_depth}", parameters={"in_channels": None, "norm_groups": 2},
              check=check_residual_sizes)

# Networks of installed plugin packages (entry points "ldpbench.networks"), after the built-in ones,
# when a name that is not built in, or every name, is first asked for.
plugins.load_when_needed(NETWORKS)
