"""How a run trains: the one home of every training setting and its default.

Campaign files set these under `training:` (campaign-wide, per dataset, per mechanism entry); what a
campaign leaves unset takes the default written here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.fl.clients import FIXED_CLIENT_SCHEMES, PARTITIONS, rounds_per_epoch

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

ALGORITHMS = ("fedsgd", "fedavg")
# How clients' gradients are computed (ldpbench.fl.algorithms.resolve_gradients): "closed-form" — by
# the network's formula (the linear models); "vmap" — vmap(grad(...)) over the clients of a chunk;
# "per-client" — plain autograd, client after client, on the network's own per-layer parameters;
# "fused" — client after client, the network's written-out backward writing each weight gradient
# scaled and added where it goes (FedSGD's row with l2·w, FedAvg's step into the weights) by the
# product that makes it (networks.FusedGradients); "auto" — the formula where there is one, else,
# when a client's step holds at least 16 records, fused where the network has it and per-client
# where not, and vmap below. The strategies agree to float rounding; the summary records the one that ran.
GRADIENTS = ("auto", "closed-form", "vmap", "per-client", "fused")
# What early stopping may watch: the validation clients' metrics (a loss is minimised, the rest maximised).
STOP_METRICS = ("validation_accuracy", "validation_auc", "validation_loss")


@dataclass(frozen=True)
class PartitionSettings:
    """How training records are assigned to clients (campaign `training.partition`)."""

    scheme: str = "record"  # record, iid, natural or dirichlet (ldpbench.fl.clients)
    clients: int | None = None  # iid and dirichlet: the number of clients
    alpha: float = 0.5  # dirichlet: the concentration (small: strong label skew)

    def __post_init__(self) -> None:
        if self.scheme not in PARTITIONS:
            raise ConfigError(f"training.partition.scheme must be one of {PARTITIONS}, got {self.scheme!r}")
        if self.scheme in FIXED_CLIENT_SCHEMES and self.clients is None:
            raise ConfigError(f"training.partition.clients (the number of clients) is needed by scheme "
                              f"'{self.scheme}'")


@dataclass(frozen=True)
class StopSettings:
    """Early stopping on a validation plateau (campaign `training.stop`); needs validation clients.

    Decided from the evaluated curve alone, so it is deterministic and a resumed run stops where an
    uninterrupted one does.
    """

    patience: int = 5  # evaluations in a row without an improvement of more than min_delta
    min_delta: float = 0.0  # the least change of `metric` that counts as an improvement
    metric: str = "validation_accuracy"  # one of STOP_METRICS
    max_rounds: int = 0  # the most rounds a run may train; 0: its planned rounds (rounds or epochs)

    def __post_init__(self) -> None:
        if self.metric not in STOP_METRICS:
            raise ConfigError(f"training.stop.metric must be one of {STOP_METRICS}, got {self.metric!r}")
        if self.patience < 1 or self.min_delta < 0 or self.max_rounds < 0:
            raise ConfigError(f"training.stop needs patience >= 1, min_delta >= 0 and max_rounds >= 0, got {self}")


@dataclass(frozen=True)
class TrainingSettings:
    """How a run trains; every field is part of the run plan (campaign `training:`)."""

    learning_rate: float = 0.1  # server step η
    algorithm: str = "fedsgd"
    epochs: int = 1  # passes over the clients; with the epoch sampler each is N/m rounds
    rounds: int = 0  # 0: epochs × rounds per epoch
    batch_fraction: float = 0.01  # m = batch_fraction·N unless cohort_size is set
    cohort_size: int = 0
    sampler: str = "epoch"
    partition: PartitionSettings = field(default_factory=PartitionSettings)
    local_epochs: int = 1  # FedAvg
    local_batch_size: int = 32  # FedAvg
    local_learning_rate: float = 0.1  # FedAvg
    l2: float = 1e-4
    eval_every: int = 10
    eval_train_records: int = 10_000  # the training loss is measured on a fixed sample this large
    # "total": ε is a client's whole budget, spent evenly over the reports it can send;
    # "per_report": ε is the budget of every report (the ledger still composes them).
    epsilon_scope: str = "total"
    chunk_clients: int = 0  # clients per vectorised chunk (bounds memory); 0: the whole cohort
    block_records: int = 64  # records per vmapped unit in FedSGD
    gradients: str = "auto"  # one of GRADIENTS; the run summary records the strategy that ran
    # FedSGD: 0 — a client's gradient is over all its records (cross-device form); R > 0 — over a
    # uniform subsample of R of its records drawn afresh each round (sqSGD's cross-silo form, R = 32).
    client_batch_size: int = 0
    device: str = "cpu"  # "cpu", "cuda" or "auto"
    checkpoint_every: int = 0  # rounds between checkpoints; 0: none
    # Share of the training clients held out as validation clients: they never train, and the curve
    # gains their metrics (validation_*), which tuning selects by and early stopping watches.
    validation_fraction: float = 0.0
    stop: StopSettings | None = None  # early stopping on a validation plateau; None: train every round

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingSettings:
        """The settings a campaign's `training:` block (or a serialised plan) gives; defaults fill the rest."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"training has no setting(s) {unknown}; its settings are {sorted(known)}")
        partition = values.get("partition", {})
        if not isinstance(partition, dict):
            raise ConfigError(f"training.partition must be a mapping, got {partition!r}")
        partition_known = {f.name for f in fields(PartitionSettings)}
        if set(partition) - partition_known:
            raise ConfigError(f"training.partition has no setting(s) {sorted(set(partition) - partition_known)}; "
                              f"its settings are {sorted(partition_known)}")
        stop = values.get("stop")
        if stop is not None and not isinstance(stop, dict):
            raise ConfigError(f"training.stop must be a mapping or null, got {stop!r}")
        stop_known = {f.name for f in fields(StopSettings)}
        if stop and set(stop) - stop_known:
            raise ConfigError(f"training.stop has no setting(s) {sorted(set(stop) - stop_known)}; "
                              f"its settings are {sorted(stop_known)}")
        return cls(**{**values, "partition": PartitionSettings(**partition),
                      "stop": None if stop is None else StopSettings(**stop)})

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"training.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.gradients not in GRADIENTS:
            raise ConfigError(f"training.gradients must be one of {GRADIENTS}, got {self.gradients!r}")
        if self.epsilon_scope not in ("total", "per_report"):
            raise ConfigError(f"training.epsilon_scope must be 'total' or 'per_report', got {self.epsilon_scope!r}")
        if self.client_batch_size < 0:
            raise ConfigError(f"training.client_batch_size must be >= 0, got {self.client_batch_size}")
        if self.device not in ("cpu", "cuda", "auto"):
            raise ConfigError(f"training.device must be 'cpu', 'cuda' or 'auto', got {self.device!r}")
        if not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"training.validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if self.stop is not None and self.validation_fraction == 0:
            raise ConfigError("training.stop watches the validation clients: set training.validation_fraction "
                              "> 0 as well")

    def cohort(self, clients: int) -> int:
        """m: clients per round (FedSel: m = 0.01·N)."""
        size = self.cohort_size or max(1, round(self.batch_fraction * clients))
        return min(size, clients)

    def total_rounds(self, clients: int) -> int:
        """The rounds a run plans (early stopping may end it sooner): stop.max_rounds where set."""
        if self.stop is not None and self.stop.max_rounds:
            return self.stop.max_rounds
        return self.rounds or self.epochs * rounds_per_epoch(clients, self.cohort(clients))

    def most_rounds_per_client(self, clients: int) -> int:
        """The most rounds one client takes part in: one per epoch (epoch sampler) or every round (a
        mechanism's reports_bound turns it into the most reports one client sends)."""
        if self.sampler == "epoch":
            return math.ceil(self.total_rounds(clients) / rounds_per_epoch(clients, self.cohort(clients)))
        return self.total_rounds(clients)

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("training.device is 'cuda' but no CUDA device is available")
        return torch.device(self.device)
