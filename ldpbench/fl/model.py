"""A network as a function of one flat parameter vector: what algorithms step and mechanisms privatise."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from ldpbench.fl.networks import Network, create_network
from ldpbench.rng import derive_seed


def build_network(name: str, input_shape: tuple[int, ...], classes: int, seed: int,
                  params: dict[str, Any] | None = None) -> Network:
    """The network with its initial parameters drawn from a generator keyed by the run seed only."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "init"))
        return create_network(name, tuple(input_shape), classes, **(params or {}))


class FlatModel:
    """A network seen as a function of one flat parameter vector (what mechanisms privatise)."""

    def __init__(self, network: Network) -> None:
        self.network = network
        named = list(network.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.dims = sum(self.sizes)

    def initial(self, zero: bool) -> torch.Tensor:
        flat = torch.cat([p.detach().reshape(-1) for p in self.network.parameters()])
        return torch.zeros_like(flat) if zero else flat.clone()

    def starting_weights(self) -> torch.Tensor:
        """Where training starts: w = 0 for networks that declare `zero_start` (the linear models, as
        in FedSel), the seeded initial parameters otherwise (see build_network)."""
        return self.initial(zero=self.network.zero_start)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: part.view(shape) for name, part, shape in
                zip(self.names, flat.split(self.sizes), self.shapes)}

    def outputs(self, flat: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(self.network, self.unflatten(flat), (inputs,))

    def summed_gradients(self, flat: torch.Tensor, inputs, targets, mask) -> torch.Tensor:
        """Each unit's gradient of its summed loss by the network's formula, [units, d].

        `flat` is the shared weights [d] or one vector per unit [units, d] (FedAvg's local models).
        """
        if flat.dim() == 1:
            params = self.unflatten(flat)
        else:
            params = {name: part.reshape(len(flat), *shape)
                      for name, part, shape in zip(self.names, flat.split(self.sizes, dim=1), self.shapes)}
        gradients = self.network.summed_gradients(params, inputs, targets, mask)
        parts = [gradients[name].reshape(len(inputs), -1) for name in self.names]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def summed_loss(self, flat, inputs, targets, mask):
        """Sum of the per-example losses over the unmasked examples of one unit."""
        losses = self.network.per_example_loss(self.outputs(flat, inputs), targets)
        return (losses * mask).sum()


def take_rows(table: torch.Tensor, index: torch.Tensor | np.ndarray) -> torch.Tensor:
    """table[index] along the first dimension (index of any shape), by index_select: the same values as
    advanced indexing, several times faster on CPU at a run's tens of thousands of training rows."""
    index = torch.as_tensor(index, device=table.device)
    return table.index_select(0, index.reshape(-1)).reshape(*index.shape, *table.shape[1:])


def as_inputs(features: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 pixels → [0, 1]; token ids stay integers; everything else to the working dtype."""
    if features.dtype == torch.uint8:
        return features.to(dtype) / 255.0
    if not features.is_floating_point():
        return features
    return features.to(dtype)
