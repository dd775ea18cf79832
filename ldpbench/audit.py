"""Black-box privacy audit: an empirical lower bound on the ε of the mechanism that actually runs.

After LDP-Auditor (Arcolezi & Gambs, PETS 2024) and Jagielski et al. (NeurIPS 2020), extended from
frequency oracles to vector mechanisms. For a pair of inputs (x, x'), any two of which are
neighbours under LDP, draw n reports of each. On the first half of each sample choose a
distinguishing event: project every report on w = (mean report under x) − (mean under x'), or on
one of the coordinates where the two laws differ most, and take {⟨y, w⟩ > τ} or {⟨y, w⟩ < τ}, τ
among the order statistics, whichever gives the largest Clopper–Pearson ratio. On the second half,
independent of that choice, bound ε ≥ ln(P̲_x(E) / P̄_x'(E)) with one-sided Clopper–Pearson
bounds. An ε-LDP report has P_x(E) ≤ e^ε·P_x'(E) for every event, so the bound exceeds the true ε
only when one of the two confidence bounds fails.

False alarms. Each final bound holds at level `alpha` (two one-sided bounds at alpha/2 each);
with several pairs the level is split evenly over them (Bonferroni), so the largest bound of a
mechanism exceeds its true ε with probability at most `alpha` (default 0.01, the 99 % of the issue).

Pairs. Every registered mechanism offers `audit_pairs()`: inputs worth testing (the extremes of its
input domain, inputs whose top-k sets differ, records with other labels); `random_pairs` adds a
seeded random search. A bound is read against the mechanism's accounting of one report: above the
worst case it is a defect, above the claim (within the worst case) the claim is exceeded, which is
information (BitRand, the anonymizer accountings, PE).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

# torch and the mechanisms are imported where reports are drawn: the report and the workflow read
# this module's verdicts and tables without paying for them.
if TYPE_CHECKING:
    from ldpbench.mechanisms.base import AuditPair, RegisteredMechanism

ALPHA = 0.01
SAMPLES = 1_000_000
# Input width of an audited mechanism, and random pairs tried beside its own.
DIMS = 4
RANDOM_PAIRS = 2
# The cohort an audited mechanism is built for: only FedSel's mu = "auto" reads it.
AUDIT_COHORT = 1000
# What a campaign's runs record about their mechanism, read by `audit_cells`.
RUN_COLUMNS = ["mechanism", "mechanism_params", "epsilon", "epsilon_per_report", "classes"]
# Events with fewer hits than this under the rarer input are not considered: their bounds are loose.
MIN_HITS = 30
# Single coordinates tried as directions beside w (those where the two laws differ most).
COORDINATE_DIRECTIONS = 8
# Rows privatised per call: bounds the memory of a draw of a million reports.
CHUNK = 65_536

CONSISTENT, CLAIM_EXCEEDED, DEFECT = "consistent", "claim exceeded", "defect: above the worst case"


def clopper_pearson(hits: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds (lower, upper) on a binomial proportion, each at level alpha.

    The beta quantiles through scipy.special (scipy.stats' beta.ppf and beta.isf call the same
    functions, and importing scipy.stats costs an audit job 1.6 s).
    """
    from scipy.special import betainccinv, betaincinv

    lower = float(betaincinv(hits, n - hits + 1, alpha)) if hits > 0 else 0.0
    upper = float(betainccinv(hits + 1, n - hits, alpha)) if hits < n else 1.0
    return lower, upper


def _log_ratio(hits_x: int, n_x: int, hits_y: int, n_y: int, alpha: float) -> float:
    """ln(lower bound of P_x(E) / upper bound of P_x'(E)), each bound at level alpha/2."""
    p_low = clopper_pearson(hits_x, n_x, alpha / 2)[0]
    q_high = clopper_pearson(hits_y, n_y, alpha / 2)[1]
    return math.log(p_low / q_high) if p_low > 0 else -math.inf


@dataclass(frozen=True)
class Bound:
    epsilon: float  # the audited lower bound (−inf when no event separates the inputs)
    event: str  # the event measured on the second half, in words


def _directions(first_x: np.ndarray, first_y: np.ndarray) -> list[tuple[str, Callable[[np.ndarray], np.ndarray]]]:
    """What reports are projected on, as (name, projection): w, the difference of the first halves'
    means, and the coordinates where the two laws differ most (a composed report whose leak sits in
    one coordinate, e.g. a label beside many noisy feature bits, is diluted in w)."""
    w = first_x.mean(axis=0, dtype=np.float64) - first_y.mean(axis=0, dtype=np.float64)
    if not np.any(w):  # the first halves' means agree: nothing to project on
        ones = np.ones_like(w)
        return [("<y, 1>", lambda reports: reports @ ones)]
    directions = [("<y, w>", lambda reports: reports @ w)]
    if len(w) > 1:
        spread = np.sqrt(first_x.var(axis=0, dtype=np.float64) + first_y.var(axis=0, dtype=np.float64))
        separation = np.abs(w) / np.maximum(spread, np.finfo(float).tiny)
        for j in np.argsort(-separation, kind="stable")[:COORDINATE_DIRECTIONS]:
            if w[j]:
                directions.append((f"y[{j}]", _coordinate(int(j), float(np.sign(w[j])))))
    return directions


def _coordinate(j: int, sign: float) -> Callable[[np.ndarray], np.ndarray]:
    """The projection on coordinate j, signed so that larger values favour x (a column, not a product)."""
    return lambda reports: sign * reports[:, j]


def lower_bound(outputs_x: np.ndarray, outputs_y: np.ndarray, alpha: float = ALPHA,
                min_hits: int = MIN_HITS) -> Bound:
    """A lower bound on ε from reports [n, m] under x and under x' (module docstring), at level alpha."""
    half = min(len(outputs_x), len(outputs_y)) // 2
    first_x, second_x = outputs_x[:half], outputs_x[half:2 * half]
    first_y, second_y = outputs_y[:half], outputs_y[half:2 * half]
    candidates = []
    for name, project in _directions(first_x, first_y):
        t_x, t_y = np.sort(project(first_x)), np.sort(project(first_y))
        for hits in np.unique(np.geomspace(min_hits, max(min_hits, half // 2), 40).astype(int)):
            if hits < half:
                # {T > τ}: rare under x' (its upper tail), {T < τ}: rare under x (its lower tail).
                candidates.append((name, project, ">", t_y[-hits], t_x, t_y))
                candidates.append((name, project, "<", t_x[hits - 1], t_y, t_x))

    def hits(ordered: np.ndarray, side: str, tau: float) -> int:
        """Count of {T > τ} or {T < τ} in a sorted sample, by bisection."""
        if side == ">":
            return len(ordered) - int(np.searchsorted(ordered, tau, side="right"))
        return int(np.searchsorted(ordered, tau, side="left"))

    def first_half_bound(candidate) -> float:
        _, _, side, tau, common, rare = candidate
        return _log_ratio(hits(common, side, tau), half, hits(rare, side, tau), half, alpha)

    if not candidates:
        return Bound(-math.inf, "none (too few samples)")
    name, project, side, tau, _, _ = max(candidates, key=first_half_bound)
    s_x, s_y = project(second_x), project(second_y)
    if side == ">":
        epsilon = _log_ratio(int((s_x > tau).sum()), len(s_x), int((s_y > tau).sum()), len(s_y), alpha)
        event = f"{name} > {tau:.6g} (more likely under x)"
    else:
        epsilon = _log_ratio(int((s_y < tau).sum()), len(s_y), int((s_x < tau).sum()), len(s_x), alpha)
        event = f"{name} < {tau:.6g} (more likely under x')"
    return Bound(epsilon, event)


def random_pairs(dims: int, count: int, seed: int) -> list[AuditPair]:
    """`count` pairs of inputs drawn uniformly from [-1, 1]^dims (a generic search, seeded)."""
    import torch

    from ldpbench.mechanisms.base import AuditPair

    gen = torch.Generator().manual_seed(seed)
    draws = torch.rand(count, 2, dims, generator=gen, dtype=torch.float64) * 2 - 1
    return [AuditPair(f"random {i}", draws[i, 0], draws[i, 1]) for i in range(count)]


def draw_reports(mechanism: RegisteredMechanism, pair: AuditPair, which: str, samples: int,
                 key: tuple) -> np.ndarray:
    """`samples` reports [samples, width] of one input of the pair (`which`: "x" or "x_prime")."""
    import torch

    from ldpbench.mechanisms.base import DataRelease
    from ldpbench.rng import ClientStreams

    value, label = (pair.x, pair.label_x) if which == "x" else (pair.x_prime, pair.label_x_prime)
    rows = []
    for start in range(0, samples, CHUNK):
        clients = torch.arange(start, min(start + CHUNK, samples), dtype=torch.int64)
        streams = ClientStreams(key + (which,), clients)
        inputs = value.to(torch.float32).expand(len(clients), -1).clone()
        if isinstance(mechanism, DataRelease):
            released = mechanism.release(inputs, torch.full((len(clients),), label, dtype=torch.int64), streams)
            report = torch.cat([released.features.reshape(len(clients), -1).to(torch.float64),
                                released.labels.to(torch.float64).unsqueeze(1)], dim=1)
        else:
            report = mechanism.privatize(inputs, streams, mechanism.initial_state(len(clients))).reports
        rows.append(report.to(torch.float64).numpy())
    return np.concatenate(rows)


@dataclass(frozen=True)
class AuditResult:
    mechanism: str
    params: str  # the mechanism's campaign parameters, as JSON
    epsilon: float  # the budget of one report it was created with
    dims: int
    claimed: float  # claimed ε of one report
    worst_case: float  # worst-case ε of one report
    audited_lower_bound: float
    samples: int  # reports drawn per input of each pair
    pairs: int
    pair: str  # the pair that gave the bound
    event: str
    alpha: float
    verdict: str


def verdict(claimed: float, worst_case: float, bound: float) -> str:
    # A bound equal to the worst case is what an exact audit of a tight mechanism gives in the
    # limit; only a strictly larger one is a defect.
    if bound > worst_case:
        return DEFECT
    return CLAIM_EXCEEDED if bound > claimed else CONSISTENT


def audit(mechanism: RegisteredMechanism, params: dict, samples: int = SAMPLES, random: int = RANDOM_PAIRS,
          seed: int = 0, alpha: float = ALPHA) -> AuditResult:
    """Audit one report of `mechanism` on its own pairs and `random` random ones, at level alpha."""
    from ldpbench.mechanisms.base import DataRelease

    pairs = list(mechanism.audit_pairs())
    if random and not isinstance(mechanism, DataRelease):
        pairs += random_pairs(mechanism.dims, random, seed)
    best, best_pair = Bound(-math.inf, "none"), "none"
    for index, pair in enumerate(pairs):
        key = ("audit", mechanism.name, seed, index)
        bound = lower_bound(draw_reports(mechanism, pair, "x", samples, key),
                            draw_reports(mechanism, pair, "x_prime", samples, key), alpha / len(pairs))
        if bound.epsilon > best.epsilon:
            best, best_pair = bound, pair.name
    accounting = mechanism.accounting()
    return AuditResult(
        mechanism=mechanism.name, params=json.dumps(params, sort_keys=True), epsilon=float(mechanism.epsilon),
        dims=mechanism.dims, claimed=float(accounting.epsilon_claimed),
        worst_case=float(accounting.epsilon_worst_case), audited_lower_bound=best.epsilon, samples=samples,
        pairs=len(pairs), pair=best_pair, event=best.event, alpha=alpha,
        verdict=verdict(accounting.epsilon_claimed, accounting.epsilon_worst_case, best.epsilon))


def audit_registry(names: list[str] | None = None, epsilon: float | None = None, dims: int = DIMS,
                   samples: int = SAMPLES, seed: int = 0, alpha: float = ALPHA,
                   params: dict | None = None, random: int = RANDOM_PAIRS) -> list[AuditResult]:
    """Audit the private mechanisms of the registry (or `names`), each at `epsilon` (default: its
    `example_epsilon`, at which its default parameters are valid) on `dims`-dimensional inputs."""
    from ldpbench import mechanisms

    results = []
    for name in names or mechanisms.names():
        cls = mechanisms.get(name)
        if not cls.private:
            continue
        at = cls.example_epsilon if epsilon is None else epsilon
        mechanism = mechanisms.create(name, at, dims, params, cohort_size=AUDIT_COHORT, classes=2)
        results.append(audit(mechanism, dict(params or {}), samples=samples, random=random, seed=seed,
                             alpha=alpha))
    return results


def audited_configurations(cell_dirs: list) -> list[dict]:
    """The distinct private (mechanism, parameters, budget of one report, classes) that ran in these
    cells, read from their runs' summaries: the audit checks what ran, at the budget it ran with."""
    from pathlib import Path

    import pyarrow.parquet as pq

    from ldpbench.errors import LdpbenchError
    from ldpbench.layout import run_summaries

    found = {}
    for cell in map(Path, cell_dirs):
        summaries = run_summaries(cell)
        if not summaries:
            raise LdpbenchError(f"audit: cell directory '{cell}' holds no run summaries")
        for summary in summaries:
            for row in pq.read_table(summary, columns=RUN_COLUMNS).to_pylist():
                if row["epsilon"] is None or not math.isfinite(row["epsilon"]):
                    continue  # a non-private run: nothing to audit
                key = (row["mechanism"], row["mechanism_params"], row["epsilon_per_report"], row["classes"])
                found[key] = {"mechanism": row["mechanism"], "params": json.loads(row["mechanism_params"]),
                              "epsilon": row["epsilon_per_report"], "classes": row["classes"]}
    return [found[key] for key in sorted(found, key=repr)]


def audit_cells(cell_dirs: list, dims: int = DIMS, samples: int = SAMPLES, seed: int = 0, alpha: float = ALPHA,
                random: int = RANDOM_PAIRS) -> list[AuditResult]:
    """Audit every private configuration that ran in `cell_dirs` (audited_configurations), each
    rebuilt on `dims`-dimensional inputs: a million reports of a model's full width do not fit a
    job's memory, and every registered mechanism treats coordinates alike."""
    from ldpbench import mechanisms

    results = []
    for ran in audited_configurations(cell_dirs):
        mechanism = mechanisms.create(ran["mechanism"], ran["epsilon"], dims, ran["params"],
                                      cohort_size=AUDIT_COHORT, classes=ran["classes"])
        results.append(audit(mechanism, ran["params"], samples=samples, random=random, seed=seed, alpha=alpha))
    return results


def defects(results: list[AuditResult]) -> list[str]:
    """The audited configurations whose bound is above their reported worst case, in words."""
    return [f"{result.mechanism} {result.params} at ε = {result.epsilon:g} (audited ≥ "
            f"{result.audited_lower_bound:.4g} > worst case {result.worst_case:.4g})"
            for result in results if result.verdict == DEFECT]


# The Arrow type of each of AuditResult's field types (its annotations are strings: postponed).
ARROW_TYPES = {"str": "string", "float": "float64", "int": "int64"}


def table_schema():
    """The Arrow schema of an audit table (a configuration's part or tables/audit.parquet): AuditResult's
    fields. Written and read with it, a table without rows keeps its columns' types, so a campaign with
    nothing to audit (only non-private mechanisms) joins its runs like any other."""
    from dataclasses import fields

    import pyarrow as pa

    return pa.schema([pa.field(field.name, ARROW_TYPES[field.type]) for field in fields(AuditResult)])


def read_table(path):
    """An audit table as a DataFrame of table_schema()'s columns and types, also one without rows that
    an earlier version wrote with untyped columns; LdpbenchError naming the file if it does not fit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ldpbench.errors import LdpbenchError

    schema = table_schema()
    table = pq.read_table(path)  # a missing file: the OSError the command line reports with its path
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise LdpbenchError(f"audit table '{path}' lacks columns {missing}")
    try:
        return table.select(schema.names).cast(schema).to_pandas()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise LdpbenchError(f"audit table '{path}' does not match the audit's columns: {error}") from None


def merge_tables(parts: list, path) -> int:
    """tables/audit.parquet from the campaign's per-configuration audit files; returns its rows."""
    import pandas as pd

    from ldpbench.atomic import write_parquet

    frames = [read_table(part) for part in parts]
    table = pd.concat(frames, ignore_index=True) if frames else table_schema().empty_table().to_pandas()
    table = table.drop_duplicates(["mechanism", "params", "epsilon"]).sort_values(["mechanism", "params", "epsilon"])
    write_parquet(path, table.reset_index(drop=True), table_schema())
    return len(table)


def write_table(path, results: list[AuditResult]) -> None:
    """tables/audit.parquet: one row per audited (mechanism, parameters, ε), written atomically."""
    from dataclasses import asdict

    from ldpbench.atomic import write_parquet

    write_parquet(path, [asdict(result) for result in results], table_schema())
