"""One-coordinate randomized response: each client reports the sign of one coordinate it picks at random.

The client picks a coordinate j uniformly (independently of its data), clips u_j to [-1, 1] and reports
+B·e_j with probability 1/2 + u_j·(e^ε − 1)/(2(e^ε + 1)), else −B·e_j, with B = d·(e^ε + 1)/(e^ε − 1), so
that the report is an unbiased estimate of the clipped update. Both outputs for a given j have
probabilities in [1/(e^ε + 1), e^ε/(e^ε + 1)] whatever the input, and j does not depend on the input:
the report is ε-LDP, and that is both the claim and the worst case. It sends the index and one sign.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ldpbench.mechanisms import Accounting, Mechanism, Privatized, register


@register
@dataclass(frozen=True)
class OneCoordinateRR(Mechanism):
    """ε-LDP: randomized response on the sign of one uniformly chosen coordinate (see the module)."""

    name = "one-coordinate-rr"
    description = "example plugin: randomized response on the sign of one random coordinate"

    epsilon: float
    dims: int

    def __post_init__(self) -> None:
        self._check_common()

    def privatize(self, updates: torch.Tensor, streams, state=None) -> Privatized:
        clients, dims = updates.shape
        chosen = streams.randint(dims, (clients, 1))
        value = updates.gather(1, chosen).clamp(-1.0, 1.0)
        e = math.exp(self.epsilon)
        plus = 0.5 + value * (e - 1) / (2 * (e + 1))
        sign = torch.where(streams.rand((clients, 1), updates.dtype) < plus, 1.0, -1.0).to(updates.dtype)
        scale = dims * (e + 1) / (e - 1)
        return Privatized(torch.zeros_like(updates).scatter_(1, chosen, sign * scale), None)

    def accounting(self) -> Accounting:
        return Accounting(self.epsilon, self.epsilon, math.ceil(math.log2(self.dims)) + 1 if self.dims > 1 else 1)
