"""LDP-FL weight perturbation (Sun et al. 2021), with and without the "anonymizer" accounting.

Every coordinate w is clipped to [c − r, c + r] and released as c ± r·(e^ε+1)/(e^ε−1) with
P(+) = ((w−c)(e^ε−1) + r(e^ε+1)) / (2r(e^ε+1)): unbiased, and ε-LDP per coordinate.
Reference §1; BitRand App. L for the anonymizer reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import Accounting, Mechanism, Privatized
from ldpbench.mechanisms.registry import register


def ldp_fl_plus_probability(w, epsilon: float, centre: float, radius: float):
    e = math.exp(epsilon)
    return ((w - centre) * (e - 1) + radius * (e + 1)) / (2 * radius * (e + 1))


@register
@dataclass(frozen=True)
class LdpFl(Mechanism):
    """LDP-FL on every coordinate of the update.

    anonymizer = False (default, honest composition): each of the d coordinates gets ε/d, so a
    report is ε-LDP (claimed = worst case = ε).
    anonymizer = True (the paper's accounting): each coordinate gets the whole ε and the claim is
    ε per report with no composition over dimensions or rounds, as if an anonymizer/shuffler
    unlinked them; the worst case of the report is d·ε, composed over rounds.
    CHOICE: applied to gradients, the server-sent range is centre 0, radius 1 (the clip range).
    """

    name = "ldp-fl"
    description = "LDP-FL two-point perturbation of every coordinate (optional anonymizer accounting)"

    epsilon: float
    dims: int
    anonymizer: bool = False
    centre: float = 0.0
    radius: float = 1.0

    def __post_init__(self) -> None:
        self._check_common()
        if not self.radius > 0:
            raise ConfigError(f"mechanism '{self.name}': radius must be > 0, got {self.radius!r}")

    @property
    def epsilon_coordinate(self) -> float:
        return self.epsilon if self.anonymizer else self.epsilon / self.dims

    def privatize(self, updates, streams, state=None) -> Privatized:
        eps = self.epsilon_coordinate
        w = updates.clamp(self.centre - self.radius, self.centre + self.radius)
        plus = streams.rand(w.shape, w.dtype) < ldp_fl_plus_probability(
            w, eps, self.centre, self.radius)
        half_width = self.radius * (math.exp(eps) + 1) / (math.exp(eps) - 1)
        return Privatized(self.centre + half_width * (2 * plus.to(w.dtype) - 1), None)

    def accounting(self) -> Accounting:
        worst = self.dims * self.epsilon_coordinate
        return Accounting(self.epsilon, worst, float(self.dims), claimed_composes=not self.anonymizer)
