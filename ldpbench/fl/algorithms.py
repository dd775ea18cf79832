"""Federated algorithms: what each client computes from the server weights, and how the server steps.

FedSGD: a client's update is the gradient of its records' mean loss, and the server descends,
w ← w − η·g. FedAvg: a client's update is its model delta after E local epochs of minibatch SGD, and
the server moves along it, w ← w + η·Δ. Either computes a chunk of clients at once with
`vmap(grad(...))` over the flat model; every random draw (a client's batch sample, its local
shuffles) comes from keyed streams, so a client's update does not depend on the chunk it is in.
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.func import grad, vmap

from ldpbench.errors import ConfigError
from ldpbench.fl.model import FlatModel, as_inputs, take_rows
from ldpbench.fl.network_declarations import check_gradients
from ldpbench.fl.networks import Network
from ldpbench.fl.settings import TrainingSettings
from ldpbench.registry import Registry
from ldpbench.rng import ClientStreams


@dataclass(frozen=True)
class ClientRecords:
    """The training records on the compute device, grouped by client: client c owns
    records[offsets[c]:offsets[c+1]] (indices into features and labels)."""

    features: torch.Tensor
    labels: torch.Tensor
    records: torch.Tensor
    offsets: torch.Tensor
    dtype: torch.dtype  # the working dtype the features are brought to

    @property
    def device(self) -> torch.device:
        return self.features.device

    def inputs(self, record_ids: torch.Tensor) -> torch.Tensor:
        return as_inputs(take_rows(self.features, record_ids), self.dtype)

    def targets(self, record_ids: torch.Tensor) -> torch.Tensor:
        return take_rows(self.labels, record_ids)

    def client_records(self, client: int) -> torch.Tensor:
        return self.records[self.offsets[client]:self.offsets[client + 1]]


class UpdateRows:
    """The matrices the per-client paths write a chunk's update rows into.

    Inside `reuse()` (the engine's round: FederatedTrainer.step) the k-th chunk asked for is the k-th
    matrix kept from the rounds before, grown where a chunk has more clients: a round of large updates
    then writes into memory already mapped. A fresh matrix above glibc's mmap threshold comes from the
    kernel page by page, and for BitRand's MLP with FedSGD (100 rows of 3.4 M values every round) its
    page faults took longer than writing the values. Elsewhere (a step strategy asking a trainer for
    its updates, a test) every matrix is fresh, since nothing says when the caller is done with it.
    Every element of a matrix handed out is written before it is read, so what is computed is the same.
    """

    def __init__(self) -> None:
        self._kept: list[torch.Tensor] = []
        self._handed_out: int | None = None  # how many matrices this round took; None: not reusing

    @contextlib.contextmanager
    def reuse(self) -> Iterator[None]:
        """Hand out the kept matrices: the caller uses none of them after the block (nor a view of one)."""
        self._handed_out = 0
        try:
            yield
        finally:
            self._handed_out = None

    def take(self, count: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [count, width] matrix whose every element the caller writes."""
        if self._handed_out is None:
            return torch.empty(count, width, dtype=dtype, device=device)
        slot = self._handed_out
        self._handed_out += 1
        if slot == len(self._kept):
            self._kept.append(torch.empty(0))
        kept = self._kept[slot]
        if kept.shape[0] < count or kept.shape[1:] != (width,) or kept.dtype != dtype or kept.device != device:
            self._kept[slot] = kept = torch.empty(count, width, dtype=dtype, device=device)
        return kept[:count]

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` lies in one of the kept matrices."""
        address = tensor.untyped_storage().data_ptr()
        return any(address == kept.untyped_storage().data_ptr() for kept in self._kept)

    def release(self) -> None:
        """Free the kept matrices (the run has trained its last round)."""
        self._kept.clear()


class Algorithm(ABC):
    """How a round trains: each client's update from the server weights, and the server's step."""

    name: ClassVar[str]
    # The server moves by server_sign · η · (aggregated update).
    server_sign: ClassVar[float]

    def __init__(self, model: FlatModel, data: ClientRecords, settings: TrainingSettings, seed: int) -> None:
        self.model, self.data, self.settings, self.seed = model, data, settings, seed
        # How this run's gradients are computed, recorded in its summary (training.gradients).
        self.gradients = resolve_gradients(settings.gradients, model.network, self.records_per_step())
        self._worker: Network | None = None
        self.update_rows = UpdateRows()

    @abstractmethod
    def records_per_step(self) -> int:
        """How many records one client's gradient step holds (what decides the strategy under auto)."""

    # -- per-client autograd (training.gradients: per-client) ------------------------------------
    @property
    def worker(self) -> Network:
        """A private copy of the network whose own per-layer parameters a client trains."""
        if self._worker is None:
            self._worker = copy.deepcopy(self.model.network)
        return self._worker

    def load(self, flat: torch.Tensor) -> None:
        """Copy flat weights into the worker's parameters (one pass; the hot loop then needs no flat vector)."""
        with torch.no_grad():
            for parameter, part in zip(self.worker.parameters(), flat.split(self.model.sizes)):
                parameter.copy_(part.view_as(parameter))

    def worker_gradient_sums(self, records: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """∂/∂parameters of the worker's summed loss over `records`: by the network's own backward where
        it writes one out (the same bits), else by ordinary autograd."""
        worker = self.worker
        inputs, targets = self.data.inputs(records), self.data.targets(records)
        written_out = worker.summed_loss_gradients(inputs, targets)
        if written_out is not None:
            return written_out
        losses = worker.per_example_loss(worker(inputs), targets)
        return torch.autograd.grad(losses.sum(), tuple(worker.parameters()))

    def shaped(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Views of a flat vector (weights or an update row) in the shapes of the worker's parameters."""
        return tuple(part.view_as(parameter) for part, parameter in zip(flat.split(self.model.sizes),
                                                                          self.worker.parameters()))

    def write_row(self, row: torch.Tensor, tensors, divisor: int | None = None,
                  minus: torch.Tensor | None = None) -> None:
        """Per-layer tensors into one row of a [clients, d] matrix (a copy each, no concatenation), each
        divided by `divisor`, or less the flat `minus`, on the way where one is given: the same values
        as dividing or subtracting in the row after, without another pass over it (a FedSGD row of
        BitRand's MLP is 3.4 M values, written to memory out of cache)."""
        parts = row.split(self.model.sizes)
        subtracted = minus.split(self.model.sizes) if minus is not None else (None,) * len(parts)
        for part, tensor, less in zip(parts, tensors, subtracted):
            if divisor is not None:
                torch.div(tensor.reshape(-1), divisor, out=part)
            elif less is not None:
                torch.sub(tensor.reshape(-1), less, out=part)
            else:
                part.copy_(tensor.reshape(-1))

    @abstractmethod
    def updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """The updates of clients `ids` in round `round_index`, [clients, d]."""

    def server_step(self, weights: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """The server weights after applying the aggregated update `step`."""
        scale = self.server_sign * self.settings.learning_rate
        # Multiplying by ±1 is exact, so these are the bits of weights + scale·step without a pass
        # over the step (FedAvg's usual server rate is 1).
        if scale == 1.0:
            return weights + step
        if scale == -1.0:
            return weights - step
        return weights + scale * step

    def shuffled_positions(self, ids: torch.Tensor, sizes: torch.Tensor, longest: int, key) -> torch.Tensor:
        """Each client's own random order of its record positions 0..size-1, [clients, longest].

        A client's k-th sort key depends only on (key, client, k), so its order ignores the padding
        and the chunk it is computed in; padded columns sort last.
        """
        streams = ClientStreams(key, ids)
        valid = torch.arange(longest, device=self.data.device).unsqueeze(0) < sizes.unsqueeze(1)
        keys = torch.where(valid, streams.rand((len(ids), longest), torch.float64), 2.0)
        return torch.argsort(keys, dim=1, stable=True)


# Under training.gradients: auto, a network without a formula trains client by client (plain autograd
# on its own per-layer parameters) where a client's step holds at least this many records, and by vmap
# over the clients where it holds fewer: vmap folds many tiny gradients into a few large products
# (FedSel's one-record clients), while for larger steps its batching costs more than it saves
# (with LeNet-5 and 32 records a client, vmap was slower than the per-client loop).
PER_CLIENT_MIN_RECORDS = 16
# The strategies that train client after client on the worker's own parameters: "fused" is
# "per-client" with the network's gradients scaled and added by the products that make them
# (networks.FusedGradients).
CLIENT_BY_CLIENT = ("per-client", "fused")
# A client's records go through the per-client path in blocks of at most this many (bounds memory).
PER_CLIENT_BLOCK_RECORDS = 1024


def resolve_gradients(requested: str, network: Network, records_per_step: int) -> str:
    """The strategy training.gradients `requested` means for this network and step size."""
    if requested == "auto":
        if network.has_closed_form_gradients():
            return "closed-form"
        if records_per_step < PER_CLIENT_MIN_RECORDS:
            return "vmap"
        return "fused" if network.has_fused_gradients() else "per-client"
    check_gradients(requested, network.name, network.has_closed_form_gradients(), network.has_fused_gradients())
    return requested


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
register = ALGORITHMS.register


def create_algorithm(model: FlatModel, data: ClientRecords, settings: TrainingSettings, seed: int) -> Algorithm:
    """The algorithm named by `settings.algorithm`."""
    try:
        cls = ALGORITHMS.get(settings.algorithm)
    except ConfigError as error:
        raise ConfigError(f"training.algorithm: {error}") from None
    return cls(model, data, settings, seed)


@register
class FedSGD(Algorithm):
    """Each client sends the gradient of its records' mean loss (+ l2·w); the server descends."""

    name = "fedsgd"
    server_sign = -1.0

    def __init__(self, model: FlatModel, data: ClientRecords, settings: TrainingSettings, seed: int) -> None:
        sizes = data.offsets[1:] - data.offsets[:-1]
        largest_client = int(sizes.max())
        self.block = max(1, min(settings.block_records, largest_client))
        # FedSel's setting (every client one record): a unit is a client, its record is records[offset].
        self.one_record_each = largest_client == 1 and bool((sizes > 0).all())
        self.median_client = int(sizes.median())
        super().__init__(model, data, settings, seed)

    def records_per_step(self) -> int:
        """A client's gradient is over its sample of client_batch_size records, or over all its records
        (the median client's, so that a few large clients do not decide)."""
        return min(self.settings.client_batch_size or self.median_client, self.median_client)

    def units(self, ids: torch.Tensor, round_index: int):
        """The vmapped units of a round: (record ids, mask, unit's client, records per client).

        The unit's client is None where unit i is client i with one record (every client has one).

        Whole clients are cut into fixed blocks of `block_records`; with `client_batch_size` R each
        client is one unit holding a fresh uniform sample of min(R, size) of its records.
        """
        data, device = self.data, self.data.device
        if self.one_record_each and not self.settings.client_batch_size:  # the general path, in 2 operations
            ones = torch.ones(len(ids), 1, dtype=torch.int64, device=device)
            return data.records.index_select(0, ids).unsqueeze(1), ones.bool(), None, ones.squeeze(1)
        starts, ends = data.offsets[ids], data.offsets[ids + 1]
        sizes = ends - starts
        batch = self.settings.client_batch_size
        if batch:
            longest = int(sizes.max())
            order = self.shuffled_positions(ids, sizes, longest, (self.seed, round_index, "client batch"))
            columns = torch.arange(batch, device=device).clamp(max=longest - 1)
            mask = torch.arange(batch, device=device).unsqueeze(0) < sizes.unsqueeze(1)
            record_ids = data.records[starts.unsqueeze(1) + torch.where(mask, order[:, columns], 0)]
            return record_ids, mask, torch.arange(len(ids), device=device), sizes.clamp(max=batch)
        blocks = (sizes + self.block - 1) // self.block
        unit_client = torch.repeat_interleave(torch.arange(len(ids), device=device), blocks)
        first_block = torch.cumsum(blocks, 0) - blocks
        unit_offset = (torch.arange(len(unit_client), device=device) - first_block[unit_client]) * self.block
        positions = starts[unit_client, None] + unit_offset[:, None] + torch.arange(self.block, device=device)
        mask = positions < ends[unit_client, None]
        record_ids = data.records[torch.where(mask, positions, starts[unit_client, None])]
        return record_ids, mask, unit_client, sizes

    def updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """Each client's gradient of its mean loss (+ l2·w), [clients, d]."""
        if self.gradients in CLIENT_BY_CLIENT:
            return self._per_client_updates(weights, ids, round_index)
        record_ids, mask, unit_client, counts = self.units(ids, round_index)
        dtype, l2 = self.data.dtype, self.settings.l2
        inputs, targets, mask = self.data.inputs(record_ids), self.data.targets(record_ids), mask.to(dtype)
        if self.gradients == "closed-form":
            unit_grads = self.model.summed_gradients(weights, inputs, targets, mask)
        else:
            # The server weights are shared by every unit (in_dims None): vmap folds the units into
            # large matrix products instead of one small product per unit.
            unit_grads = vmap(grad(self.model.summed_loss), in_dims=(None, 0, 0, 0))(weights, inputs, targets, mask)
        if unit_client is None:  # one unit per client, holding one record: the sum is the mean
            means = unit_grads
        else:
            sums = torch.zeros(len(ids), weights.numel(), dtype=dtype, device=self.data.device)
            sums.index_add_(0, unit_client, unit_grads)
            # A client without records (a Dirichlet partition can leave one) has no loss: its mean
            # gradient is 0, not 0/0.
            means = sums / counts.clamp(min=1).to(dtype).unsqueeze(1)
        return means + l2 * weights if l2 else means

    def _per_client_updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """updates() client by client on the worker's parameters, in blocks of records: each row is
        written as the gradient's mean plus l2·w, by the network's fused products at the server's
        weights (`fused`), or from its gradients at the worker's copy of them (`per-client`)."""
        fused = self.gradients == "fused"
        if not fused:
            self.load(weights)
        data, l2 = self.data, self.settings.l2
        out = self.update_rows.take(len(ids), weights.numel(), data.dtype, data.device)
        if self.settings.client_batch_size:  # the same keyed samples as the vmapped units
            record_ids, mask, _, _ = self.units(ids, round_index)
            clients_records = [record_ids[row][mask[row]] for row in range(len(ids))]
        else:
            clients_records = [data.client_records(client) for client in ids.tolist()]
        shaped_weights = self.shaped(weights) if fused else None
        for row, records in enumerate(clients_records):
            blocks = records.split(PER_CLIENT_BLOCK_RECORDS)
            update = out[row]
            if len(records) == 0:  # no loss: the gradient is l2·w alone (as the vmapped units give)
                torch.mul(weights, l2, out=update)
                continue
            if fused:  # the row is l2·w + Σ blocks' gradients / n, added by the products themselves
                parts = self.shaped(update)
                bases, beta = shaped_weights, l2
                for block in blocks:
                    self.worker.scaled_gradients_into(data.inputs(block), data.targets(block), parts,
                                                      bases, 1.0 / len(records), beta, at=shaped_weights)
                    bases, beta = parts, 1.0
                continue
            sums = self.worker_gradient_sums(blocks[0])
            for block in blocks[1:]:
                sums = tuple(total + more for total, more in zip(sums, self.worker_gradient_sums(block)))
            # The mean and l2 while the row is in cache, not as two more passes over all of
            # [clients, d] (BitRand's MLP: 100 × 3.4M values, 1.4 GB).
            self.write_row(update, sums, divisor=len(records))
            if l2:
                update.add_(weights, alpha=l2)
        return out


@register
class FedAvg(Algorithm):
    """Each client sends its model delta after local epochs of minibatch SGD; the server moves along it."""

    name = "fedavg"
    server_sign = 1.0

    def records_per_step(self) -> int:
        return self.settings.local_batch_size

    def updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """Each client's model delta after local_epochs of minibatch SGD on its records, [clients, d]."""
        if self.gradients in CLIENT_BY_CLIENT:
            return self._per_client_updates(weights, ids, round_index)
        settings, data, device = self.settings, self.data, self.data.device
        starts, sizes = data.offsets[ids], data.offsets[ids + 1] - data.offsets[ids]
        batch, longest = settings.local_batch_size, int(sizes.max())
        steps = (longest + batch - 1) // batch
        local = weights.expand(len(ids), -1).clone()

        def step_loss(flat, inputs, targets, mask):
            count = mask.sum().clamp_min(1.0)
            loss = self.model.summed_loss(flat, inputs, targets, mask) / count
            return loss + 0.5 * settings.l2 * flat.dot(flat) if settings.l2 else loss

        if self.gradients == "closed-form":
            def step_grad(flat, inputs, targets, mask):
                count = mask.sum(dim=1, keepdim=True).clamp_min(1.0)
                gradients = self.model.summed_gradients(flat, inputs, targets, mask) / count
                return gradients + settings.l2 * flat if settings.l2 else gradients
        else:
            step_grad = vmap(grad(step_loss))
        for local_epoch in range(settings.local_epochs):
            order = self.shuffled_positions(ids, sizes, longest,
                                            (self.seed, round_index, "local shuffle", local_epoch))
            for step in range(steps):
                cols = torch.arange(step * batch, (step + 1) * batch, device=device).clamp_(max=longest - 1)
                mask = (step * batch + torch.arange(batch, device=device)).unsqueeze(0) < sizes.unsqueeze(1)
                record_ids = data.records[starts.unsqueeze(1) + torch.where(mask, order[:, cols], 0)]
                gradients = step_grad(local, data.inputs(record_ids), data.targets(record_ids), mask.to(data.dtype))
                # In place: local is [clients, d], and every temporary of that size is a full pass
                # over memory (for a 2.8M-parameter MLP these passes cost as much as the gradients).
                gradients.mul_(settings.local_learning_rate)
                active = mask.any(dim=1, keepdim=True)
                if not bool(active.all()):  # clients whose records ran out take no step
                    gradients = torch.where(active, gradients, 0.0)
                local.sub_(gradients)
        return local - weights

    def _per_client_updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """updates() client by client: local SGD on the worker's own parameters, in place.

        The same keyed local shuffles as the vmapped path: a client's step k takes the records at
        positions [k·batch, (k+1)·batch) of its order, and a client whose records ran out stops.
        """
        settings, data = self.settings, self.data
        sizes = data.offsets[ids + 1] - data.offsets[ids]
        longest, batch = int(sizes.max()), settings.local_batch_size
        rate, l2 = settings.local_learning_rate, settings.l2
        orders = [self.shuffled_positions(ids, sizes, longest, (self.seed, round_index, "local shuffle", epoch))
                  for epoch in range(settings.local_epochs)]
        parameters = tuple(self.worker.parameters())
        fused = self.gradients == "fused"
        shaped_weights = self.shaped(weights) if fused else None
        out = self.update_rows.take(len(ids), weights.numel(), data.dtype, data.device)
        for row, client in enumerate(ids.tolist()):
            records, size = data.client_records(client), int(sizes[row])
            # Fused, the first step reads the server's weights where they are and writes the worker's
            # whole parameters: no copy of the weights into them first.
            at = shaped_weights
            if not fused:
                self.load(weights)
            for order in orders:
                shuffled = records[order[row, :size]]
                for step_records in shuffled.split(batch) if size else ():  # no records: no step
                    # w ← w − rate·(g/n + l2·w) = (1 − rate·l2)·w − (rate/n)·g
                    if fused:  # written into the weights by the products that make g
                        self.worker.scaled_gradients_into(data.inputs(step_records), data.targets(step_records),
                                                          parameters, at, -rate / len(step_records),
                                                          1.0 - rate * l2, at=at)
                        at = parameters
                        continue
                    gradients = self.worker_gradient_sums(step_records)
                    with torch.no_grad():  # two in-place passes
                        if l2:
                            torch._foreach_mul_(parameters, 1.0 - rate * l2)
                        torch._foreach_add_(parameters, gradients, alpha=-rate / len(step_records))
            if fused and at is shaped_weights:  # no step taken: the client's model is the server's
                self.load(weights)
            self.write_row(out[row], (parameter.detach() for parameter in parameters), minus=weights)
        return out
