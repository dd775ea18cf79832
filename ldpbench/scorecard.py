"""The reproduction scorecard: the papers' claims (config/paper_claims/) read against a campaign.

A claim names a configuration by the campaign's dataset, model, mechanism labels and ε, and says
what the paper reports: a value (the first mechanism's accuracy), a difference (first − second,
e.g. FedSel's gains), an order (the first is better), a least difference (first − second ≥ x) or
a growth (one mechanism's accuracy grows with ε, over a list of ε). Percentages and points.

The replicate is the seed: every claim is read from tables/runs.parquet as one number per seed (the
mean over its folds; for two mechanisms, their paired difference on the folds both ran). With n
seeds, t intervals have n − 1 degrees of freedom. Four statuses, each with a stated rule (α = 0.05,
Δ = the claim's tolerance):
- value, difference: **reproduced** when equivalence is shown (TOST: the 90 % interval of ours −
  paper lies within ±Δ); **refuted** when the 95 % interval of ours − paper excludes ±Δ; otherwise
  **inconclusive**, with the seeds that would decide it at the observed spread
  (n ≈ ((z₀.₉₅ + z₀.₈)·sd / (Δ − |gap|))² for equivalence, z₀.₉₇₅ and |gap| − Δ to refute).
  A difference whose |value| is at most Δ is below resolution: ±Δ around it holds 0, so equivalence
  alone would accept a null effect. It is reproduced only when its sign is shown too (the one-sided
  5 % test of ours against 0 in the paper's direction), and refuted by the opposite sign shown.
- order: the paired t-test of tables/comparisons.parquet, Holm-adjusted within its family:
  reproduced when the first is significantly better, refuted when significantly worse, otherwise
  inconclusive; with fewer than 2 seeds always inconclusive ("1 replicate"), never refuted.
- at_least: the one-sided t-test of ours against value − Δ: reproduced when significantly above,
  refuted when significantly below, otherwise inconclusive.
- increases: per seed, the least-squares slope of the metric on the rank of ε (0, 1, … over the
  claim's list), tested one-sided over seeds; and per consecutive pair of ε, the paired step, tested
  one-sided for a drop larger than Δ with Holm's correction over the steps. Reproduced when the slope
  is significantly positive and no step drops significantly; refuted when the slope is significantly
  negative or a step drops significantly; otherwise inconclusive. A flat curve is never reproduced.
A claim whose compared configurations are all trivial (the summary's `trivial`: not shown better
than the majority class; for AUC, than 0.5) is inconclusive: a comparison of constant predictors
says nothing. A non-private reference (NP, a noiseless sketch) that the campaign runs only at ε = ∞
is read there whatever the claim's ε, paired with the private mechanism on their shared seeds. A
configuration the campaign did not run gives **not run**.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from ldpbench.claims import Claim, load_claims
from ldpbench.results.compare import holm, mean_interval, seed_differences
from ldpbench.results.schema import TABLES
from ldpbench.results.tables import trivial_metrics

REPRODUCED, REFUTED, INCONCLUSIVE, NOT_RUN = "reproduced", "refuted", "inconclusive", "not run"
STATUSES = (REPRODUCED, REFUTED, INCONCLUSIVE, NOT_RUN)
ALPHA = 0.05
POWER = 0.8  # of the replicates a conclusive campaign would need
# The runs' (and comparisons table's) metric for a claim's metric.
COMPARED_METRIC = {"accuracy": "test_accuracy", "auc": "test_auc"}
# Rounding of percentages (0.79 − 0.80 is −1.0000000000000009 points): a tolerance is met to within it.
SLACK = 1e-9


@dataclass(frozen=True)
class Reading:
    """What the campaign says about a claim (percent or points): `samples` per seed (for a growth, the
    slopes), ours their mean with its 95 % interval."""

    samples: np.ndarray = field(default_factory=lambda: np.empty(0))
    ours: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p_value_adjusted: float = math.nan  # an order's (or difference's) paired test after Holm, if compared
    basis: str = ""  # where the numbers come from
    trivial: tuple[str, ...] = ()  # the compared configurations not shown better than a constant
    compared: int = 0  # how many configurations the claim compares
    steps: tuple[np.ndarray, ...] = ()  # a growth's per-seed steps between consecutive ε

    @property
    def replicates(self) -> int:
        return len(self.samples)


def one_sided_p(values: np.ndarray, threshold: float, above: bool) -> float:
    """p of the one-sided t-test that the mean is above (or below) `threshold`; NaN with < 2 values.
    Identical values: 0 when they lie strictly on the tested side, else 1."""
    if len(values) < 2:
        return math.nan
    if np.ptp(values) <= 1e-9 * max(1.0, float(np.abs(values).max())):  # identical up to rounding
        mean = float(values.mean())
        return 0.0 if (mean > threshold if above else mean < threshold) else 1.0
    return float(stats.ttest_1samp(values, threshold, alternative="greater" if above else "less").pvalue)


def replicates_needed(sd: float, margin: float, two_sided: bool = False) -> float:
    """Seeds for a test at α with power POWER to decide a mean `margin` from its threshold at spread `sd`
    (normal approximation); NaN where the spread is unknown or the margin is 0."""
    if not (math.isfinite(sd) and margin > 0):
        return math.nan
    z = stats.norm.ppf(1 - ALPHA / 2 if two_sided else 1 - ALPHA) + stats.norm.ppf(POWER)
    return float(max(2, math.ceil((z * sd / margin) ** 2)))


def reference_epsilon(runs: pd.DataFrame, claim: Claim, label: str, epsilon: float) -> float | None:
    """The ε at which `label` is read for a claim at `epsilon`: `epsilon` itself, or ∞ for a non-private
    reference (NP, a noiseless sketch) that the campaign runs only there, so that "DiffSketch at ε = 1
    loses at most 2 points to NP" pairs the two on their shared seeds; None if it ran at neither."""
    mine = runs[(runs["dataset"] == claim.dataset) & (runs["model"] == claim.model) & (runs["label"] == label)]
    ran = set(mine["epsilon"].astype(float))
    if epsilon in ran:
        return epsilon
    return math.inf if ran == {math.inf} else None


def _seed_values(runs: pd.DataFrame, claim: Claim, label: str, epsilon: float) -> pd.Series:
    """Per (seed, fold), the metric in percent of the configuration's ok runs at `epsilon`."""
    here = runs[(runs["dataset"] == claim.dataset) & (runs["model"] == claim.model) & (runs["label"] == label)
                & (runs["epsilon"] == epsilon)]
    values = here[here["status"] == "ok"].set_index(["seed", "fold"])[COMPARED_METRIC[claim.metric]].astype(float)
    return 100 * values[np.isfinite(values)]


def _by_seed(values: pd.Series) -> pd.Series:
    return values.groupby(level="seed").mean()


def _trivial(summary: pd.DataFrame, claim: Claim, configurations: list[tuple[str, float]]) -> tuple[str, ...]:
    """The configurations (label at ε) the summary flags trivial for the claim's metric."""
    flagged = []
    for label, epsilon in configurations:
        rows = summary[(summary["dataset"] == claim.dataset) & (summary["model"] == claim.model)
                       & (summary["label"] == label) & (summary["epsilon"] == epsilon)]
        if not rows.empty and COMPARED_METRIC[claim.metric] in trivial_metrics(rows.iloc[0]):
            flagged.append(f"{label} at ε = {epsilon:g}" if len(claim.epsilons) > 1 else label)
    return tuple(flagged)


def _holm_p(comparisons: pd.DataFrame | None, claim: Claim) -> float:
    """The Holm-adjusted p of the claim's pair in its comparison family, NaN if not compared."""
    if comparisons is None or comparisons.empty:
        return math.nan
    first, second = claim.mechanisms
    row = comparisons[(comparisons["dataset"] == claim.dataset) & (comparisons["model"] == claim.model)
                      & (comparisons["epsilon"] == claim.epsilon)
                      & (comparisons["metric"] == COMPARED_METRIC[claim.metric])
                      & (((comparisons["mechanism_a"] == first) & (comparisons["mechanism_b"] == second))
                         | ((comparisons["mechanism_a"] == second) & (comparisons["mechanism_b"] == first)))]
    return math.nan if row.empty else float(row.iloc[0]["p_value_adjusted"])


def _reading(samples: np.ndarray, basis: str, **extra) -> Reading:
    low, high = mean_interval(samples, 0.95)
    return Reading(samples, float(samples.mean()) if len(samples) else math.nan, low, high, basis=basis, **extra)


def read_claim(claim: Claim, runs: pd.DataFrame, summary: pd.DataFrame,
               comparisons: pd.DataFrame | None) -> Reading | None:
    """The campaign's reading of a claim, or None when it did not run the configurations."""
    if claim.relation == "increases":
        label = claim.mechanisms[0]
        configurations = [(label, reference_epsilon(runs, claim, label, epsilon)) for epsilon in claim.epsilons]
    else:
        configurations = [(label, reference_epsilon(runs, claim, label, claim.epsilon)) for label in claim.mechanisms]
    if any(epsilon is None for _, epsilon in configurations):
        return None
    series = [_seed_values(runs, claim, label, epsilon) for label, epsilon in configurations]
    trivial = _trivial(summary, claim, configurations)
    if claim.relation == "increases":
        table = pd.concat([_by_seed(values) for values in series], axis=1, join="inner").to_numpy(dtype=float)
        ranks = np.arange(len(claim.epsilons), dtype=float)
        slopes = np.array([np.polyfit(ranks, row, 1)[0] for row in table]) if len(table) else np.empty(0)
        means = ", ".join(f"{value:.2f}" for value in table.mean(axis=0)) if len(table) else "–"
        return _reading(slopes, f"slope per ε step over {len(slopes)} seed(s); means {means}", trivial=trivial,
                        compared=len(configurations), steps=tuple(np.diff(table, axis=1).T))
    if claim.relation == "value":
        samples = _by_seed(series[0]).to_numpy(dtype=float)
        return _reading(samples, f"mean over {len(samples)} seed(s)", trivial=trivial, compared=1)
    samples, _, _ = seed_differences(*series)
    references = [label for label, epsilon in configurations if epsilon != claim.epsilon]
    basis = f"paired over {len(samples)} seed(s)" + (
        f"; {', '.join(references)} at ε = ∞ (non-private)" if references else "")
    return _reading(samples, basis, p_value_adjusted=_holm_p(comparisons, claim), trivial=trivial, compared=2)


@dataclass(frozen=True)
class Judgement:
    status: str
    why: str
    needed: float = math.nan  # seeds that would make an inconclusive claim conclusive (NaN: unknown)


def _equivalence(claim: Claim, reading: Reading) -> Judgement:
    """A value or difference: TOST against the paper's number (module docstring)."""
    samples, delta, paper = reading.samples, claim.tolerance, claim.value
    gaps = samples - paper
    low90, high90 = mean_interval(gaps, 0.90)
    low95, high95 = mean_interval(gaps, 0.95)
    gap, sd = float(gaps.mean()), float(samples.std(ddof=1))
    equivalent = -delta - SLACK <= low90 and high90 <= delta + SLACK
    excluded = low95 > delta + SLACK or high95 < -delta - SLACK
    interval = f"ours − paper {gap:+.2f}, 90 % [{low90:.2f}, {high90:.2f}], 95 % [{low95:.2f}, {high95:.2f}]"
    if claim.relation == "difference" and paper != 0 and abs(paper) <= delta + SLACK:
        direction = paper > 0
        shown = one_sided_p(samples, 0.0, above=direction) < ALPHA
        opposite = one_sided_p(samples, 0.0, above=not direction) < ALPHA / 2
        sign = "positive" if direction else "negative"
        if opposite:
            return Judgement(REFUTED, f"the paper's {paper:+g} is below resolution (|value| ≤ ±{delta:g}), and "
                                      f"ours {reading.ours:+.2f} has the opposite sign, significant")
        if excluded:
            return Judgement(REFUTED, f"{interval}: outside ±{delta:g}")
        if equivalent and shown:
            return Judgement(REPRODUCED, f"{interval}: within ±{delta:g}, and ours is significantly {sign}")
        return Judgement(INCONCLUSIVE, f"the paper's {paper:+g} is below resolution (|value| ≤ ±{delta:g}: a null "
                                       f"effect would be equivalent), and ours {reading.ours:+.2f} is not shown "
                                       f"{sign}", replicates_needed(sd, abs(reading.ours)))
    if equivalent:
        return Judgement(REPRODUCED, f"{interval}: within ±{delta:g} (equivalent)")
    if excluded:
        return Judgement(REFUTED, f"{interval}: outside ±{delta:g}")
    needed = (replicates_needed(sd, delta - abs(gap)) if abs(gap) < delta
              else replicates_needed(sd, abs(gap) - delta, two_sided=True))
    return Judgement(INCONCLUSIVE, f"{interval}: neither within nor outside ±{delta:g}", needed)


def _order(claim: Claim, reading: Reading) -> Judgement:
    samples, p = reading.samples, reading.p_value_adjusted
    sd = float(samples.std(ddof=1))
    if not math.isfinite(p):
        # In no comparison family (non-private configurations are not compared, or no comparisons
        # table): the paired test alone.
        p = float(stats.ttest_1samp(samples, 0.0).pvalue) if sd > 0 else (0.0 if reading.ours != 0 else 1.0)
        test = f"paired t-test p = {p:.2g} (in no comparison family, e.g. non-private: not Holm-adjusted)"
    else:
        test = f"paired t-test after Holm p = {p:.2g}"
    if p < ALPHA:
        return (Judgement(REPRODUCED, f"first better by {reading.ours:+.2f}: {test}") if reading.ours > 0
                else Judgement(REFUTED, f"the opposite order, {reading.ours:+.2f}: {test}"))
    return Judgement(INCONCLUSIVE, f"not separated ({reading.ours:+.2f}): {test}",
                     replicates_needed(sd, abs(reading.ours), two_sided=True))


def _at_least(claim: Claim, reading: Reading) -> Judgement:
    samples, threshold = reading.samples, claim.value - claim.tolerance
    above, below = one_sided_p(samples, threshold, above=True), one_sided_p(samples, threshold, above=False)
    test = f"ours {reading.ours:+.2f} against at least {threshold:g} (one-sided t-test p = {above:.2g})"
    if above < ALPHA:
        return Judgement(REPRODUCED, test)
    if below < ALPHA:
        return Judgement(REFUTED, f"ours {reading.ours:+.2f} is significantly below {threshold:g} (p = {below:.2g})")
    return Judgement(INCONCLUSIVE, test, replicates_needed(float(samples.std(ddof=1)), abs(reading.ours - threshold)))


def _increases(claim: Claim, reading: Reading) -> Judgement:
    slopes = reading.samples
    rising, falling = one_sided_p(slopes, 0.0, above=True), one_sided_p(slopes, 0.0, above=False)
    drops = holm(np.asarray([one_sided_p(step, -claim.tolerance, above=False) for step in reading.steps]))
    dropped = [index for index, p in enumerate(drops) if p < ALPHA]
    epsilons = claim.epsilons
    named = ", ".join(f"ε {epsilons[i]:g} → {epsilons[i + 1]:g}" for i in dropped)
    trend = f"slope {reading.ours:+.2f} points per ε step (one-sided p = {rising:.2g})"
    if falling < ALPHA:
        return Judgement(REFUTED, f"the metric falls with ε: slope {reading.ours:+.2f} (one-sided p = {falling:.2g})")
    if dropped:
        return Judgement(REFUTED, f"{trend}, but it drops by more than {claim.tolerance:g} at {named} (Holm)")
    if rising < ALPHA:
        return Judgement(REPRODUCED, f"{trend}; no significant drop between consecutive ε")
    return Judgement(INCONCLUSIVE, f"{trend}: no significant growth",
                     replicates_needed(float(slopes.std(ddof=1)), abs(reading.ours)))


RULES = {"value": _equivalence, "difference": _equivalence, "order": _order, "at_least": _at_least,
         "increases": _increases}


def judge(claim: Claim, reading: Reading | None) -> Judgement:
    """The claim's status, why, and the seeds an inconclusive one would need (module docstring)."""
    if reading is None:
        return Judgement(NOT_RUN, "the campaign did not run " + " and ".join(claim.mechanisms) + " there")
    if reading.trivial and len(reading.trivial) == reading.compared:
        constant = "the majority class" if claim.metric == "accuracy" else "AUC 0.5"
        return Judgement(INCONCLUSIVE, f"{', '.join(reading.trivial)}: not shown better than {constant} "
                                       "(trivial), so the campaign cannot judge the claim")
    if reading.replicates < 2:
        return Judgement(INCONCLUSIVE, f"{reading.replicates} replicate(s): no interval or test", math.nan)
    judgement = RULES[claim.relation](claim, reading)
    if reading.trivial:
        return Judgement(judgement.status, f"{judgement.why} ({', '.join(reading.trivial)} trivial)", judgement.needed)
    return judgement


# The rules in one paragraph, for the report and docs/findings.md (the module docstring says it in full).
RULES_TEXT = (
    "The replicate is the seed: every claim is read as one number per seed (the mean over its folds; for "
    "two mechanisms, their paired difference), with t intervals over the seeds; Δ is the claim's tolerance "
    "and α = 0.05. A value or difference is reproduced when equivalence is shown (TOST: the 90 % interval "
    "of ours − paper lies within ±Δ), refuted when the 95 % interval of ours − paper excludes ±Δ, and "
    "inconclusive otherwise, with the seeds that would decide it at the observed spread (80 % power). A "
    "difference no larger than Δ is below resolution (a null effect would be equivalent to it): it is "
    "reproduced only if its sign is shown too (one-sided test), refuted if the opposite sign is. An order "
    "is reproduced when the paired t-test, Holm-adjusted within its comparison family, finds the first "
    "better, refuted when it finds it worse, inconclusive otherwise and always with fewer than 2 seeds. "
    "An at-least difference is reproduced when a one-sided t-test puts it above value − Δ, refuted when "
    "below. A growth over ε is reproduced when the per-seed slope of the metric on the rank of ε is "
    "significantly positive (one-sided t-test) and no step between consecutive ε drops by more than Δ "
    "significantly (one-sided, Holm over the steps); refuted when the slope is significantly negative or a "
    "step drops; inconclusive otherwise. A claim whose compared configurations are all trivial (not shown "
    "better than the majority class, or than AUC 0.5) is inconclusive. A configuration the campaign did "
    "not run is not run."
)


def tally(statuses: pd.Series) -> str:
    """'n reproduced, n refuted, n inconclusive, n not run' of a scorecard's status column."""
    counts = statuses.value_counts()
    return ", ".join(f"{int(counts.get(status, 0))} {status}" for status in STATUSES)


SCORECARD_COLUMNS = TABLES["scorecard"].names  # in order (ldpbench.results.schema)


def scorecard(claims: list[Claim], runs: pd.DataFrame, summary: pd.DataFrame,
              comparisons: pd.DataFrame | None) -> pd.DataFrame:
    """One row per claim and ε: the paper's number, ours with its 95 % interval, the gap and the status."""
    rows = []
    for claim in claims:
        reading = read_claim(claim, runs, summary, comparisons)
        judgement = judge(claim, reading)
        reading = reading or Reading()
        fields = asdict(claim)
        rows.append({
            **{key: fields[key] for key in ("paper", "claims_file", "claim", "source", "statement", "dataset",
                                            "model", "epsilon", "metric", "relation", "tolerance", "substitution")},
            "mechanisms": " vs ".join(claim.mechanisms), "paper_value": claim.value, "ours": reading.ours,
            "ours_low": reading.low, "ours_high": reading.high,
            "gap": reading.ours - claim.value if math.isfinite(claim.value) else math.nan,
            "p_value_adjusted": reading.p_value_adjusted, "replicates": reading.replicates,
            "replicates_needed": judgement.needed, "trivial": ", ".join(reading.trivial),
            "basis": reading.basis, "status": judgement.status, "why": judgement.why,
        })
    return pd.DataFrame(rows, columns=SCORECARD_COLUMNS)


def write_scorecard(tables_dir, claims_files: list, out) -> pd.DataFrame:
    """tables/scorecard.parquet of the campaign in `tables_dir` against the claims files."""
    from ldpbench.layout import table_file
    from ldpbench.results.schema import write_table

    runs = pd.read_parquet(table_file(tables_dir, "runs"))
    summary = pd.read_parquet(table_file(tables_dir, "summary"))
    comparisons_file = table_file(tables_dir, "comparisons")
    comparisons = pd.read_parquet(comparisons_file) if comparisons_file.exists() else None
    table = scorecard(load_claims(claims_files), runs, summary, comparisons)
    write_table(out, "scorecard", table)
    return table
