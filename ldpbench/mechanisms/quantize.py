"""Quantisation baselines of DiffSketch and sqSGD: cpSGD (Agarwal et al. 2018) and vqSGD
(Gandikota et al.); reference §3–4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import Accounting, Mechanism, Privatized, index_bits
from ldpbench.mechanisms.registry import register
from ldpbench.mechanisms.sqsgd import clip_l2, stochastic_level
from ldpbench.rng import ClientStreams

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

MAX_BINOMIAL_TRIALS = 256


def binomial_half(streams: ClientStreams, shape, trials: int) -> torch.Tensor:
    """Binomial(trials, 1/2) draws as sums of `trials` fair bits (one uniform each)."""
    bits = streams.rand((*shape, trials), torch.float64) < 0.5
    return bits.sum(dim=-1).to(torch.float64)


# ------------------------------------------------------------------------------ cpSGD
# DiffSketch App. C Table 1: cpSGD's (k, m) for a target ε and bits per coordinate, computed by
# DiffSketch's authors from cpSGD's theorem with Agarwal et al.'s δ, s, p (10 of 6,000 workers).
CPSGD_TABLE_1 = {(5.0, 4): (12, 4), (5.0, 5): (23, 9), (10.0, 4): (14, 2), (10.0, 5): (28, 4)}


@register
@dataclass(frozen=True)
class CpSGD(Mechanism):
    """cpSGD: stochastic k-level quantisation of each coordinate plus Binomial(m, 1/2) noise.

    Each coordinate is clipped to [−clip, clip] and rounded without bias to one of k levels
    (index U ∈ {0..k−1}); the client sends Z = U + T, T ~ Binomial(m, 1/2) (sum of m fair bits),
    i.e. one of k + m values, ⌈log2(k+m)⌉ bits per coordinate. Decoding is per report and unbiased:
    x̂ = −clip + 2·clip·(Z − m/2)/(k−1), Var = Var_quantisation + (2·clip/(k−1))²·m/4.

    Parameters. By default (k, m) come from DiffSketch App. C Table 1 for the run's ε and `bits`
    (ε = 5: k = 12, m = 4 at 4 bits, k = 23, m = 9 at 5 bits; ε = 10: k = 14, m = 2 / k = 28,
    m = 4), so the noise tightens as ε shrinks; other ε are refused, because neither paper gives
    (k, m) for them and this module does not re-derive cpSGD's theorem. Explicit `k` and `m` are
    accepted (ablations, tests) but then carry no claim: the claimed ε is ∞ unless (ε, k, m) is a
    Table 1 row.

    Accounting. cpSGD's (ε, δ) is a distributed-DP guarantee for the sum of the cohort's reports
    (secure aggregation); the claim recorded is that ε with `delta` beside it. The worst case of
    one report is `inf`: its support {U..U+m} moves with the input, so an output possible for one
    input is impossible for another. CHOICE: δ = 1e-5 by default (the papers' exact δ is not
    restated in our sources); no random rotation (cpSGD's optional one).
    """

    name = "cpsgd"
    description = "cpSGD: k-level stochastic quantisation + Binomial(m, 1/2) noise ((ε, δ) claim)"
    example_epsilon = 5.0  # Table 1 gives (k, m) only at ε = 5 and 10

    epsilon: float
    dims: int
    bits: int = 4
    k: int | None = None
    m: int | None = None
    clip: float = 1.0
    delta: float = 1e-5

    def __post_init__(self) -> None:
        self._check_common()
        if (self.k is None) != (self.m is None):
            raise ConfigError(f"mechanism '{self.name}': set both k and m, or neither (then Table 1 picks them)")
        if self.k is None:
            row = CPSGD_TABLE_1.get((float(self.epsilon), self.bits))
            if row is None:
                supported = ", ".join(f"ε={e:g} bits={b}" for e, b in CPSGD_TABLE_1)
                raise ConfigError(f"mechanism '{self.name}': DiffSketch App. C Table 1 gives (k, m) only for "
                                  f"{supported}; got ε={self.epsilon:g} bits={self.bits!r} "
                                  "(set epsilons/bits to a row, or k and m explicitly, which carries no ε claim)")
            object.__setattr__(self, "k", row[0])
            object.__setattr__(self, "m", row[1])
        if not (isinstance(self.k, int) and self.k >= 2):
            raise ConfigError(f"mechanism '{self.name}': k must be an integer >= 2, got {self.k!r}")
        if not (isinstance(self.m, int) and 0 <= self.m <= MAX_BINOMIAL_TRIALS):
            raise ConfigError(f"mechanism '{self.name}': m must be an integer in [0, {MAX_BINOMIAL_TRIALS}], "
                              f"got {self.m!r}")
        if not self.clip > 0:
            raise ConfigError(f"mechanism '{self.name}': clip must be > 0, got {self.clip!r}")
        if not 0 <= self.delta < 1:
            raise ConfigError(f"mechanism '{self.name}': delta must be in [0, 1), got {self.delta!r}")

    @classmethod
    def check_epsilon(cls, epsilon: float, params: dict) -> None:
        if "k" not in params and "m" not in params:
            cls(epsilon=epsilon, dims=1, **params)

    @property
    def claim_backed(self) -> bool:
        """Whether (ε, k, m) is a Table 1 row, i.e. whether the ε claim has a source."""
        return any(float(self.epsilon) == e and (self.k, self.m) == row for (e, _), row in CPSGD_TABLE_1.items())

    @property
    def step(self) -> float:
        return 2.0 * self.clip / (self.k - 1)

    def variance(self, x: float) -> float:
        """Exact per-coordinate variance of the decoded report at x ∈ [−clip, clip]."""
        position = (x + self.clip) / self.step
        fraction = position - math.floor(position)
        return self.step**2 * (fraction * (1 - fraction) + self.m / 4.0)

    def privatize(self, updates, streams, state=None) -> Privatized:
        x = updates.to(torch.float64).clamp(-self.clip, self.clip)
        index = stochastic_level(x, self.k, self.clip, streams.rand(x.shape, torch.float64))
        sent = index.to(torch.float64) + binomial_half(streams, x.shape, self.m) if self.m else index.to(torch.float64)
        decoded = -self.clip + self.step * (sent - self.m / 2.0)
        return Privatized(decoded.to(updates.dtype), None)

    def accounting(self) -> Accounting:
        bits = self.dims * math.ceil(math.log2(self.k + self.m))
        claimed = self.epsilon if self.claim_backed else math.inf
        return Accounting(claimed, math.inf, bits, delta_claimed=self.delta)


# ------------------------------------------------------------------------------ vqSGD
def cross_polytope_probabilities(v: torch.Tensor) -> torch.Tensor:
    """P over the 2d vertices (+√d·e_i at i, −√d·e_i at d + i) for v in the unit ℓ2 ball [.., d].

    P(sign(v_i)·√d·e_i) = |v_i|/√d + γ/(2d), the opposite vertex γ/(2d), γ = 1 − ‖v‖₁/√d ≥ 0,
    so that E[vertex] = v. (At v_i = 0 both vertices get γ/(2d).)
    """
    d = v.shape[-1]
    root = math.sqrt(d)
    gamma = (1.0 - v.abs().sum(dim=-1, keepdim=True) / root).clamp_min(0.0)
    base = gamma / (2 * d)
    plus = base + v.clamp_min(0.0) / root
    minus = base + (-v).clamp_min(0.0) / root
    return torch.cat([plus, minus], dim=-1)


def vq_keep_probability(epsilon: float, d: int) -> float:
    """Randomised response over 2d vertices: keep with e^ε/(e^ε + 2d − 1)."""
    return 1.0 / (1.0 + (2 * d - 1) * math.exp(-epsilon))


def vq_debias_factor(epsilon: float, d: int) -> float:
    """E[released vertex | chosen c] = (keep − (1−keep)/(2d−1))·c = (e^ε−1)/(e^ε+2d−1)·c."""
    return -math.expm1(-epsilon) / (1.0 + (2 * d - 1) * math.exp(-epsilon))


@register
@dataclass(frozen=True)
class VqSGD(Mechanism):
    """vqSGD with the cross-polytope scheme and randomised response (ε-LDP), b repetitions.

    v = update clipped to the ℓ2 ball of radius `clip`, divided by clip; a vertex ±√d·e_i is drawn
    with the unbiased probabilities (cross_polytope_probabilities, inverse CDF of one uniform),
    then released by 2d-ary randomised response with ε/b (keep with e^{ε/b}/(e^{ε/b}+2d−1), else a
    uniform other vertex). Decoding per report: clip·vertex/factor, factor = (e^{ε/b}−1)/(e^{ε/b}+2d−1),
    averaged over the b repetitions: unbiased for the clipped update.
    Claimed = worst case = ε per report (b releases of ε/b; each RR ratio is exactly e^{ε/b}, and
    the vertex choice before it is post-processed input). Bits: b·⌈log2(2d)⌉.
    CHOICE: ε is split evenly over the b repetitions (the sqSGD comparison counts b·ε' composed).
    """

    name = "vqsgd"
    description = "vqSGD cross-polytope quantisation + 2d-ary randomised response, b repetitions"

    epsilon: float
    dims: int
    repetitions: int = 1
    clip: float = 1.0

    def __post_init__(self) -> None:
        self._check_common()
        if not (isinstance(self.repetitions, int) and self.repetitions >= 1):
            raise ConfigError(f"mechanism '{self.name}': repetitions must be an integer >= 1, got {self.repetitions!r}")
        if not self.clip > 0:
            raise ConfigError(f"mechanism '{self.name}': clip must be > 0, got {self.clip!r}")

    @property
    def epsilon_repetition(self) -> float:
        return self.epsilon / self.repetitions

    def privatize(self, updates, streams, state=None) -> Privatized:
        clients, d = updates.shape
        b = self.repetitions
        v = clip_l2(updates.to(torch.float64), self.clip) / self.clip
        cdf = cross_polytope_probabilities(v).cumsum(dim=1)  # [clients, 2d]
        u = streams.rand((clients, b), torch.float64) * cdf[:, -1:]  # scaled: rounding in the cumsum
        chosen = torch.searchsorted(cdf, u, right=True).clamp(max=2 * d - 1)  # [clients, b]
        keep = streams.rand((clients, b), torch.float64) < vq_keep_probability(self.epsilon_repetition, d)
        other = streams.randint(2 * d - 1, (clients, b))
        other = other + (other >= chosen).to(other.dtype)  # a uniform vertex among the 2d − 1 others
        released = torch.where(keep, chosen, other)
        coordinate = released % d
        sign = 1.0 - 2.0 * (released >= d).to(torch.float64)
        value = sign * math.sqrt(d) * self.clip / (vq_debias_factor(self.epsilon_repetition, d) * b)
        reports = torch.zeros(clients, d, dtype=torch.float64, device=updates.device).scatter_add_(1, coordinate, value)
        return Privatized(reports.to(updates.dtype), None)

    def accounting(self) -> Accounting:
        return Accounting(self.epsilon, self.epsilon, self.repetitions * index_bits(2 * self.dims))
