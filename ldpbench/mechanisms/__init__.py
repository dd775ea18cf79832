"""LDP mechanisms: one interface (`base.Mechanism`), one registry, one module per family.

Importing this package registers every mechanism.
"""

from ldpbench.mechanisms import bitrand, fedsel, ldpfl, projection, scalar  # noqa: F401  (registration)
from ldpbench.mechanisms.base import Accounting, Mechanism, Privatized
from ldpbench.mechanisms.registry import create, get, names, parameters

__all__ = ["Accounting", "Mechanism", "Privatized", "create", "get", "names", "parameters"]
