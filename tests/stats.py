"""Statistical test helpers with stated false-alarm rates.

Every check here rejects a correct implementation with probability at most ALPHA (two-sided, under
the normal approximation, valid at the sample sizes used), and each test module pairs it with a
power check that a deliberately wrong implementation is rejected.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ldpbench.audit import lower_bound
from ldpbench.mechanisms.contract import EdgeStreams, streams  # noqa: F401  (the tests import them from here)

ALPHA = 1e-6
Z = float(stats.norm.isf(ALPHA / 2))  # ≈ 4.89


def mean_matches(samples: np.ndarray, expected_mean: float, true_variance: float) -> bool:
    """z-test of the sample mean against `expected_mean`, with the known variance."""
    n = samples.size
    return abs(samples.mean() - expected_mean) <= Z * math.sqrt(true_variance / n)


def variance_matches(samples: np.ndarray, expected_variance: float, mean: float, resolution: float = 1e-12) -> bool:
    """z-test of the mean squared deviation from the known mean against the expected variance.

    D = (Y − mean)² has E[D] = Var[Y]; its standard error is estimated from the sample. (With a
    known mean this stays exact where the sample variance's asymptotics fail, e.g. a symmetric
    two-point output, whose D is constant.) `resolution` is the relative rounding of the samples'
    arithmetic allowed on top (1e-12 for float64; float32 reports need about 1e-6).
    """
    deviations = (samples - mean) ** 2
    tolerance = Z * deviations.std(ddof=1) / math.sqrt(samples.size) + resolution * expected_variance
    return abs(deviations.mean() - expected_variance) <= tolerance


def frequencies_match(counts: np.ndarray, probabilities: np.ndarray) -> bool:
    """Pearson chi-squared goodness of fit at level ALPHA."""
    total = counts.sum()
    expected = total * probabilities
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return stats.chi2.sf(statistic, len(counts) - 1) > ALPHA


def audited_epsilon(outputs_x: np.ndarray, outputs_x_prime: np.ndarray) -> float:
    """A lower bound on the ε of a mechanism from its outputs [n, m] under two inputs x and x',
    exceeding the true ε with probability ≤ ALPHA: the package's audit (ldpbench.audit.lower_bound)."""
    return lower_bound(outputs_x, outputs_x_prime, ALPHA).epsilon


def compiled_and_plain(monkeypatch, make):
    """make() with every CPU draw and perturber compiled (numba), then with none: (compiled, plain).

    The compiled kernels must give the plain path's bits; tests compare the two results.
    """
    import ldpbench.rng as rng

    monkeypatch.setattr(rng, "speed", rng.DrawSpeed(min_values=0))
    compiled = make()
    # A process that has trained few rounds and has not loaded the kernels.
    monkeypatch.setattr(rng, "speed", rng.DrawSpeed(min_values=1 << 62))
    return compiled, make()


def make_pm_modify_its_inputs(monkeypatch) -> None:
    """A deliberately broken PM for the contract's power checks: it doubles the updates it is given."""
    from ldpbench import mechanisms

    pm = mechanisms.get("pm")
    original = pm.privatize

    def modifying(self, updates, client_streams, state=None):
        out = original(self, updates, client_streams, state)
        updates.mul_(2)
        return out

    monkeypatch.setattr(pm, "privatize", modifying)
