"""Paired comparisons of mechanisms: power, the tie rate, Holm, intervals, rankings, Pareto fronts, verdicts."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ldpbench.cli import main
from ldpbench.layout import COMPARE_TABLES, table_file
from ldpbench.results.compare import (
    compare,
    effect_size,
    holm,
    letter_groups,
    mean_interval,
    paired_p_value,
    pareto_front,
)


def campaign_tables(means: dict[str, float], replicates=9, noise=0.005, seed=0, epsilon=2.0, folds=1):
    """A runs table and its summary: each label's accuracy is its mean + a replicate effect shared by
    every label (what pairing removes) + independent noise; `replicates` runs per label, `folds` per seed."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, 0.05, replicates)  # split and start: large, common to the labels
    rows = []
    for label, mean in means.items():
        values = mean + shared + rng.normal(0, noise, replicates)
        rows += [{"dataset": "d", "model": "lr", "label": label, "mechanism": label.lower(), "epsilon": epsilon,
                  "seed": r // folds, "fold": r % folds, "status": "ok", "test_accuracy": v, "test_auc": v}
                 for r, v in enumerate(values)]
    runs = pd.DataFrame(rows)
    summary = runs.groupby(["dataset", "model", "label", "epsilon"], as_index=False).agg(
        mean=("test_accuracy", "mean"), auc_mean=("test_auc", "mean"))
    for column in ("ci95_low", "ci95_high", "auc_ci95_low", "auc_ci95_high"):
        summary[column] = np.nan
    summary["epsilon_worst_case_client_max"] = 2.0
    summary["uplink_bits_total_mean"] = 1e6
    summary["bits_per_report"] = 64.0
    return runs, summary


# ---------------------------------------------------------------- power and the tie rate
def test_a_planted_difference_is_found():
    """PM-C is 0.03 above PM and PM-B; differences have sd 0.005·√2 over 9 pairs, so t has noncentrality
    0.03/(0.00707/3) = 12.7. A miss needs |t| below the Holm threshold (α/3, df 8): its probability,
    computed here, is far below 1e-6."""
    noise, n = 0.005, 9
    noncentrality = 0.03 / (noise * math.sqrt(2) / math.sqrt(n))
    critical = stats.t.ppf(1 - 0.05 / 3 / 2, n - 1)
    assert stats.nct.cdf(critical, n - 1, noncentrality) < 1e-6
    runs, summary = campaign_tables({"PM": 0.80, "PM-B": 0.80, "PM-C": 0.83}, noise=noise)
    result = compare(runs, summary)
    pair = result.comparisons.set_index(["mechanism_a", "mechanism_b"]).loc[("PM-C", "PM")]
    assert pair["better"] == "a" and pair["ci95_low"] > 0 and pair["effect_ci95_low"] > 0
    assert result.verdicts["verdict"].tolist() == ["PM-C"]
    # Power of the check itself: without the planted gap PM-C is not called better.
    runs, summary = campaign_tables({"PM": 0.80, "PM-B": 0.80, "PM-C": 0.80}, noise=noise, seed=1)
    assert compare(runs, summary).verdicts["verdict"].iloc[0].startswith("tie: ")


def simulated_families(families, mechanisms=3, n=5, seed=7) -> np.ndarray:
    """The p-values of every pair of each of `families` families of identical mechanisms, a row a family."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(families):
        values = rng.normal(0, 0.05, n) + rng.normal(0, 0.01, (mechanisms, n))
        rows.append([paired_p_value(values[a] - values[b])[1]
                     for a in range(mechanisms) for b in range(a + 1, mechanisms)])
    return np.array(rows)


def separated(p_values: np.ndarray, adjust) -> int:
    """How many families separate at least one pair once their p-values are adjusted."""
    return sum(bool((adjust(family) < 0.05).any()) for family in p_values)


def test_identical_mechanisms_are_a_tie_at_the_stated_rate():
    """Holm keeps the chance of separating any pair of identical mechanisms in a family at most α = 0.05:
    over 3,000 families the count stays below the binomial quantile at 1 − 1e-6. Power: unadjusted
    p-values separate about 12 % of the families (three comparisons), which this bound rejects. Both
    count the same simulated families."""
    families = 3000
    bound = stats.binom.ppf(1 - 1e-6, families, 0.05)
    p_values = simulated_families(families)
    assert separated(p_values, holm) <= bound
    assert separated(p_values, lambda p: p) > bound


def test_holm_matches_the_step_down_definition():
    p = np.array([0.01, 0.04, 0.03, 0.005, np.nan])
    # Sorted: 0.005·4, 0.01·3, 0.03·2, 0.04·1, made monotone; NaN is no test.
    expected = np.array([0.03, 0.06, 0.06, 0.02, np.nan])
    np.testing.assert_allclose(holm(p), expected, equal_nan=True)
    np.testing.assert_allclose(holm(np.array([0.5, 0.9])), [1.0, 1.0])


def test_degenerate_and_short_differences():
    assert paired_p_value(np.zeros(4)) == (0.0, 1.0)
    assert paired_p_value(np.full(4, 0.01))[1] == 0.0
    assert math.isnan(paired_p_value(np.array([0.1]))[1])
    assert all(math.isnan(v) for v in mean_interval(np.array([0.1])) + effect_size(np.array([0.1])))


def test_intervals_match_their_closed_forms():
    differences = np.array([0.01, 0.03, 0.02, 0.04, 0.00])
    low, high = mean_interval(differences)
    half = stats.t.ppf(0.975, 4) * differences.std(ddof=1) / math.sqrt(5)
    assert (low, high) == pytest.approx((0.02 - half, 0.02 + half))
    d, d_low, d_high = effect_size(differences)
    assert d == pytest.approx(0.02 / differences.std(ddof=1))
    # The interval's ends are where the observed t sits at the 97.5 % and 2.5 % points.
    t = d * math.sqrt(5)
    assert stats.nct.cdf(t, 4, d_low * math.sqrt(5)) == pytest.approx(0.975, abs=1e-6)
    assert stats.nct.cdf(t, 4, d_high * math.sqrt(5)) == pytest.approx(0.025, abs=1e-6)
    assert paired_p_value(differences, "wilcoxon")[1] == pytest.approx(stats.wilcoxon(differences).pvalue)


# ---------------------------------------------------------------- pairing, groups, fronts, verdicts
def test_pairs_are_matched_by_seed_and_fold_not_by_row_order():
    runs, summary = campaign_tables({"A": 0.80, "B": 0.81, "C": 0.79})
    shuffled = runs.sample(frac=1.0, random_state=3).reset_index(drop=True)
    first, second = compare(runs, summary), compare(shuffled, summary)
    pd.testing.assert_frame_equal(first.comparisons, second.comparisons)
    # A run that failed, or a replicate one mechanism lacks, leaves the pair out.
    runs.loc[(runs["label"] == "A") & (runs["seed"] == 0) & (runs["fold"] == 0), "status"] = "diverged"
    pairs = compare(runs, summary).comparisons.set_index(["mechanism_a", "mechanism_b"])
    assert pairs.loc[("B", "A"), "n_pairs"] == 8 and pairs.loc[("B", "C"), "n_pairs"] == 9


def test_letter_groups_cover_the_runs_of_inseparable_mechanisms():
    ordered = ["A", "B", "C", "D"]
    separated = {frozenset("AC"), frozenset("AD"), frozenset("BD")}
    letters = letter_groups(ordered, lambda a, b: frozenset((a, b)) not in separated)
    assert letters == {"A": "a", "B": "ab", "C": "bc", "D": "c"}
    assert letter_groups(["A", "B"], lambda a, b: False) == {"A": "a", "B": "b"}


def test_pareto_front():
    cost = np.array([1.0, 2.0, 2.0, 4.0, 8.0, np.nan])
    utility = np.array([0.70, 0.75, 0.72, 0.75, 0.90, 0.99])
    # (2, .72) is dominated by (2, .75); (4, .75) by (2, .75); NaN is on no front.
    assert pareto_front(cost, utility).tolist() == [True, True, False, False, True, False]


def test_a_tie_is_named_with_its_members_and_non_private_runs_are_left_out():
    # Without independent noise PM and HM have identical runs (a sure tie) and Duchi is 0.1 below both.
    runs, summary = campaign_tables({"PM": 0.80, "HM": 0.80, "Duchi": 0.70}, noise=0.0)
    baseline, base_summary = campaign_tables({"NP": 0.95}, epsilon=math.inf)
    result = compare(pd.concat([runs, baseline]), pd.concat([summary, base_summary]))
    verdict = result.verdicts.iloc[0]
    assert verdict["verdict"] in ("tie: PM, HM", "tie: HM, PM") and verdict["mechanisms"] == 3
    assert set(result.rankings["label"]) == {"PM", "HM", "Duchi"}
    ranked = result.rankings.set_index("label")
    assert ranked.loc["Duchi", "group"] == "b" and not ranked.loc["Duchi", "top"] and ranked.loc["PM", "top"]


def test_a_family_of_one_mechanism_is_its_own_verdict():
    runs, summary = campaign_tables({"PM": 0.8}, replicates=1)
    result = compare(runs, summary)
    assert result.comparisons.empty and result.verdicts["verdict"].tolist() == ["PM"]


def test_the_compare_command_writes_the_three_tables(tmp_path):
    runs, summary = campaign_tables({"PM": 0.80, "PM-C": 0.82})
    runs.to_parquet(table_file(tmp_path, "runs"))
    summary.to_parquet(table_file(tmp_path, "summary"))
    assert main(["compare", "--tables-dir", str(tmp_path)]) == 0
    tables = {name: pd.read_parquet(table_file(tmp_path, name)) for name in COMPARE_TABLES}
    assert set(tables["verdicts"]["metric"]) == {"test_accuracy", "test_auc"}
    assert {"mechanism_a", "mechanism_b", "mean_diff", "ci95_low", "ci95_high", "p_value", "p_value_adjusted",
            "better"} <= set(tables["comparisons"].columns)


# ---------------------------------------------------------------- the replicate is the seed
def test_folds_of_one_seed_count_once():
    """3 seeds × 5 folds are 3 pairs: the test is the one-sample t-test of the 3 seeds' fold-mean
    differences, not of 15 fold differences (which would share each seed's randomness)."""
    runs, summary = campaign_tables({"A": 0.80, "B": 0.79}, replicates=15, folds=5, noise=0.01)
    pair = compare(runs, summary).comparisons.iloc[0]
    by_seed = runs.pivot_table(index="seed", columns="label", values="test_accuracy", aggfunc="mean")
    differences = (by_seed[pair["mechanism_a"]] - by_seed[pair["mechanism_b"]]).to_numpy()
    assert pair["n_pairs"] == 3
    assert pair["p_value"] == pytest.approx(stats.ttest_1samp(differences, 0.0).pvalue)
    assert (pair["ci95_low"], pair["ci95_high"]) == pytest.approx(mean_interval(differences))
    assert pair["sd_diff"] == pytest.approx(differences.std(ddof=1))


def test_ranks_tie_where_verdicts_tie_and_the_top_group_is_rank_one():
    """PM and HM cannot be separated (identical runs): both rank 1 and make the verdict; Duchi, below
    both, ranks 3 (two mechanisms significantly better). A mechanism tied with the best but not
    contiguous with it in the order of means is top too."""
    runs, summary = campaign_tables({"PM": 0.80, "HM": 0.80, "Duchi": 0.70}, noise=0.0)
    result = compare(runs, summary)
    ranks = result.rankings.set_index("label")["rank"].to_dict()
    assert ranks == {"PM": 1, "HM": 1, "Duchi": 3}
    assert set(result.verdicts.iloc[0]["best"].split(", ")) == {"PM", "HM"}
    # B sits between A and C in mean but is precisely below A; C is noisy and cannot be separated from A.
    runs, summary = campaign_tables({"A": 0.80, "B": 0.79, "C": 0.785}, noise=0.0)
    runs.loc[runs["label"] == "C", "test_accuracy"] += np.resize([0.05, -0.05], 9)
    summary.loc[summary["label"] == "C", "mean"] = 0.7849
    result = compare(runs, summary)
    ranked = result.rankings.set_index("label")
    assert ranked.loc["B", "rank"] > 1 and ranked.loc["C", "rank"] == 1
    assert set(ranked.index[ranked["top"]]) == set(result.verdicts.iloc[0]["best"].split(", ")) == {"A", "C"}


def test_a_verdict_names_its_trivial_members():
    runs, summary = campaign_tables({"PM": 0.80, "PS-PM": 0.80}, noise=0.0)
    summary["trivial"] = summary["label"] == "PS-PM"
    verdict = compare(runs, summary).verdicts.iloc[0]
    assert verdict["trivial"] == "PS-PM" and verdict["verdict"].endswith("(trivial: PS-PM)")


def test_a_mechanism_whose_every_run_diverged_is_compared_with_no_pairs():
    runs, summary = campaign_tables({"PM": 0.80, "PM-SUB": 0.30})
    runs.loc[runs["label"] == "PM-SUB", "status"] = "diverged"
    pair = compare(runs, summary).comparisons.iloc[0]
    assert pair["n_pairs"] == 0 and pair["better"] == "tie" and math.isnan(pair["p_value"])
