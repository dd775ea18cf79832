"""Convergence: the relative change of the test accuracy over the last quarter of a run."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ldpbench.results.convergence import MIN_POINTS, THRESHOLD, WINDOW, convergence, final_slope

ROUNDS = np.arange(0, 101, 10)


def test_a_straight_line_gives_its_exact_relative_change():
    values = 0.5 + 0.002 * ROUNDS  # ends at 0.7; the window is rounds 80–100 (3 points)
    assert WINDOW == 0.25 and MIN_POINTS == 3
    assert final_slope(ROUNDS, values) == pytest.approx(0.002 * 20 / 0.7)


def test_a_climbing_curve_is_unconverged_and_a_flat_one_converged():
    climbing = 0.4 + 0.4 * (1 - np.exp(-ROUNDS / 200))  # BitRand-like: still rising at the end
    flat = 0.8 - 0.3 * np.exp(-ROUNDS / 10)
    runs = pd.DataFrame({"run_id": ["up", "flat"], "status": ["ok", "ok"], "stopped_early": [False, False]})
    curves = pd.DataFrame({"run_id": ["up"] * 11 + ["flat"] * 11, "round": np.tile(ROUNDS, 2),
                           "test_accuracy": np.concatenate([climbing, flat])})
    table = convergence(runs, curves)
    assert table["final_slope"].iloc[0] > THRESHOLD and not table["converged"].iloc[0]
    assert abs(table["final_slope"].iloc[1]) < THRESHOLD and table["converged"].iloc[1]


def test_flat_noisy_curves_are_converged_at_the_stated_rate():
    """A flat curve at 0.8 with evaluation noise σ = 0.005 (relative 0.00625, the upper end the
    threshold is set for): the fitted change over 3 points has σ·√2 = 0.0088 relative standard
    deviation, so |slope| > 0.02 has probability 2·(1 − Φ(0.02/0.0088)) ≈ 0.023. Over 2,000 curves
    the count of unconverged ones stays below the binomial quantile at 1 − 1e-6 of that rate."""
    rng = np.random.default_rng(0)
    curves = 2000
    sigma = 0.005 / 0.8 * math.sqrt(2)
    rate = 2 * stats.norm.sf(THRESHOLD / sigma)
    slopes = [final_slope(ROUNDS, 0.8 + rng.normal(0, 0.005, len(ROUNDS))) for _ in range(curves)]
    unconverged = sum(abs(s) > THRESHOLD for s in slopes)
    assert unconverged <= stats.binom.ppf(1 - 1e-6, curves, rate)
    # Power: a curve still rising by 4 points over its last quarter (relative change 0.04 at 1.0,
    # 2.8 standard deviations above the threshold: flagged with probability ≥ 0.99).
    rising = [final_slope(ROUNDS, 0.8 + 0.002 * ROUNDS + rng.normal(0, 0.005, len(ROUNDS))) for _ in range(200)]
    assert sum(abs(s) > THRESHOLD for s in rising) >= stats.binom.ppf(1e-6, 200, 0.99)


def test_short_curves_diverged_runs_and_early_stops():
    runs = pd.DataFrame({"run_id": ["short", "diverged", "stopped"], "status": ["ok", "diverged", "ok"],
                         "stopped_early": [False, False, True]})
    curves = pd.DataFrame({
        "run_id": ["short"] * 2 + ["diverged"] * 11 + ["stopped"] * 11,
        "round": np.concatenate([[0, 10], ROUNDS, ROUNDS]),
        "test_accuracy": np.concatenate([[0.5, 0.6], np.full(11, 0.8), 0.5 + 0.003 * ROUNDS])})
    table = convergence(runs, curves).set_index("run_id")
    assert math.isnan(table.loc["short", "final_slope"]) and not table.loc["short", "converged"]
    assert not table.loc["diverged", "converged"]
    # A run ended by the plateau stop is converged by definition, whatever its test curve did.
    assert table.loc["stopped", "converged"] and table.loc["stopped", "final_slope"] > THRESHOLD


def test_runs_without_the_stopped_early_column_read_as_not_stopped():
    runs = pd.DataFrame({"run_id": ["a"], "status": ["ok"]})
    curves = pd.DataFrame({"run_id": ["a"] * 11, "round": ROUNDS, "test_accuracy": np.full(11, 0.7)})
    assert convergence(runs, curves)["converged"].tolist() == [True]
