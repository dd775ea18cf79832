"""Scalar value perturbation on [-1, 1] and the flat multi-dimensional sampling wrapper.

References: Wang et al., "Collecting and Analyzing Multidimensional Data with Local Differential
Privacy", ICDE 2019 (Piecewise mechanism, Algorithm 4 sampling); ../shared/reference/mechanisms.md §1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ldpbench.mechanisms.base import FLOAT_BITS, Accounting, Mechanism, Privatized, index_bits
from ldpbench.mechanisms.registry import register


def piecewise(x: torch.Tensor, epsilon: float, generator: torch.Generator) -> torch.Tensor:
    """Piecewise mechanism: an unbiased ε-LDP estimate of each entry of x (entries in [-1, 1]).

    With z = e^{ε/2}, C = (z+1)/(z-1): with probability z/(z+1) the output is uniform on the
    central interval [l(x), r(x)] of length C-1, otherwise uniform on the two tails
    [-C, l) ∪ (r, C], whose total length is C+1. Output densities differ by exactly e^ε.
    """
    z = math.exp(epsilon / 2.0)
    c = (z + 1.0) / (z - 1.0)
    left = (c + 1.0) / 2.0 * x - (c - 1.0) / 2.0
    right = left + c - 1.0
    central = torch.rand(x.shape, generator=generator, dtype=x.dtype) < z / (z + 1.0)
    position = torch.rand(x.shape, generator=generator, dtype=x.dtype)
    inside = left + (c - 1.0) * position
    # A point on the tails: walk a distance t in [0, C+1) from -C, skipping the central interval.
    t = position * (c + 1.0)
    left_tail_length = left + c
    outside = torch.where(t < left_tail_length, -c + t, right + (t - left_tail_length))
    return torch.where(central, inside, outside)


def piecewise_variance(x: float | torch.Tensor, epsilon: float) -> float | torch.Tensor:
    """Var[PM(x)] = x²/(z-1) + (z+3)/(3(z-1)²), z = e^{ε/2}."""
    z = math.exp(epsilon / 2.0)
    return x * x / (z - 1.0) + (z + 3.0) / (3.0 * (z - 1.0) ** 2)


def piecewise_bound(epsilon: float) -> float:
    """C: PM outputs lie in [-C, C]."""
    z = math.exp(epsilon / 2.0)
    return (z + 1.0) / (z - 1.0)


def flat_sample_size(epsilon: float, dims: int) -> int:
    """Wang et al. Alg. 4: k = max(1, min(d, floor(ε/2.5))) coordinates per report."""
    return max(1, min(dims, math.floor(epsilon / 2.5)))


def sample_coordinates(clients: int, dims: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """k distinct coordinates per client, uniformly: [clients, k] indices."""
    if k == 1:
        return torch.randint(dims, (clients, 1), generator=generator)
    keys = torch.rand(clients, dims, generator=generator)
    return keys.topk(k, dim=1).indices


@register
@dataclass(frozen=True)
class FlatPiecewise(Mechanism):
    """Flat PM baseline: sample k of d coordinates, PM each with ε/k, scale by d/k (unbiased).

    Each coordinate is clipped to [-1, 1] first. Guarantee: ε-LDP per report (k reports of ε/k
    on disjoint coordinates, chosen independently of the data).
    """

    name = "pm"
    description = "flat Piecewise mechanism with Wang et al. coordinate sampling"

    epsilon: float
    dims: int

    def __post_init__(self) -> None:
        self._check_common()

    @property
    def k(self) -> int:
        return flat_sample_size(self.epsilon, self.dims)

    def privatize(self, updates, generator, state=None) -> Privatized:
        clients, dims = updates.shape
        k = self.k
        chosen = sample_coordinates(clients, dims, k, generator)
        values = updates.gather(1, chosen).clamp(-1.0, 1.0)
        noisy = piecewise(values, self.epsilon / k, generator) * (dims / k)
        reports = torch.zeros_like(updates).scatter_(1, chosen, noisy)
        return Privatized(reports, None)

    def accounting(self) -> Accounting:
        return Accounting(self.epsilon, self.epsilon, self.k * (FLOAT_BITS + index_bits(self.dims)))


@register
@dataclass(frozen=True)
class NoPrivacy(Mechanism):
    """NP: the full gradient is sent as is. No privacy: claimed and worst-case ε are infinite."""

    name = "np"
    description = "non-private baseline (full gradient)"

    epsilon: float
    dims: int

    def __post_init__(self) -> None:
        self._check_common()

    def privatize(self, updates, generator, state=None) -> Privatized:
        return Privatized(updates.clone(), None)

    def accounting(self) -> Accounting:
        return Accounting(math.inf, math.inf, FLOAT_BITS * self.dims)
