"""Name → mechanism class (update mechanisms and data releases). `create` is the only way runs build them."""

from __future__ import annotations

import dataclasses
from typing import Any

from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import RegisteredMechanism
from ldpbench.registry import Registry

MECHANISMS: Registry[type[RegisteredMechanism]] = Registry("mechanism")
# Class decorator (registers under `cls.name`), lookup and listing.
register = MECHANISMS.register
get = MECHANISMS.get
names = MECHANISMS.names


def parameters(name: str) -> dict[str, Any]:
    """The mechanism's own parameters (beyond epsilon and dims) with their defaults."""
    cls = get(name)
    return {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.name not in cls.hidden_fields and f.default is not dataclasses.MISSING
    }


def create(name: str, epsilon: float, dims: int, params: dict[str, Any] | None = None,
           **context: Any) -> RegisteredMechanism:
    """Build a mechanism for one report of budget `epsilon` on `dims`-dimensional inputs.

    `context` (set by the runner: cohort_size, classes) is passed to the mechanisms that have
    such a field and ignored by the others.
    """
    cls = get(name)
    params = dict(params or {})
    allowed = parameters(name)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ConfigError(
            f"mechanism '{name}' has no parameter(s) {unknown}; its parameters are "
            f"{sorted(allowed) or 'none'}"
        )
    field_names = {f.name for f in dataclasses.fields(cls)}
    params.update({key: value for key, value in context.items() if key in field_names})
    return cls(epsilon=float(epsilon), dims=int(dims), **params)
