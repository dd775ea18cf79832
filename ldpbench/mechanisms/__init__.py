"""LDP mechanisms: two interfaces (`base.Mechanism` for updates, `base.DataRelease` for records), one
registry, one module per family.

Importing this package registers every mechanism: each module of the package is imported, in name
order, so a new mechanism is a new module here and nothing else. Left out are the modules that must
not load with the package (NOT_IMPORTED below); base and registry load first, through the imports of
this file and of every mechanism module.
"""

import importlib
import pkgutil

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

# contract: the checks run by the tests and `ldpbench check`, not a mechanism; numba_perturbers:
# numba's compiled perturbers, which ldpbench.rng loads only when a draw is large enough to pay
# numba's import (numba is optional).
NOT_IMPORTED = frozenset({"contract", "numba_perturbers"})


def mechanism_modules() -> list[str]:
    """The package's modules imported for their registrations, in name order (a stable order)."""
    return sorted(module.name for module in pkgutil.iter_modules(__path__)
                  if module.name not in NOT_IMPORTED and not module.name.startswith("_"))


for _module in mechanism_modules():
    importlib.import_module(f"{__name__}.{_module}")

# Mechanisms of installed plugin packages (entry points "ldpbench.mechanisms"), after the built-in ones,
# when a name that is not built in, or every name, is first asked for.
from ldpbench import plugins as _plugins  # noqa: E402
from ldpbench.mechanisms.registry import MECHANISMS as _MECHANISMS  # noqa: E402

_plugins.load_when_needed(_MECHANISMS)
