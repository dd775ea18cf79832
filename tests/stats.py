"""Statistical test helpers with stated false-alarm rates.

Every check here rejects a correct implementation with probability at most ALPHA (two-sided, under
the normal approximation, valid at the sample sizes used), and each test module pairs it with a
power check that a deliberately wrong implementation is rejected.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from ldpbench.rng import ClientStreams

ALPHA = 1e-6
Z = float(stats.norm.isf(ALPHA / 2))  # ≈ 4.89


def mean_matches(samples: np.ndarray, expected_mean: float, true_variance: float) -> bool:
    """z-test of the sample mean against `expected_mean`, with the known variance."""
    n = samples.size
    return abs(samples.mean() - expected_mean) <= Z * math.sqrt(true_variance / n)


def variance_matches(samples: np.ndarray, expected_variance: float, mean: float) -> bool:
    """z-test of the mean squared deviation from the known mean against the expected variance.

    D = (Y − mean)² has E[D] = Var[Y]; its standard error is estimated from the sample. (With a
    known mean this stays exact where the sample variance's asymptotics fail, e.g. a symmetric
    two-point output, whose D is constant.)
    """
    deviations = (samples - mean) ** 2
    tolerance = Z * deviations.std(ddof=1) / math.sqrt(samples.size) + 1e-12 * expected_variance
    return abs(deviations.mean() - expected_variance) <= tolerance


def frequencies_match(counts: np.ndarray, probabilities: np.ndarray) -> bool:
    """Pearson chi-squared goodness of fit at level ALPHA."""
    total = counts.sum()
    expected = total * probabilities
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return stats.chi2.sf(statistic, len(counts) - 1) > ALPHA


def streams(seed: int, rows) -> ClientStreams:
    """Per-row random streams for a test draw: `rows` is a count or the tensor to be privatised."""
    return ClientStreams(("test", seed), rows if isinstance(rows, int) else rows.shape[0])


class EdgeStreams(ClientStreams):
    """Streams whose every uniform is one edge of what ClientStreams.rand can return: exactly 0
    (`low`) or the largest draw below 1 (`high`: 1 − 2^-24 in float32, 1 − 2^-53 in float64).

    Every other draw (randint, randn, laplace, gumbel) is derived from rand, so a mechanism run on
    these streams meets the edge in every transform it applies."""

    def __init__(self, edge: str, clients: int):
        if edge not in ("low", "high"):
            raise ValueError(f"edge must be 'low' or 'high', got {edge!r}")
        super().__init__(("edge", edge), clients)
        self.edge = edge

    def rand(self, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        value = 0.0 if self.edge == "low" else 1.0 - torch.finfo(dtype).eps / 2
        return torch.full(tuple(int(s) for s in shape), value, dtype=dtype, device=self.device)


def clopper_pearson(hits: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds on a binomial probability, each wrong with probability ≤ alpha."""
    lower = float(stats.beta.ppf(alpha, hits, n - hits + 1)) if hits > 0 else 0.0
    upper = float(stats.beta.isf(alpha, hits + 1, n - hits)) if hits < n else 1.0
    return lower, upper


def audited_epsilon(outputs_x: np.ndarray, outputs_x_prime: np.ndarray, min_hits: int = 30) -> float:
    """A lower bound on the ε of a mechanism from its outputs [n, m] under two inputs x and x'
    (LDP-Auditor, Arcolezi & Gambs 2024; Jagielski et al. 2020), false alarm ≤ ALPHA.

    On the first half of each sample: the statistic T = ⟨y, w⟩, w the difference of the two mean
    outputs, and the event {T > τ} whose Clopper–Pearson ratio is largest (τ among the upper order
    statistics of T under x', keeping ≥ min_hits hits). On the second half, independent of that
    choice: ln(p_low / q_high) with one-sided bounds at ALPHA/2 each. If the mechanism is ε-LDP,
    P(x-event) ≤ e^ε·P(x'-event), so the result exceeds ε only if a bound fails: probability ≤ ALPHA.
    """
    half = min(len(outputs_x), len(outputs_x_prime)) // 2
    first_x, second_x = outputs_x[:half], outputs_x[half:2 * half]
    first_y, second_y = outputs_x_prime[:half], outputs_x_prime[half:2 * half]
    w = first_x.mean(axis=0) - first_y.mean(axis=0)
    t_x, t_y = np.sort(first_x @ w), np.sort(first_y @ w)

    def bound(statistic_x, statistic_y, tau, alpha):
        p_low = clopper_pearson(int((statistic_x > tau).sum()), len(statistic_x), alpha)[0]
        q_high = clopper_pearson(int((statistic_y > tau).sum()), len(statistic_y), alpha)[1]
        return math.log(p_low / q_high) if p_low > 0 else -math.inf

    candidates = [t_y[-hits] for hits in np.unique(np.geomspace(min_hits, half // 2, 40).astype(int))]
    tau = max(candidates, key=lambda c: bound(t_x, t_y, c, ALPHA / 2))
    return bound(second_x @ w, second_y @ w, tau, ALPHA / 2)
