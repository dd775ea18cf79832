"""Is a difference between two mechanisms real? Paired tests over shared seeds and folds, rankings, verdicts.

Families. One family per (dataset, model, ε, metric): the private mechanisms (labels) that ran at
that ε. Non-private baselines (ε = ∞) are in no family: they would top every one; the report shows
them as the reference they are.

Pairs. Two mechanisms of a family are compared on the (seed, fold) replicates they share, where both
runs finished ("ok") with a finite metric: the seed fixes the split, the partition, the cohorts and the
start, so a paired difference removes what the replicates share. The replicate is the seed: each
seed's differences are averaged over its shared folds first, and the test, the interval and `n_pairs`
are over seeds. Folds of one seed share its randomness and most of their training data; counted as
independent they made the p-values and intervals too small (Dietterich 1998; Nadeau & Bengio 2003).

Test. A paired t-test by default (two-sided): with the 3 seeds of the default campaign a Wilcoxon
signed-rank test cannot go below p = 0.25, so it could never separate anything there; `test="wilcoxon"`
is offered for campaigns with many replicates (scipy's exact distribution where it applies). Degenerate
differences: all equal to 0 → p = 1; all equal and non-zero → p = 0 (the t statistic is infinite).
Fewer than 2 pairs → no test (p NaN) and a tie. p-values are Holm-adjusted within each family, and a
pair is separated ("a" or "b" better, by the sign of the mean difference) when the adjusted p-value is
below alpha (0.05): within a family, the chance of separating any two identical mechanisms is at most
alpha.

Intervals. ci95 is the paired-t 95 % interval of the mean difference over seeds (clipped to [−1, 1]:
a difference of two values in [0, 1]); `sd_diff` is the differences' standard deviation (what the
scorecard sizes a conclusive campaign from); the effect size is d_z = mean / sd of the differences,
with a 95 % interval from the noncentral t distribution of d_z·√n.

Rankings. Within a family, mechanisms in order of mean; a mechanism's rank is 1 + the number of
mechanisms significantly better than it (after Holm), so mechanisms the test cannot separate from the
best share rank 1, and the top group is exactly the rank-1 mechanisms. Each maximal run of mechanisms,
contiguous in the order of means, whose pairs are all ties gets a letter (critical-difference style:
mechanisms sharing a letter cannot be separated).
Pareto fronts, per (dataset, model, metric) over every private configuration (label × ε): a
configuration is on the front when no other has a mean at least as high at a cost at least as low,
one of them strictly; the costs are worst-case ε per client including tuning, and uplink bits.

Verdicts. Per family: the top group's labels, "tie: A, B" when it has more than one; top labels not
shown better than a constant predictor (the summary's `trivial`: the majority class for accuracy,
AUC 0.5) are named in `trivial` and in the verdict ("tie: A, B (trivial: B)").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize, stats

from ldpbench.layout import table_file
from ldpbench.results.schema import TABLES, write_table
from ldpbench.results.tables import BOUNDED_METRICS, trivial_metrics

ALPHA = 0.05
METRICS = ("test_accuracy", "test_auc")
TESTS = ("t", "wilcoxon")
TEST_NAMES = {"t": "paired t-test", "wilcoxon": "Wilcoxon signed-rank test"}
# The summary's mean and interval columns of each metric.
SUMMARY_COLUMNS = {"test_accuracy": ("mean", "ci95_low", "ci95_high"),
                   "test_auc": ("auc_mean", "auc_ci95_low", "auc_ci95_high")}
FAMILY = ["dataset", "model", "epsilon", "metric"]
REPLICATE = ["seed", "fold"]


@dataclass(frozen=True)
class Comparison:
    comparisons: pd.DataFrame  # one row per pair of mechanisms in a family
    rankings: pd.DataFrame  # one row per mechanism in a family
    verdicts: pd.DataFrame  # one row per family


# ---------------------------------------------------------------------------- one pair
def paired_p_value(differences: np.ndarray, test: str = "t") -> tuple[float, float]:
    """(statistic, two-sided p-value) of the paired differences; see the module docstring."""
    n = len(differences)
    if n < 2:
        return math.nan, math.nan
    if np.all(differences == differences[0]):
        return (0.0, 1.0) if differences[0] == 0 else (math.copysign(math.inf, differences[0]), 0.0)
    if test == "wilcoxon":
        result = stats.wilcoxon(differences, zero_method="wilcox")
        return float(result.statistic), float(result.pvalue)
    result = stats.ttest_1samp(differences, 0.0)
    return float(result.statistic), float(result.pvalue)


def mean_interval(differences: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The paired-t interval of the mean difference (NaN with fewer than 2 pairs)."""
    n = len(differences)
    if n < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, n - 1) * differences.std(ddof=1) / math.sqrt(n)
    mean = differences.mean()
    return float(mean - half), float(mean + half)


def effect_size(differences: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """d_z = mean / sd of the differences and its interval (noncentral t of d_z·√n); NaN where undefined."""
    n = len(differences)
    if n < 2:
        return (math.nan,) * 3
    sd = differences.std(ddof=1)
    if sd == 0:
        return (math.nan,) * 3
    d = float(differences.mean() / sd)
    t, df = d * math.sqrt(n), n - 1

    def noncentrality(probability: float) -> float:
        # nct.cdf(t; nc) falls with nc: the interval's ends solve cdf = 1 − α/2 and α/2, within a few
        # of the noncentral t's standard deviations (about √(1 + t²/2df)) of t.
        width = 3.0 + 8.0 * math.sqrt(1 + t * t / (2 * df))
        return optimize.brentq(lambda nc: stats.nct.cdf(t, df, nc) - probability, t - width, t + width)

    try:
        low, high = noncentrality(0.5 + level / 2), noncentrality(0.5 - level / 2)
        return d, low / math.sqrt(n), high / math.sqrt(n)
    except (ValueError, RuntimeError):
        # Far in the tails scipy's noncentral t loses precision (NaN): use its normal approximation,
        # d ± z·√(1/n + d²/2(n − 1)), which is accurate exactly there (large |d|·√n).
        half = stats.norm.ppf(0.5 + level / 2) * math.sqrt(1 / n + d * d / (2 * df))
        return d, d - half, d + half


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count as a test)."""
    p_values = np.asarray(p_values, dtype=float)
    adjusted = np.full_like(p_values, np.nan)
    tested = np.flatnonzero(np.isfinite(p_values))
    order = tested[np.argsort(p_values[tested], kind="stable")]
    m, running = len(order), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


# ---------------------------------------------------------------------------- a family
def _values(family: pd.DataFrame, metric: str) -> dict[str, pd.Series]:
    """Per label, its finite metric of ok runs indexed by (seed, fold)."""
    ok = family[(family["status"] == "ok") & np.isfinite(family[metric].astype(float))]
    return {label: runs.set_index(REPLICATE)[metric].astype(float) for label, runs in ok.groupby("label")}


def seed_differences(left: pd.Series, right: pd.Series) -> tuple[np.ndarray, float, float]:
    """(per-seed differences, mean of left, mean of right) over the (seed, fold) replicates both have:
    each seed's differences averaged over its shared folds, so that a seed counts once (the replicate
    is the seed: its folds share its randomness and most of their training data)."""
    if left.empty or right.empty:  # a label none of whose runs finished: nothing to pair
        return np.empty(0), math.nan, math.nan
    shared = left.index.intersection(right.index).sort_values()
    if not len(shared):
        return np.empty(0), math.nan, math.nan
    pairs = pd.DataFrame({"a": left.loc[shared], "b": right.loc[shared]}).groupby(level="seed").mean()
    return (pairs["a"] - pairs["b"]).to_numpy(dtype=float), float(pairs["a"].mean()), float(pairs["b"].mean())


def compare_family(family: pd.DataFrame, labels: list[str], metric: str, alpha: float, test: str) -> pd.DataFrame:
    """Every pair of `labels` (in the order given) of one family's runs, paired over seeds."""
    values = _values(family, metric)
    rows = []
    for a, b in combinations(labels, 2):
        differences, mean_a, mean_b = seed_differences(values.get(a, pd.Series(dtype=float)),
                                                       values.get(b, pd.Series(dtype=float)))
        statistic, p_value = paired_p_value(differences, test)
        low, high = mean_interval(differences)
        if metric in BOUNDED_METRICS:  # a difference of two values in [0, 1]
            low, high = max(low, -1.0), min(high, 1.0)
        d, d_low, d_high = effect_size(differences)
        rows.append({"mechanism_a": a, "mechanism_b": b, "n_pairs": len(differences),
                     "mean_a": mean_a, "mean_b": mean_b,
                     "mean_diff": float(differences.mean()) if len(differences) else math.nan,
                     "sd_diff": float(differences.std(ddof=1)) if len(differences) > 1 else math.nan,
                     "ci95_low": low, "ci95_high": high, "effect_size": d, "effect_ci95_low": d_low,
                     "effect_ci95_high": d_high, "test": TEST_NAMES[test], "statistic": statistic,
                     "p_value": p_value})
    table = pd.DataFrame(rows, columns=["mechanism_a", "mechanism_b", "n_pairs", "mean_a", "mean_b", "mean_diff",
                                        "sd_diff", "ci95_low", "ci95_high", "effect_size", "effect_ci95_low",
                                        "effect_ci95_high", "test", "statistic", "p_value"])
    table["p_value_adjusted"] = holm(table["p_value"].to_numpy(dtype=float))
    separated = table["p_value_adjusted"] < alpha
    table["better"] = np.where(separated, np.where(table["mean_diff"] > 0, "a", "b"), "tie")
    table["alpha"] = alpha
    return table


def letter_groups(ordered: list[str], tied) -> dict[str, str]:
    """Compact letters: each maximal run of `ordered` whose members are pairwise `tied(a, b)` gets one."""
    runs, last_end = [], -1
    for start in range(len(ordered)):
        end = start
        while end + 1 < len(ordered) and all(tied(ordered[k], ordered[end + 1]) for k in range(start, end + 1)):
            end += 1
        if end > last_end:
            runs.append((start, end))
            last_end = end
    letters = {label: "" for label in ordered}
    for number, (start, end) in enumerate(runs):
        for label in ordered[start:end + 1]:
            letters[label] += _letter(number)
    return letters


def _letter(number: int) -> str:
    text = ""
    number += 1
    while number:
        number, rest = divmod(number - 1, 26)
        text = chr(ord("a") + rest) + text
    return text


def pareto_front(cost: np.ndarray, utility: np.ndarray) -> np.ndarray:
    """Whether each point is on the front: no other point at least as good in both, strictly in one."""
    cost, utility = np.asarray(cost, dtype=float), np.asarray(utility, dtype=float)
    valid = ~np.isnan(cost) & ~np.isnan(utility)
    front = np.zeros(len(cost), dtype=bool)
    for i in np.flatnonzero(valid):
        others = valid & (np.arange(len(cost)) != i)
        dominated = others & (cost <= cost[i]) & (utility >= utility[i]) & ((cost < cost[i]) | (utility > utility[i]))
        front[i] = not dominated.any()
    return front


# ---------------------------------------------------------------------------- the campaign
def _configurations(summary: pd.DataFrame, metric: str) -> dict[tuple, dict]:
    """Per (dataset, model, label, ε): the metric's mean and interval, its trivial flag and the
    configuration's costs."""
    mean, low, high = SUMMARY_COLUMNS[metric]
    total = "epsilon_worst_case_client_total"
    facts = {}
    for row in summary.to_dict("records"):
        facts[(row["dataset"], row["model"], row["label"], float(row["epsilon"]))] = {
            "mean": row[mean], "ci95_low": row[low], "ci95_high": row[high],
            total: row.get(total, row["epsilon_worst_case_client_max"]),
            "uplink_bits_total_mean": row["uplink_bits_total_mean"], "bits_per_report": row["bits_per_report"],
            "runs_unconverged": int(row.get("runs_unconverged", 0) or 0),
            "trivial": metric in trivial_metrics(row)}
    return facts


def beaten_by(pairs: pd.DataFrame) -> dict[str, set[str]]:
    """Per label, the labels significantly better than it (after Holm)."""
    beaten: dict[str, set[str]] = {}
    for a, b, better in zip(pairs["mechanism_a"], pairs["mechanism_b"], pairs["better"]):
        if better == "a":
            beaten.setdefault(b, set()).add(a)
        elif better == "b":
            beaten.setdefault(a, set()).add(b)
    return beaten


def _tied(pairs: pd.DataFrame):
    ties = {frozenset((a, b)) for a, b, better in zip(pairs["mechanism_a"], pairs["mechanism_b"], pairs["better"])
            if better == "tie"}
    return lambda a, b: frozenset((a, b)) in ties


def verdict_text(top: list[str], trivial: list[str]) -> str:
    """'A', or 'tie: A, B', naming the top labels that are no better than a constant predictor."""
    text = top[0] if len(top) == 1 else "tie: " + ", ".join(top)
    return text + (f" (trivial: {', '.join(trivial)})" if trivial else "")


def compare(runs: pd.DataFrame, summary: pd.DataFrame, metric: str = "test_accuracy", alpha: float = ALPHA,
            test: str = "t") -> Comparison:
    """The comparisons, rankings and verdicts of one metric (see the module docstring)."""
    if metric not in SUMMARY_COLUMNS:
        raise ValueError(f"metric must be one of {sorted(SUMMARY_COLUMNS)}, got {metric!r}")
    if test not in TESTS:
        raise ValueError(f"test must be one of {TESTS}, got {test!r}")
    facts = _configurations(summary, metric)
    private = runs[np.isfinite(runs["epsilon"].astype(float))]
    comparisons, rankings, verdicts = [], [], []
    for (dataset, model, epsilon), family in private.groupby(["dataset", "model", "epsilon"], sort=True):
        keys = {"dataset": dataset, "model": model, "epsilon": float(epsilon), "metric": metric}
        here = {label: facts[(dataset, model, label, float(epsilon))] for label in family["label"].unique()}
        ordered = sorted(here, key=lambda label: (-here[label]["mean"] if np.isfinite(here[label]["mean"])
                                                  else math.inf, label))
        pairs = compare_family(family, ordered, metric, alpha, test)
        comparisons.append(pairs.assign(**keys))
        letters = letter_groups(ordered, _tied(pairs))
        beaten = beaten_by(pairs)
        # The rank counts the mechanisms significantly better: those the test cannot separate from the
        # best share rank 1, and the top group is exactly rank 1.
        rank = {label: 1 + len(beaten.get(label, ())) for label in ordered}
        top = [label for label in ordered if rank[label] == 1]
        for label in ordered:
            rankings.append({**keys, "label": label, **{column: here[label][column] for column in RANKED_FACTS},
                             "rank": rank[label], "group": letters[label], "top": label in top})
        best = here[ordered[0]]
        trivial = [label for label in top if here[label]["trivial"]]
        seeds = family[(family["label"] == ordered[0]) & (family["status"] == "ok")]["seed"].nunique()
        verdicts.append({**keys, "best": ", ".join(top), "verdict": verdict_text(top, trivial),
                         "mechanisms": len(ordered),
                         "n_pairs": int(pairs["n_pairs"].min()) if len(pairs) else int(seeds),
                         "best_mean": best["mean"], "best_ci95_low": best["ci95_low"],
                         "best_ci95_high": best["ci95_high"],
                         "epsilon_worst_case_client_total": best["epsilon_worst_case_client_total"],
                         "bits_per_report": best["bits_per_report"],
                         "unconverged": any(here[label]["runs_unconverged"] > 0 for label in top),
                         "trivial": ", ".join(trivial)})
    ranking_table = _with_pareto(pd.DataFrame(rankings, columns=RANKING_COLUMNS))
    comparison_table = pd.concat(comparisons, ignore_index=True) if comparisons else \
        pd.DataFrame(columns=COMPARISON_COLUMNS)
    return Comparison(comparison_table[COMPARISON_COLUMNS], ranking_table,
                      pd.DataFrame(verdicts, columns=VERDICT_COLUMNS))


def _with_pareto(rankings: pd.DataFrame) -> pd.DataFrame:
    rankings["pareto_epsilon"] = False
    rankings["pareto_bits"] = False
    for _, panel in rankings.groupby(["dataset", "model", "metric"]):
        utility = panel["mean"].to_numpy(dtype=float)
        rankings.loc[panel.index, "pareto_epsilon"] = pareto_front(panel["epsilon_worst_case_client_total"], utility)
        rankings.loc[panel.index, "pareto_bits"] = pareto_front(panel["uplink_bits_total_mean"], utility)
    return rankings


# The tables' columns, in order (ldpbench.results.schema).
COMPARISON_COLUMNS = TABLES["comparisons"].names
RANKING_COLUMNS = TABLES["rankings"].names
VERDICT_COLUMNS = TABLES["verdicts"].names
# The summary's facts of a configuration that its ranking rows carry.
RANKED_FACTS = ["mean", "ci95_low", "ci95_high", "epsilon_worst_case_client_total", "uplink_bits_total_mean",
                "runs_unconverged", "trivial"]


def compare_tables(tables_dir: str | Path, alpha: float = ALPHA, test: str = "t") -> dict[str, int]:
    """tables/{runs,summary}.parquet → comparisons, rankings and verdicts of every metric (verdicts last)."""
    runs = pd.read_parquet(table_file(tables_dir, "runs"))
    summary = pd.read_parquet(table_file(tables_dir, "summary"))
    results = [compare(runs, summary, metric, alpha, test) for metric in METRICS]
    tables = {name: pd.concat([getattr(result, name) for result in results], ignore_index=True)
              for name in ("comparisons", "rankings", "verdicts")}
    for name, table in tables.items():
        write_table(table_file(tables_dir, name), name, table)
    return {name: len(table) for name, table in tables.items()}
