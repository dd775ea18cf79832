"""A plain numpy implementation of the per-coordinate value perturbers: the reference of
benchmarks/mechanism_throughput.py (performance goal 3: PM, HM and Duchi at least 5× this).

The same laws as ldpbench.mechanisms.scalar, written as a numpy user would (one vectorised pass per
step, numpy's default generator, float64), with no keyed streams: it is what a mechanism costs
without ldpbench's determinism across shards. tests/benchmarks checks each against the closed forms.
"""

from __future__ import annotations

import math

import numpy as np

from ldpbench.mechanisms.scalar import duchi_bound, hybrid_pm_weight


def piecewise(x: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """PM (Wang et al. 2019): uniform on [l(x), l(x) + C − 1] with probability z/(z+1), else on the tails."""
    z = math.exp(epsilon / 2.0)
    c = (z + 1.0) / (z - 1.0)
    left = (c + 1.0) / 2.0 * x - (c - 1.0) / 2.0
    right = left + c - 1.0
    central = rng.random(x.shape) < z / (z + 1.0)
    position = rng.random(x.shape)
    t = position * (2 * c - (c - 1.0))
    outside = np.where(t < left + c, -c + t, right + (t - (left + c)))
    return np.where(central, left + (c - 1.0) * position, outside)


def duchi(x: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Duchi et al.'s one-dimensional mechanism: ±B with P(+B) = 1/2 + x(e^ε − 1)/(2(e^ε + 1))."""
    e = math.exp(epsilon)
    plus = rng.random(x.shape) < 0.5 + x * (e - 1.0) / (2.0 * (e + 1.0))
    bound = duchi_bound(epsilon)
    return np.where(plus, bound, -bound)


def hybrid(x: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """HM (Wang et al. 2019): PM with probability 1 − e^{−ε/2} when ε > 0.61, else Duchi."""
    use_pm = rng.random(x.shape) < hybrid_pm_weight(epsilon)
    return np.where(use_pm, piecewise(x, epsilon, rng), duchi(x, epsilon, rng))


REFERENCES = {"pm": piecewise, "duchi": duchi, "hm": hybrid}
