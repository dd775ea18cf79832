"""LDP mechanisms: two interfaces (`base.Mechanism` for updates, `base.DataRelease` for records), one
registry, one module per family.

Importing this package registers every mechanism.
"""

# Imported for their registration side effect.
from ldpbench.mechanisms import bitrand, cldp, fedsel, ldpfl, projection, quantize, scalar, sketch, sqsgd  # noqa: F401
from ldpbench.mechanisms.base import (
           Accounting,
           DataRelease,
           Mechanism,
           Privatized,
           RegisteredMechanism,
           Released,
           Stages,
)
from ldpbench.mechanisms.registry import create, get, names, parameters, register

__all__ = ["Accounting", "DataRelease", "Mechanism", "Privatized", "RegisteredMechanism", "Released", "Stages",
           "create", "get", "names", "parameters", "register"]

# Mechanisms of installed plugin packages (entry points "ldpbench.mechanisms"), after the built-in ones.
from ldpbench import plugins as _plugins  # noqa: E402
from ldpbench.mechanisms.registry import MECHANISMS as _MECHANISMS  # noqa: E402

PLUGINS = _plugins.load(_MECHANISMS)
