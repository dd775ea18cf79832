"""PM-RP: the compressed baseline of FedSel §3.1 / §5.3 (after Li et al.'s random projection).

The client projects its gradient with a public Gaussian matrix Φ (d × q, entries N(0, 1/q)),
samples one of the q projected coordinates, clips it to [-1, 1] and perturbs it with PM (scaled
by q, as in the flat solution); the server recovers a d-dimensional estimate with the
pseudo-inverse of Φᵀ. Recovery is linear, so each report is decoded on its own and the mean of
decodings equals the decoding of the mean.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import FLOAT_BITS, Accounting, Mechanism, Privatized, index_bits
from ldpbench.mechanisms.registry import register
from ldpbench.mechanisms.scalar import piecewise, sample_coordinates
from ldpbench.rng import generator as keyed_generator

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())


@functools.lru_cache(maxsize=16)
def public_projection(seed: int, dims: int, q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Φ and pinv(Φᵀ) in float64, computed once per (seed, d, q): the pseudo-inverse is O(d·q²)."""
    gen = keyed_generator("pm-rp projection", seed, dims, q)
    phi = torch.randn(dims, q, generator=gen, dtype=torch.float64) / q**0.5
    return phi, torch.linalg.pinv(phi.T)


@register
@dataclass(frozen=True)
class RandomProjectionPM(Mechanism):
    """PM-RP: ε-LDP per report (one PM value of a coordinate chosen independently of the data).

    CHOICE: q = max(1, round(ratio·d)) with ratio 0.1 (FedSel's compression ratio); Φ comes from
    the public seed `projection_seed`, the same for every client and round.
    """

    name = "pm-rp"
    description = "random projection to q = ratio·d dims, one coordinate perturbed with PM"

    epsilon: float
    dims: int
    ratio: float = 0.1
    projection_seed: int = 0

    def __post_init__(self) -> None:
        self._check_common()
        if not 0.0 < self.ratio <= 1.0:
            raise ConfigError(f"mechanism '{self.name}': ratio must be in (0, 1], got {self.ratio!r}")

    @property
    def q(self) -> int:
        return max(1, round(self.ratio * self.dims))

    def projection(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(Φ [d, q], pinv(Φᵀ) [d, q]) from the public seed."""
        phi, recover = public_projection(self.projection_seed, self.dims, self.q)
        return phi.to(dtype), recover.to(dtype)

    def privatize(self, updates, streams, state=None) -> Privatized:
        phi, recover = self.projection(updates.dtype)
        clients = updates.shape[0]
        chosen = sample_coordinates(clients, self.q, 1, streams).squeeze(1)
        # Only the chosen projection is needed; a row-wise product-and-sum (rather than a matmul
        # over the cohort) keeps each client's number independent of the cohort's size.
        projected = (updates * phi.T[chosen]).sum(dim=1, keepdim=True)
        noisy = piecewise(projected.clamp(-1.0, 1.0), self.epsilon, streams) * self.q
        # The estimate e_j·noisy mapped back through pinv(Φᵀ) is noisy times column j.
        return Privatized(noisy * recover.T[chosen], None)

    def accounting(self) -> Accounting:
        return Accounting(self.epsilon, self.epsilon, FLOAT_BITS + index_bits(self.q))
