"""LDP-Fed (Truex et al. 2020): parameter selection + α-CLDP (Gursoy et al. 2019); reference §4.

Condensed LDP: a mechanism is α-CLDP if P(y|x) ≤ e^{α·dist(x, x')}·P(y|x'). LDP-Fed releases each
selected value with the exponential mechanism P(y | x) ∝ exp(−α·|x − y|/2) over a finite grid; over
a grid of diameter D such a mechanism is (α·D)-LDP, Gursoy et al.'s conversion, which sqSGD uses to
compare at a common ε.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import Accounting, Mechanism, Privatized, index_bits
from ldpbench.mechanisms.registry import register
from ldpbench.mechanisms.scalar import sample_coordinates
from ldpbench.mechanisms.sqsgd import stochastic_level

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())


def cldp_grid(levels: int, clip: float) -> torch.Tensor:
    return torch.linspace(-clip, clip, levels, dtype=torch.float64)


@functools.lru_cache(maxsize=64)
def cldp_law(levels: int, clip: float, alpha: float) -> torch.Tensor:
    """[input level, output level] probabilities of the exponential mechanism exp(−α·|x − y|/2)."""
    grid = cldp_grid(levels, clip)
    logits = -alpha * (grid.unsqueeze(1) - grid.unsqueeze(0)).abs() / 2
    return torch.softmax(logits, dim=1)


def cldp_worst_case(levels: int, clip: float, alpha: float) -> float:
    """Exact max over inputs x, x' and outputs y of ln P(y|x)/P(y|x') (≤ α·D, D = 2·clip)."""
    law = cldp_law(levels, clip, alpha).log()
    return float((law.max(dim=0).values - law.min(dim=0).values).max())


@register
@dataclass(frozen=True)
class LdpFed(Mechanism):
    """LDP-Fed: k = max(1, round(fraction·d)) coordinates chosen uniformly (independently of the
    data), each clipped to [−clip, clip], rounded without bias to a grid of `levels` points, released
    by the α-CLDP exponential mechanism, and scaled by d/k (as the flat baselines; zeros elsewhere).

    Budget: α = ε/(k·D), D = 2·clip, so each value is (α·D)-LDP by Gursoy et al.'s conversion and
    the report ε-LDP by composition over its k values (claimed ε). The worst case is k times the
    exact worst ratio of the grid mechanism (cldp_worst_case, ≤ α·D), ≤ ε. (With the 1/2 in the
    exponent the exact ratio is close to α·D/2 when α·D is small: the conversion is conservative.)
    The exponential mechanism is not unbiased (it pulls values towards the grid's centre); LDP-Fed
    does not debias it and neither does this implementation.
    CHOICEs: `levels` = 16 (4 bits per value; sqSGD sets clip and grid so that communication
    matches the other baselines), `fraction` = 0.01 of the coordinates, random (not top-k)
    selection, stochastic rounding onto the grid.
    Bits: k·(⌈log2 levels⌉ + ⌈log2 d⌉).
    """

    name = "ldp-fed"
    description = "LDP-Fed: random parameter selection + α-CLDP exponential mechanism on a grid"

    epsilon: float
    dims: int
    fraction: float = 0.01
    clip: float = 1.0
    levels: int = 16

    def __post_init__(self) -> None:
        self._check_common()
        if not 0.0 < self.fraction <= 1.0:
            raise ConfigError(f"mechanism '{self.name}': fraction must be in (0, 1], got {self.fraction!r}")
        if not self.clip > 0:
            raise ConfigError(f"mechanism '{self.name}': clip must be > 0, got {self.clip!r}")
        if not (isinstance(self.levels, int) and self.levels >= 2):
            raise ConfigError(f"mechanism '{self.name}': levels must be an integer >= 2, got {self.levels!r}")

    @property
    def k(self) -> int:
        return min(self.dims, max(1, round(self.fraction * self.dims)))

    @property
    def alpha(self) -> float:
        return self.epsilon / (self.k * 2.0 * self.clip)

    def privatize(self, updates, streams, state=None) -> Privatized:
        clients, dims = updates.shape
        k = self.k
        chosen = sample_coordinates(clients, dims, k, streams)
        values = updates.to(torch.float64).gather(1, chosen).clamp(-self.clip, self.clip)
        index = stochastic_level(values, self.levels, self.clip, streams.rand(values.shape, torch.float64))
        device = updates.device
        cdf = cldp_law(self.levels, self.clip, self.alpha).cumsum(dim=1).to(device)[index]  # [clients, k, levels]
        u = streams.rand((clients, k, 1), torch.float64) * cdf[..., -1:]
        released = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=self.levels - 1)
        noisy = cldp_grid(self.levels, self.clip).to(device)[released] * (dims / k)
        reports = torch.zeros(clients, dims, dtype=torch.float64, device=device).scatter_(1, chosen, noisy)
        return Privatized(reports.to(updates.dtype), None)

    def accounting(self) -> Accounting:
        worst = self.k * cldp_worst_case(self.levels, self.clip, self.alpha)
        bits = self.k * (math.ceil(math.log2(self.levels)) + index_bits(self.dims))
        return Accounting(self.epsilon, worst, bits)
