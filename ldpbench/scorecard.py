"""The reproduction scorecard: the papers' claims (config/paper_claims/) read against a campaign.

A claim names a configuration by the campaign's dataset, model, mechanism labels and ε, and says
what the paper reports: a value (the first mechanism's accuracy), a difference (first − second,
e.g. FedSel's gains), an order (the first is better), a least difference (first − second ≥ x) or
a growth (one mechanism's accuracy grows with ε, over a list of ε).
Each is read from the campaign's tables:
- value: the summary's mean and Student-t 95 % interval over seeds and folds; reproduced when the
  paper's value lies in the interval widened by the claim's tolerance (with one replicate, the
  mean ± tolerance);
- difference, at_least: the paired difference of tables/comparisons.parquet (mean, paired 95 %
  interval, Holm-adjusted p) where both mechanisms share a comparison family, else the difference
  of the summary means (no interval); a difference reproduces when its value lies in the widened
  interval, at_least when the mean is at least the value less the tolerance and the paired
  difference is significantly positive;
- order: reproduced when the paired test finds the first better after Holm's correction; a tie or
  the opposite order does not reproduce it;
- increases: the smallest step of the mean from one ε to the next (unpaired: different ε are not
  compared pairwise); reproduced when no step falls by more than the tolerance.
A configuration the campaign did not run gives "not run". Percentages and points throughout.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from ldpbench.errors import ConfigError

SCHEMA = Path(__file__).resolve().parent / "schemas" / "paper_claims.schema.yaml"
REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not reproduced", "not run"
# The comparisons table's metric for a claim's metric.
COMPARED_METRIC = {"accuracy": "test_accuracy", "auc": "test_auc"}
# The summary's mean and interval columns for a claim's metric.
SUMMARY_COLUMNS = {"accuracy": ("mean", "ci95_low", "ci95_high"), "auc": ("auc_mean", "auc_ci95_low", "auc_ci95_high")}
# Where +∞ is a documented value: `epsilon: .inf` reads a non-private reference (list indices left out).
INFINITY_ALLOWED = {("claims", "epsilon")}
# Rounding of percentages (0.79 − 0.80 is −1.0000000000000009 points): a tolerance is met to within it.
SLACK = 1e-9


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str  # the claim's id in its file
    source: str  # the table or figure
    statement: str
    dataset: str
    model: str
    epsilon: float  # the ε it is read at (for a growth, the largest of its list)
    epsilons: tuple[float, ...]  # a growth's list of ε; (epsilon,) otherwise
    metric: str
    relation: str
    mechanisms: tuple[str, ...]
    value: float  # NaN for an order
    tolerance: float
    substitution: str
    claims_file: str



def load_claims(paths: list) -> list[Claim]:
    """Every claim of the files, one per ε, validated (ConfigError naming the file and key).

    A file is read as a campaign file is (a regular file of a few MB at most, UTF-8, safe YAML), and
    its numbers must be finite: a NaN value or an infinite tolerance would be scored as if meant.
    """
    # Imports the registries: only where claims are loaded.
    from ldpbench.campaign import read_yaml_file, validate_document

    claims = []
    for path in map(Path, paths):
        document = read_yaml_file(path, "paper claims file")
        document = validate_document(document, SCHEMA, f"paper claims file '{path}'", INFINITY_ALLOWED)
        seen = set()
        for index, entry in enumerate(document["claims"]):
            where = f"paper claims file '{path}', key 'claims[{index}]'"
            if entry["id"] in seen:
                raise ConfigError(f"{where}: the id '{entry['id']}' is used twice")
            seen.add(entry["id"])
            needs = 1 if entry["relation"] in ("value", "increases") else 2
            if len(entry["mechanisms"]) != needs:
                raise ConfigError(f"{where}: a '{entry['relation']}' claim names {needs} mechanism(s), "
                                  f"got {entry['mechanisms']}")
            if (entry["relation"] in ("order", "increases")) == ("value" in entry):
                raise ConfigError(f"{where}: " + (f"a '{entry['relation']}' claim has no 'value'" if "value" in entry
                                                  else f"a '{entry['relation']}' claim needs a 'value'"))
            epsilons = entry["epsilon"] if isinstance(entry["epsilon"], list) else [entry["epsilon"]]
            if entry["relation"] == "increases":
                if len(epsilons) < 2:
                    raise ConfigError(f"{where}: an 'increases' claim needs a list of at least two ε")
                groups = [sorted(map(float, epsilons))]
            else:
                groups = [[float(epsilon)] for epsilon in epsilons]
            for group in groups:
                claims.append(Claim(
                    paper=document["paper"], claim=entry["id"], source=entry["source"],
                    statement=entry["statement"], dataset=entry["dataset"], model=entry["model"],
                    epsilon=group[-1], epsilons=tuple(group), metric=entry["metric"], relation=entry["relation"],
                    mechanisms=tuple(entry["mechanisms"]), value=float(entry.get("value", math.nan)),
                    tolerance=float(entry["tolerance"]), substitution=entry["substitution"],
                    claims_file=path.name))
    return claims


@dataclass(frozen=True)
class Reading:
    """What the campaign says about a claim (percent or points)."""

    ours: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p_value_adjusted: float = math.nan
    replicates: int = 0
    basis: str = ""  # where the number comes from


def _configuration(summary: pd.DataFrame, claim: Claim, label: str, epsilon: float) -> pd.Series | None:
    rows = summary[(summary["dataset"] == claim.dataset) & (summary["model"] == claim.model)
                   & (summary["label"] == label) & (summary["epsilon"] == epsilon)]
    return None if rows.empty else rows.iloc[0]


def _paired(comparisons: pd.DataFrame | None, claim: Claim) -> Reading | None:
    """The paired difference first − second from the comparisons table, if they were compared."""
    if comparisons is None or comparisons.empty:
        return None
    first, second = claim.mechanisms
    here = comparisons[(comparisons["dataset"] == claim.dataset) & (comparisons["model"] == claim.model)
                       & (comparisons["epsilon"] == claim.epsilon)
                       & (comparisons["metric"] == COMPARED_METRIC[claim.metric])]
    for a, b, sign in ((first, second, 1.0), (second, first, -1.0)):
        row = here[(here["mechanism_a"] == a) & (here["mechanism_b"] == b)]
        if not row.empty:
            row = row.iloc[0]
            low, high = sorted((sign * 100 * row["ci95_low"], sign * 100 * row["ci95_high"]))
            return Reading(sign * 100 * row["mean_diff"], low, high, float(row["p_value_adjusted"]),
                           int(row["n_pairs"]), f"paired over {int(row['n_pairs'])} replicates, {row['test']}")
    return None


def read_claim(claim: Claim, summary: pd.DataFrame, comparisons: pd.DataFrame | None) -> Reading | None:
    """The campaign's reading of a claim, or None when it did not run the configurations."""
    mean, low, high = SUMMARY_COLUMNS[claim.metric]
    if claim.relation == "increases":
        rows = [_configuration(summary, claim, claim.mechanisms[0], epsilon) for epsilon in claim.epsilons]
        if any(row is None for row in rows):
            return None
        steps = [100 * (after[mean] - before[mean]) for before, after in zip(rows, rows[1:])]
        return Reading(min(steps), replicates=int(min(row["runs_ok"] for row in rows)),
                       basis="smallest step of the mean between consecutive ε: "
                             + ", ".join(f"{100 * row[mean]:.2f}" for row in rows))
    rows = [_configuration(summary, claim, label, claim.epsilon) for label in claim.mechanisms]
    if any(row is None for row in rows):
        return None
    if claim.relation == "value":
        row = rows[0]
        return Reading(100 * row[mean], 100 * row[low], 100 * row[high], replicates=int(row["runs_ok"]),
                       basis="one run" if row["runs_ok"] == 1 else f"mean over {int(row['runs_ok'])} runs")
    paired = _paired(comparisons, claim)
    if paired is not None:
        return paired
    return Reading(100 * (rows[0][mean] - rows[1][mean]), replicates=int(min(r["runs_ok"] for r in rows)),
                   basis="difference of the means (not compared pairwise)")


def judge(claim: Claim, reading: Reading | None) -> tuple[str, str]:
    """(status, why) of a claim given the campaign's reading."""
    if reading is None:
        return NOT_RUN, "the campaign did not run " + " and ".join(claim.mechanisms) + " there"
    has_interval = math.isfinite(reading.low) and math.isfinite(reading.high)
    low, high = (reading.low, reading.high) if has_interval else (reading.ours, reading.ours)
    ours = (f"ours [{low:.2f}, {high:.2f}]" if has_interval
            else f"ours {reading.ours:.2f} (no interval: {reading.basis})")
    significant = math.isfinite(reading.p_value_adjusted) and reading.p_value_adjusted < 0.05
    if claim.relation in ("value", "difference"):
        inside = low - claim.tolerance - SLACK <= claim.value <= high + claim.tolerance + SLACK
        why = f"the paper's {claim.value:g} is {'within' if inside else 'outside'} {ours} ± {claim.tolerance:g}"
        return (REPRODUCED if inside else NOT_REPRODUCED), why
    if claim.relation == "increases":
        ok = reading.ours >= -claim.tolerance - SLACK
        return (REPRODUCED if ok else NOT_REPRODUCED), (
            f"the mean {'never falls' if ok else 'falls'} by more than {claim.tolerance:g} from one ε to the next")
    if claim.relation == "at_least":
        ok = reading.ours >= claim.value - claim.tolerance - SLACK and significant and reading.ours > 0
        return (REPRODUCED if ok else NOT_REPRODUCED), (
            f"ours {reading.ours:+.2f} against at least {claim.value:g} − {claim.tolerance:g}"
            + ("" if significant else "; not significant after Holm"))
    if not math.isfinite(reading.p_value_adjusted):
        return NOT_REPRODUCED, "no paired test (the mechanisms were not compared over shared replicates)"
    if significant:
        return ((REPRODUCED, "first better after Holm") if reading.ours > 0
                else (NOT_REPRODUCED, "the opposite order, significant after Holm"))
    return NOT_REPRODUCED, f"a tie: no significant difference after Holm (p = {reading.p_value_adjusted:.2g})"


def tally(statuses: pd.Series) -> str:
    """'n reproduced, n not reproduced, n not run' of a scorecard's status column."""
    counts = statuses.value_counts()
    return ", ".join(f"{int(counts.get(status, 0))} {status}" for status in (REPRODUCED, NOT_REPRODUCED, NOT_RUN))


SCORECARD_COLUMNS = ["paper", "claims_file", "claim", "source", "statement", "dataset", "model", "epsilon",
                     "metric", "relation", "mechanisms", "paper_value", "tolerance", "ours", "ours_low",
                     "ours_high", "gap", "p_value_adjusted", "replicates", "basis", "status", "why",
                     "substitution"]


def scorecard(claims: list[Claim], summary: pd.DataFrame, comparisons: pd.DataFrame | None) -> pd.DataFrame:
    """One row per claim and ε: the paper's number, ours with its interval, the gap and the status."""
    rows = []
    for claim in claims:
        reading = read_claim(claim, summary, comparisons)
        status, why = judge(claim, reading)
        reading = reading or Reading()
        fields = asdict(claim)
        rows.append({
            **{key: fields[key] for key in ("paper", "claims_file", "claim", "source", "statement", "dataset",
                                            "model", "epsilon", "metric", "relation", "tolerance", "substitution")},
            "mechanisms": " vs ".join(claim.mechanisms), "paper_value": claim.value, "ours": reading.ours,
            "ours_low": reading.low, "ours_high": reading.high,
            "gap": reading.ours - claim.value if math.isfinite(claim.value) else math.nan,
            "p_value_adjusted": reading.p_value_adjusted, "replicates": reading.replicates,
            "basis": reading.basis, "status": status, "why": why,
        })
    return pd.DataFrame(rows, columns=SCORECARD_COLUMNS)


def write_scorecard(tables_dir, claims_files: list, out) -> pd.DataFrame:
    """tables/scorecard.parquet of the campaign in `tables_dir` against the claims files."""
    from ldpbench.atomic import write_parquet
    from ldpbench.layout import table_file

    summary = pd.read_parquet(table_file(tables_dir, "summary"))
    comparisons_file = table_file(tables_dir, "comparisons")
    comparisons = pd.read_parquet(comparisons_file) if comparisons_file.exists() else None
    table = scorecard(load_claims(claims_files), summary, comparisons)
    write_parquet(out, table)
    return table
