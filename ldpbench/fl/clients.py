"""Who the clients are and which of them report in each round.

A partition assigns every training record to one client and stores the assignment as CSR:
`records` lists record indices grouped by client, client c owning records[offsets[c]:offsets[c+1]].
Partitioners:
* `record`    — every record is its own client (FedSel's setting: N users, one record each);
* `iid`       — a seeded shuffle cut into `clients` near-equal parts;
* `natural`   — the dataset's own user ids (TFF Shakespeare roles, FEMNIST writers);
* `dirichlet` — label skew: for every class, the shares of the clients are drawn from Dir(α).

Cohort samplers:
* `epoch`   — FedSel Algorithm 1: every epoch the clients are shuffled and cut into rounds of m,
              so each client reports exactly once per epoch;
* `uniform` — m clients drawn uniformly without replacement, independently every round.
Both draw from generators keyed by (seed, epoch or round, purpose) only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.rng import derive_seed, generator

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

PARTITIONS = ("record", "iid", "natural", "dirichlet")
# The schemes whose number of clients is a setting (training.partition.clients), not the data's.
FIXED_CLIENT_SCHEMES = ("iid", "dirichlet")
SAMPLERS = ("epoch", "uniform")


@dataclass(frozen=True)
class Partition:
    records: np.ndarray  # int64 [n], record indices grouped by client
    offsets: np.ndarray  # int64 [clients + 1]

    @property
    def clients(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def from_assignment(cls, owner: np.ndarray, clients: int) -> Partition:
        """Build from owner[i] = client of record i (stable within a client)."""
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=clients)
        return cls(order.astype(np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))


def partition(scheme: str, labels: np.ndarray, seed: int, clients: int | None = None,
              alpha: float = 0.5, natural_ids: np.ndarray | None = None) -> Partition:
    """Partition n training records (with their labels) into clients; see the module docstring."""
    n = len(labels)
    if scheme == "record":
        return Partition(np.arange(n, dtype=np.int64), np.arange(n + 1, dtype=np.int64))
    if scheme == "natural":
        if natural_ids is None:
            raise ConfigError("training.partition.scheme 'natural' needs a dataset with client ids "
                              "(clients.npy); this dataset has none")
        _, owner = np.unique(natural_ids, return_inverse=True)
        return Partition.from_assignment(owner.astype(np.int64), int(owner.max()) + 1)
    if clients is None or not 1 <= clients <= n:
        raise ConfigError(f"training.partition.clients must be in [1, {n}] for scheme '{scheme}', "
                          f"got {clients!r}")
    rng = np.random.default_rng(derive_seed("partition", scheme, seed, n, clients, alpha))
    if scheme == "iid":
        owner = np.empty(n, dtype=np.int64)
        for client, part in enumerate(np.array_split(rng.permutation(n), clients)):
            owner[part] = client
        return Partition.from_assignment(owner, clients)
    if scheme == "dirichlet":
        if not alpha > 0:
            raise ConfigError(f"training.partition.alpha must be > 0, got {alpha!r}")
        owner = np.empty(n, dtype=np.int64)
        for label in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == label))
            shares = rng.dirichlet(np.full(clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
            for client, part in enumerate(np.split(members, cuts)):
                owner[part] = client
        return Partition.from_assignment(owner, clients)
    raise ConfigError(f"unknown training.partition.scheme '{scheme}'; known: {', '.join(PARTITIONS)}")


@dataclass(frozen=True)
class HeldOut:
    """A partition with its validation clients taken out (`hold_out_clients`)."""

    partition: Partition  # the training clients, renumbered from 0, over `training_records`
    training_records: np.ndarray  # int64, sorted: the records that still train (indices before the hold-out)
    validation_records: np.ndarray  # int64, sorted: the records of the validation clients


def hold_out_clients(partition: Partition, fraction: float, seed: int) -> HeldOut:
    """Take round(fraction × clients) whole clients out of training as validation clients.

    Which clients is keyed by the run seed alone. The remaining clients keep their order and are
    renumbered from 0; their records are renumbered into `training_records`, so the trainer sees
    only them (validation records are neither trained on, sampled for the training loss nor released).
    """
    clients = partition.clients
    held = validation_clients(fraction, clients)
    order = np.random.default_rng(derive_seed("validation clients", seed, clients)).permutation(clients)
    kept = np.zeros(clients, dtype=bool)
    kept[order[held:]] = True
    owner_kept = np.repeat(kept, partition.sizes)  # per entry of partition.records
    training_records = np.sort(partition.records[owner_kept])
    renumber = np.full(len(partition.records), -1, dtype=np.int64)
    renumber[training_records] = np.arange(len(training_records), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(partition.sizes[kept])]).astype(np.int64)
    return HeldOut(Partition(renumber[partition.records[owner_kept]], offsets), training_records,
                   np.sort(partition.records[~owner_kept]))


def validation_clients(fraction: float, clients: int) -> int:
    """round(fraction × clients), the validation clients of `clients`; at least one must validate and one
    train. A campaign's validation calls it where the number of clients is a setting."""
    held = round(fraction * clients)
    if not 1 <= held < clients:
        raise ConfigError(f"training.validation_fraction {fraction} holds out {held} of {clients} clients; "
                          "at least one must validate and one must train")
    return held


def rounds_per_epoch(clients: int, cohort_size: int) -> int:
    return max(1, clients // cohort_size)


def cohorts(sampler: str, clients: int, cohort_size: int, rounds: int, seed: int):
    """Yield (round index from 1, epoch index from 0, client ids int64 tensor) for every round."""
    if sampler == "epoch":
        per_epoch = rounds_per_epoch(clients, cohort_size)
        order_epoch, parts = None, ()
        for index in range(rounds):
            epoch, position = divmod(index, per_epoch)
            if epoch != order_epoch:  # keyed by the epoch alone, so a resumed run needs no state
                order = torch.randperm(clients, generator=generator(seed, epoch, "cohorts"))
                order_epoch, parts = epoch, torch.tensor_split(order, per_epoch)
            yield index + 1, epoch, parts[position]
    elif sampler == "uniform":
        for index in range(rounds):
            order = torch.randperm(clients, generator=generator(seed, index + 1, "cohort"))
            yield index + 1, index * cohort_size // clients, order[:cohort_size].sort().values
    else:
        raise ConfigError(f"unknown training.sampler '{sampler}'; known: {', '.join(SAMPLERS)}")
