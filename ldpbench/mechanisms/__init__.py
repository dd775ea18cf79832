"""LDP mechanisms: one interface (`base.Mechanism`), one registry, one module per family.

Importing this package registers every mechanism.
"""

# Imported for their registration side effect.
from ldpbench.mechanisms import bitrand, cldp, fedsel, ldpfl, projection, quantize, scalar, sketch, sqsgd  # noqa: F401
from ldpbench.mechanisms.base import Accounting, Mechanism, Privatized
from ldpbench.mechanisms.registry import create, get, names, parameters

__all__ = ["Accounting", "Mechanism", "Privatized", "create", "get", "names", "parameters"]
