"""Federated algorithms: what each client computes from the server weights, and how the server steps.

FedSGD: a client's update is the gradient of its records' mean loss, and the server descends,
w ← w − η·g. FedAvg: a client's update is its model delta after E local epochs of minibatch SGD, and
the server moves along it, w ← w + η·Δ. Either computes a chunk of clients at once with
`vmap(grad(...))` over the flat model; every random draw (a client's batch sample, its local
shuffles) comes from keyed streams, so a client's update does not depend on the chunk it is in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.func import grad, vmap

from ldpbench.errors import ConfigError
from ldpbench.fl.model import FlatModel, as_inputs
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
        return as_inputs(self._rows(self.features, record_ids), self.dtype)

    def targets(self, record_ids: torch.Tensor) -> torch.Tensor:
        return self._rows(self.labels, record_ids)

    @staticmethod
    def _rows(table: torch.Tensor, record_ids: torch.Tensor) -> torch.Tensor:
        """table[record_ids] by index_select (a third of advanced indexing's cost on CPU)."""
        return table.index_select(0, record_ids.reshape(-1)).reshape(*record_ids.shape, *table.shape[1:])

    def client_records(self, client: int) -> torch.Tensor:
        return self.records[self.offsets[client]:self.offsets[client + 1]]


class Algorithm(ABC):
    """How a round trains: each client's update from the server weights, and the server's step."""

    name: ClassVar[str]
    # The server moves by server_sign · η · (aggregated update).
    server_sign: ClassVar[float]

    def __init__(self, model: FlatModel, data: ClientRecords, settings: TrainingSettings, seed: int) -> None:
        self.model, self.data, self.settings, self.seed = model, data, settings, seed
        closed_form = settings.gradients == "auto" and model.network.has_closed_form_gradients()
        # How this run's gradients are computed, recorded in its summary (training.gradients).
        self.gradients = "closed-form" if closed_form else "vmap"

    @abstractmethod
    def updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """The updates of clients `ids` in round `round_index`, [clients, d]."""

    def server_step(self, weights: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """The server weights after applying the aggregated update `step`."""
        return weights + self.server_sign * self.settings.learning_rate * step

    def shuffled_positions(self, ids: torch.Tensor, sizes: torch.Tensor, longest: int, key) -> torch.Tensor:
        """Each client's own random order of its record positions 0..size-1, [clients, longest].

        A client's k-th sort key depends only on (key, client, k), so its order ignores the padding
        and the chunk it is computed in; padded columns sort last.
        """
        streams = ClientStreams(key, ids)
        valid = torch.arange(longest, device=self.data.device).unsqueeze(0) < sizes.unsqueeze(1)
        keys = torch.where(valid, streams.rand((len(ids), longest), torch.float64), 2.0)
        return torch.argsort(keys, dim=1, stable=True)


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
        super().__init__(model, data, settings, seed)
        largest_client = int((data.offsets[1:] - data.offsets[:-1]).max())
        self.block = max(1, min(settings.block_records, largest_client))
        # FedSel's setting (every client one record): a unit is a client, its record is records[offset].
        self.one_record_each = largest_client == 1 and bool((data.offsets[1:] > data.offsets[:-1]).all())

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
            means = sums / counts.to(dtype).unsqueeze(1)
        return means + l2 * weights if l2 else means


@register
class FedAvg(Algorithm):
    """Each client sends its model delta after local epochs of minibatch SGD; the server moves along it."""

    name = "fedavg"
    server_sign = 1.0

    def updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """Each client's model delta after local_epochs of minibatch SGD on its records, [clients, d]."""
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
