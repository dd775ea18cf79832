"""The two interfaces a registered mechanism implements: update mechanisms and data releases.

An update mechanism (`Mechanism`) privatises the updates of a whole cohort at once, every round: a
[clients, dims] tensor in, a [clients, report_dims] tensor of the clients' reports out (for most
mechanisms report_dims = dims and a report row is what the server can reconstruct from that client's
report; a count sketch reports its t·k table instead). The server turns the whole cohort's report
rows into the update estimate with `aggregate` (by default their mean).

A data release (`DataRelease`) privatises a client's records once, before training (features and
labels); training on the released records is post-processing, so the release is the only cost.

Both draw all randomness from the streams they are given and keep no random state of their own. The
runner asks any registered mechanism for its `stages()`: a release applied to the training records
(or none) and an update mechanism for the rounds (or none).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.rng import ClientStreams

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

# What a mechanism privatises (its `privatises`).
UPDATES = "updates"  # each round's update of the model's parameters
RECORDS = "records"  # a client's records (features and labels), once


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
    # The δ of an (ε, δ) claim (cpSGD); 0 for pure-ε claims. The worst case is always pure ε.
    delta_claimed: float = 0.0


@dataclass(frozen=True)
class AuditPair:
    """Two inputs of one report for the privacy audit (ldpbench.audit): updates [dims] for update
    mechanisms; feature rows [dims] and labels for data releases. Under LDP any two are neighbours."""

    name: str
    x: torch.Tensor
    x_prime: torch.Tensor
    label_x: int = 0
    label_x_prime: int = 0


class Privatized(NamedTuple):
    reports: torch.Tensor  # [clients, report_dims]: each client's report (decoded where decoding is per report)
    state: torch.Tensor | None  # the clients' new local state (e.g. FedSel's residuals), if any


class Stages(NamedTuple):
    """What privatises a run: a release of the training records before training, an update mechanism
    for every round's updates; either may be None (a round without one aggregates the plain mean)."""

    release: DataRelease | None
    updates: Mechanism | None


class RegisteredMechanism(ABC):
    """What every registered mechanism has; subclasses are frozen dataclasses of their parameters.

    Every subclass takes `epsilon` (the budget of one report) and `dims` (the width of what it
    privatises: `input_dims`) and its own keyword parameters, which campaign files set by name.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    privatises: ClassVar[str]  # UPDATES or RECORDS
    # Non-private baselines run once per seed, not once per ε.
    private: ClassVar[bool] = True
    # Fields set by the runner, not by campaign files.
    hidden_fields: ClassVar[tuple[str, ...]] = ("epsilon", "dims", "cohort_size")

    # A budget at which the default parameters are valid (tests, benchmarks). sqSGD's PrivQuant,
    # for one, has no valid (κ, p) at small ε; its paper runs at ε = 200..3000.
    example_epsilon: ClassVar[float] = 2.0

    epsilon: float
    dims: int

    @classmethod  # noqa: B027 (an optional hook: by default nothing to check)
    def check_epsilon(cls, epsilon: float, params: dict) -> None:
        """Raise ConfigError if these parameters cannot run at this ε whatever the model's size.

        Called by campaign validation for every ε of a mechanism entry, before any job starts.
        Default: nothing to check; checks that need the parameter count (sqSGD's PrivQuant) happen
        when the run creates the mechanism.
        """

    @classmethod
    @abstractmethod
    def input_dims(cls, model_dims: int, record_dims: int) -> int:
        """`dims` for a run whose network has `model_dims` parameters and whose records `record_dims` values."""

    @classmethod
    @abstractmethod
    def reports_bound(cls, participations: int) -> int:
        """The most reports one client can send in a run (a total ε is split evenly over them), given
        the most rounds one client takes part in (the engine's number: TrainingSettings.most_rounds_per_client).

        A number, not the training settings: what a mechanism is charged for depends on how often a
        client reports, never on how the engine samples or trains.
        """

    @abstractmethod
    def stages(self) -> Stages:
        """Where this mechanism acts in a run."""

    @abstractmethod
    def reports_per_client(self, participations: torch.Tensor) -> torch.Tensor:
        """Reports each client sent (its ledger), given the rounds [clients] each took part in."""

    @abstractmethod
    def accounting(self) -> Accounting:
        """Cost of one report."""

    def _check_common(self) -> None:
        if not isinstance(self.dims, int) or self.dims < 1:
            raise ConfigError(f"mechanism '{self.name}': dims must be a positive integer, got {self.dims!r}")
        if not (self.epsilon > 0):
            raise ConfigError(f"mechanism '{self.name}': epsilon must be > 0, got {self.epsilon!r}")


class Mechanism(RegisteredMechanism):
    """An update mechanism: privatises each round's updates of the model's d parameters."""

    privatises = UPDATES
    # Stateful mechanisms keep a per-client local vector between the rounds a client takes part in.
    stateful: ClassVar[bool] = False

    @classmethod
    def input_dims(cls, model_dims: int, record_dims: int) -> int:
        return model_dims

    @classmethod
    def reports_bound(cls, participations: int) -> int:
        """One report per round taken part in."""
        return participations

    def stages(self) -> Stages:
        return Stages(release=None, updates=self)

    def reports_per_client(self, participations: torch.Tensor) -> torch.Tensor:
        return participations

    @property
    def report_dims(self) -> int:
        """Width of one client's report row (dims unless the report is, e.g., a sketch)."""
        return self.dims

    def aggregate(self, reports: torch.Tensor) -> torch.Tensor:
        """The server's update estimate [dims] from the cohort's report rows [clients, report_dims].

        Called once per round over the whole cohort's rows, in cohort order, so the reduction does
        not depend on how the cohort was chunked. Default: the mean of the decoded reports.
        """
        return reports.mean(dim=0)

    def correct(self, estimate: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """Client-side post-processing of the aggregate: each worker's own version of `estimate`.

        `estimate` [dims] is what `aggregate` returned; `local` [clients, dims] holds each worker's
        own latest update. Returns [clients, dims]. Default: every worker uses the estimate as is.
        Only DiffSketch's error correction (Appendix C) overrides it; it is post-processing of the
        released aggregate with the worker's own data, so it costs no privacy.
        """
        return estimate.expand(local.shape[0], -1)

    @property
    def state_dims(self) -> int:
        """Width of one client's local state row (stateful mechanisms; dims unless they keep more)."""
        return self.dims

    def initial_state(self, clients: int, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """The clients' zero local state (default float32), or None for a stateless mechanism."""
        if not self.stateful:
            return None
        return torch.zeros(clients, self.state_dims, dtype=torch.float32 if dtype is None else dtype)

    def audit_pairs(self) -> list[AuditPair]:
        """Inputs the privacy audit tries (ldpbench.audit): by default the corners +1 and −1 of
        [-1, 1]^d, where value perturbers are most distinguishable, and one coordinate at +1 and −1
        (a single changed coordinate, the sketches' and the selectors' hardest case). Mechanisms with
        another domain or a better pair override it."""
        ones, first = torch.ones(self.dims, dtype=torch.float64), torch.zeros(self.dims, dtype=torch.float64)
        first[0] = 1.0
        return [AuditPair("all coordinates +1 / -1", ones, -ones), AuditPair("first coordinate +1 / -1", first, -first)]

    @abstractmethod
    def privatize(
        self,
        updates: torch.Tensor,
        streams: ClientStreams,
        state: torch.Tensor | None = None,
    ) -> Privatized:
        """Privatise a cohort's updates [clients, dims]; `state` is the cohort's rows of the local state."""


class Released(NamedTuple):
    features: torch.Tensor  # [records, ...] the released features
    labels: torch.Tensor  # [records] the released labels


class DataRelease(RegisteredMechanism):
    """A data release: privatises a client's records (features and labels) once, before training.

    `dims` is the width of one record's features. Training on the released records is
    post-processing: a client sends one report (its release) whatever the rounds, so ε per report
    is the whole ε and the ledger counts every client once.
    """

    privatises = RECORDS
    hidden_fields = RegisteredMechanism.hidden_fields + ("classes",)

    @classmethod
    def input_dims(cls, model_dims: int, record_dims: int) -> int:
        return record_dims

    @classmethod
    def reports_bound(cls, participations: int) -> int:
        """One report, the release, whatever the rounds."""
        return 1

    def stages(self) -> Stages:
        return Stages(release=self, updates=None)

    def reports_per_client(self, participations: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(participations)

    def audit_pairs(self) -> list[AuditPair]:
        """Records the privacy audit tries (ldpbench.audit): every feature at +1 with label 0 against
        every feature at −1 with label 1, the farthest apart for encodings of [-1, 1]."""
        ones = torch.ones(self.dims, dtype=torch.float64)
        return [AuditPair("features +1 / -1, labels 0 / 1", ones, -ones, 0, 1)]

    @abstractmethod
    def release(self, features: torch.Tensor, labels: torch.Tensor, streams: ClientStreams) -> Released:
        """Release records [records, dims] and their labels [records]; row i draws from streams' client i."""


def index_bits(dims: int) -> int:
    """Bits to send one index into [dims]."""
    return max(1, math.ceil(math.log2(dims))) if dims > 1 else 0


FLOAT_BITS = 32
