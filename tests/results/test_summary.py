"""The summary's statistics: seeds as replicates, intervals inside the metric's range, trivial models."""


import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ldpbench.results.tables import bounded_interval, confidence_interval, summarize


def runs_table(accuracies, folds=1, auc=None, majority=0.76):
    """One configuration's runs: accuracies in seed-major order, `folds` per seed."""
    rows = []
    for index, accuracy in enumerate(accuracies):
        rows.append({"dataset": "adult", "model": "lr", "label": "PS-PM", "mechanism": "ps-pm",
                     "mechanism_params": "{}", "epsilon": 2.0, "seed": index // folds, "fold": index % folds,
                     "status": "ok", "test_accuracy": accuracy, "test_auc": accuracy if auc is None else auc[index],
                     "test_majority_accuracy": majority, "classes": 2, "uplink_bits_total": 1.0,
                     "train_seconds": 1.0, "converged": True, "epsilon_per_report": 2.0,
                     "epsilon_claimed_per_report": 2.0, "epsilon_worst_case_per_report": 2.0,
                     "bits_per_report": 64.0, "reports_per_client_max": 1, "epsilon_claimed_client_max": 2.0,
                     "epsilon_worst_case_client_max": 2.0})
    return pd.DataFrame(rows)


def test_folds_of_one_seed_count_once():
    """3 seeds × 5 folds: the interval is that of the 3 seed means (df 2), not of 15 values (df 14),
    which is far narrower."""
    rng = np.random.default_rng(1)
    values = np.repeat([0.80, 0.74, 0.77], 5) + rng.normal(0, 0.005, 15)
    row = summarize(runs_table(values, folds=5)).iloc[0]
    seed_means = values.reshape(3, 5).mean(axis=1)
    assert row["seeds"] == 3 and row["runs_ok"] == 15
    assert row["mean"] == pytest.approx(seed_means.mean()) and row["std"] == pytest.approx(seed_means.std(ddof=1))
    assert (row["ci95_low"], row["ci95_high"]) == pytest.approx(bounded_interval(seed_means)[2:])
    _, _, fold_low, fold_high = confidence_interval(values)
    assert row["ci95_high"] - row["ci95_low"] > 3 * (fold_high - fold_low)


@pytest.mark.parametrize("values", [[0.0, 0.5, 1.0], [0.96, 0.99, 1.0], [0.01, 0.3, 0.02], [1.0, 1.0, 0.2]])
def test_no_interval_of_accuracy_or_auc_leaves_zero_one(values):
    """A Student-t interval with three seeds leaves [0, 1] on each of these (checked); ours does not,
    and holds the mean."""
    _, _, low, high = confidence_interval(np.array(values))
    assert low < 0 or high > 1
    row = summarize(runs_table(values)).iloc[0]
    for mean, low, high in ((row["mean"], row["ci95_low"], row["ci95_high"]),
                            (row["auc_mean"], row["auc_ci95_low"], row["auc_ci95_high"])):
        assert 0 <= low <= mean <= high <= 1


def test_the_bounded_interval_covers_at_its_level():
    """Seeds' accuracies drawn from a logit-normal law: the logit-scale t interval covers the median
    of the law (its centre) at 95 %. 4,000 draws: a coverage below 93 % has probability < 1e-6 if the
    true coverage is 95 % (binomial tail), and a plain interval of the wrong level (80 %) fails it."""
    rng = np.random.default_rng(7)
    centre, draws = 0.9, 4000
    samples = 1 / (1 + np.exp(-(np.log(centre / (1 - centre)) + rng.normal(0, 0.8, (draws, 3)))))
    covered = sum(low <= centre <= high for low, high in (bounded_interval(s)[2:] for s in samples))
    assert stats.binom.cdf(0.93 * draws, draws, 0.95) < 1e-6
    assert covered >= 0.93 * draws
    narrow = sum(low <= centre <= high for low, high in (bounded_interval(s, level=0.8)[2:] for s in samples))
    assert narrow < 0.93 * draws


def test_a_constant_predictor_is_flagged_trivial():
    """Adult's PS-PM at the majority rate (76.07 %) on every seed is trivial; a model 5 points above it
    on every seed is not; a noisy one whose interval reaches the rate is."""
    majority = 0.7607
    assert summarize(runs_table([majority] * 3, majority=majority)).iloc[0]["trivial"]
    assert not summarize(runs_table([0.81, 0.815, 0.812], majority=majority)).iloc[0]["trivial"]
    assert summarize(runs_table([0.70, 0.85, 0.80], majority=majority)).iloc[0]["trivial"]
    row = summarize(runs_table([0.81] * 3, auc=[0.5, 0.52, 0.49], majority=majority)).iloc[0]
    assert row["auc_trivial"] and not row["trivial"] and row["majority_accuracy"] == pytest.approx(majority)
