"""The interface every mechanism implements.

A mechanism privatises the updates of a whole cohort at once: a [clients, dims] tensor in, a
[clients, dims] tensor of what the server can reconstruct from each client's report out. It draws
all randomness from the streams it is given and keeps no random state of its own.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from ldpbench.errors import ConfigError
from ldpbench.rng import ClientStreams


@dataclass(frozen=True)
class Accounting:
    """Privacy and communication cost of one client report.

    epsilon_claimed: the budget as the mechanism's paper accounts it.
    epsilon_worst_case: the pure ε-LDP of the report: the largest log-likelihood ratio of any output
        over any two inputs in the declared input domain; `inf` when no such bound exists.
    bits: uplink bits of the report (a float32 counts 32 bits, an index into [d] ceil(log2 d) bits).
    """

    epsilon_claimed: float
    epsilon_worst_case: float
    bits: float
    # Whether the claimed ε composes over the reports a client sends. False where the paper's
    # accounting does not compose (LDP-FL's anonymizer); the worst case always composes.
    claimed_composes: bool = True


class Privatized(NamedTuple):
    reports: torch.Tensor  # [clients, dims], the server-side decoding of each report
    state: torch.Tensor | None  # the clients' new local state (e.g. FedSel's residuals), if any


class Mechanism(ABC):
    """Base class of registered mechanisms; subclasses are frozen dataclasses of their parameters.

    Every subclass takes `epsilon` (the budget of one report) and `dims` (the update dimension) and
    its own keyword parameters, which campaign files set by name.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    # Stateful mechanisms keep a per-client local vector between the rounds a client takes part in.
    stateful: ClassVar[bool] = False
    # Non-private baselines run once per seed, not once per ε.
    private: ClassVar[bool] = True
    # "update": privatises each round's updates; "data": privatises a client's data set once.
    kind: ClassVar[str] = "update"
    # Fields set by the engine, not by campaign files.
    hidden_fields: ClassVar[tuple[str, ...]] = ("epsilon", "dims", "cohort_size")

    epsilon: float
    dims: int

    def _check_common(self) -> None:
        if not isinstance(self.dims, int) or self.dims < 1:
            raise ConfigError(f"mechanism '{self.name}': dims must be a positive integer, got {self.dims!r}")
        if not (self.epsilon > 0):
            raise ConfigError(f"mechanism '{self.name}': epsilon must be > 0, got {self.epsilon!r}")

    def initial_state(self, clients: int, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
        return torch.zeros(clients, self.dims, dtype=dtype) if self.stateful else None

    @abstractmethod
    def privatize(
        self,
        updates: torch.Tensor,
        streams: ClientStreams,
        state: torch.Tensor | None = None,
    ) -> Privatized:
        """Privatise a cohort's updates [clients, dims]; `state` is the cohort's rows of the local state."""

    @property
    def report_dims(self) -> int:
        """Width of one client's report row (a sketch may be narrower than the update)."""
        return self.dims

    def aggregate(self, reports: torch.Tensor) -> torch.Tensor:
        """The server's estimate of the cohort's mean update from all its report rows, [dims].

        Called once per round on the whole cohort's reports in cohort order, so the reduction
        does not depend on how the cohort was chunked.
        """
        return reports.mean(dim=0)

    @abstractmethod
    def accounting(self) -> Accounting:
        """Cost of one report."""


def index_bits(dims: int) -> int:
    """Bits to send one index into [dims]."""
    return max(1, math.ceil(math.log2(dims))) if dims > 1 else 0


FLOAT_BITS = 32
