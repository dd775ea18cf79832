"""Whether a run had converged when it ended: the trend of its test accuracy over the last part of training.

`final_slope` is the relative change of the test accuracy over the last WINDOW (a quarter) of the
rounds the run trained: a least-squares line through the evaluated curve points of that window (at
least the last MIN_POINTS of them), its change from the window's first round to its last, divided by
|its value at the last round|. A run is `converged` when it was ended by the plateau stop
(`training.stop`), or when |final_slope| ≤ THRESHOLD; a run with fewer than MIN_POINTS evaluated
points has no slope (NaN) and is not converged, and neither is a diverged run.

Why THRESHOLD = 0.02 (a 2 % relative change over the last quarter). For k evenly spaced points with
independent noise of standard deviation σ around a flat line, the fitted change across the window has
standard deviation σ·√(12(k − 1)/(k(k + 1))): 1.41σ for 3 points, 1.26σ for 5, 0.99σ for 10. The test
set is fixed, so a converged run's accuracy moves between evaluations only with its weights: about
0.2–0.6 points at accuracies near 0.8 in our campaigns (relative σ ≈ 0.0025–0.0075), which puts 0.02 at
two or more standard deviations of the flat-curve noise. A run still climbing as BitRand's 20-round
rows do (several points over its last quarter, a relative change near 0.1) is far above it. The
threshold is applied at aggregation, from the curve, so changing it reruns no run.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

WINDOW = 0.25  # the share of the rounds run that the slope is fitted over
MIN_POINTS = 3  # evaluated points at least in the fit
THRESHOLD = 0.02  # the largest |relative change| over the window of a converged run
METRIC = "test_accuracy"


def final_slope(rounds: np.ndarray, values: np.ndarray) -> float:
    """The relative change of `values` over the last WINDOW of `rounds` (see the module docstring)."""
    order = np.argsort(rounds, kind="stable")
    rounds, values = np.asarray(rounds, dtype=float)[order], np.asarray(values, dtype=float)[order]
    if len(rounds) < MIN_POINTS or not np.isfinite(values[-MIN_POINTS:]).all():
        return math.nan
    in_window = rounds >= rounds[-1] * (1 - WINDOW)
    count = max(int(in_window.sum()), MIN_POINTS)
    x, y = rounds[-count:], values[-count:]
    if not np.isfinite(y).all() or x[-1] == x[0]:
        return math.nan
    slope, intercept = np.polyfit(x, y, 1)
    end = slope * x[-1] + intercept
    return float(slope * (x[-1] - x[0]) / max(abs(end), 1e-12))


def is_converged(slope: float, stopped_early: bool, status: str) -> bool:
    if status != "ok":
        return False
    return bool(stopped_early) or (math.isfinite(slope) and abs(slope) <= THRESHOLD)


def convergence(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per run of `runs` (run_id, status, stopped_early): its final_slope and converged, from `curves`."""
    slopes = {run_id: final_slope(points["round"].to_numpy(), points[METRIC].to_numpy())
              for run_id, points in curves.groupby("run_id", sort=False)}
    stopped = runs["stopped_early"].fillna(False).astype(bool) if "stopped_early" in runs else \
        pd.Series(False, index=runs.index)
    slope = runs["run_id"].map(slopes).astype(float)
    converged = [is_converged(s, early, status) for s, early, status in zip(slope, stopped, runs["status"])]
    return pd.DataFrame({"run_id": runs["run_id"], "final_slope": slope, "converged": converged},
                        index=runs.index)
