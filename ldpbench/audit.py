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

Memory. No sample is held whole: the reports are drawn CHUNK clients a call (fewer when wide),
the event is chosen on the first halves' projections one direction at a time, and measured by
counting its hits in the second halves piece by piece. Reports up to HELD_WIDTH wide keep their
first halves; wider ones are drawn again for each of three passes over them (their means; their
variances and projections on w; the chosen coordinates): twice the draws of holding them. At most
8 float64 values a sample are held either way (`memory_mib`), and the bounds are those of an audit
that holds every report: the same draws, sums and products taken in the same order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

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
# What a campaign's runs record about their mechanism, read by `audited_configurations`.
RUN_COLUMNS = ["mechanism", "mechanism_params", "epsilon", "epsilon_per_report", "classes"]
# Events with fewer hits than this under the rarer input are not considered: their bounds are loose.
MIN_HITS = 30
NUMBA_MOMENTS = "ldpbench.numba_moments"  # loaded on demand (rng.compiled_module)
# Single coordinates tried as directions beside w (those where the two laws differ most).
COORDINATE_DIRECTIONS = 8
# Clients privatised per call, fewer where reports are wide: a call holds at most CHUNK_VALUES
# report values whatever their width. Each client's report is its own whatever call draws it (the
# mechanism contract checks it), so how the clients are grouped into calls changes no report.
CHUNK = 65_536
CHUNK_VALUES = 8 * CHUNK
# Reports at most this wide have the first halves of their samples held in memory (5 values a
# report, 7.5 while their variances are taken: no more than the projections on 8 coordinates that
# wider reports need); wider ones are drawn again for each pass over their first halves.
HELD_WIDTH = 5
# The memory of an audit (memory_mib): its process (Python with torch, numpy and scipy imported, the
# mechanism built, its draws compiled, one call's reports: a few hundred MiB resident for every
# registered mechanism at dims 4 to 1024) with room, and per sample (report
# drawn per input) at most 8 float64 values held: the first halves of reports up to HELD_WIDTH wide
# (7.5 values while their variances are taken) or the projections on 8 coordinates of wider ones;
# a quarter more for the allocator.
MEMORY_BASE_MIB = 1024
MEMORY_BYTES_PER_SAMPLE = 80

CONSISTENT, CLAIM_EXCEEDED, DEFECT = "consistent", "claim exceeded", "defect: above the worst case"
# The workflow hands its audit settings and directory to the final cells' jobs in the environment, not
# on their command lines: a change of them must not rerun a cell (the campaign's audit-table job, whose
# command carries them, computes what a change leaves missing).
AUDIT_ENV = "LDPBENCH_AUDIT"


def memory_mib(samples: int) -> int:
    """MiB of memory an audit job needs at `samples` reports per input of each pair, whatever the
    mechanism, the width of its reports and `dims` (a call draws at most CHUNK_VALUES values, and
    the pairs are audited one after the other): what the workflow declares for the job."""
    return MEMORY_BASE_MIB + math.ceil(samples * MEMORY_BYTES_PER_SAMPLE / 2**20)


def clopper_pearson(hits: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds (lower, upper) on a binomial proportion, each at level alpha.

    The beta quantiles through scipy.special (scipy.stats' beta.ppf and beta.isf call the same
    functions, and importing scipy.stats would cost an audit job over a second).
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


Projection = Callable[[np.ndarray], np.ndarray]


class Reports(Protocol):
    """The reports [len, width] of one input, read a range of rows at a time (`step` rows a piece)."""

    width: int
    step: int

    def __len__(self) -> int: ...

    def rows(self, start: int, stop: int) -> np.ndarray: ...


def _step(width: int) -> int:
    """Rows of a piece (and clients of a call) for reports `width` values wide: CHUNK, or fewer to keep
    to CHUNK_VALUES values. A multiple of 4: pieces keep the whole range's alignment to the blocks of
    4 rows in which BLAS computes a matrix-vector product (rows outside a block may differ in the last
    bit where reports are 8 wide or more)."""
    return max(4, min(CHUNK, CHUNK_VALUES // max(width, 1)) // 4 * 4)


class InMemoryReports:
    """Reports already in memory, an array [n, width] (what `lower_bound` is given)."""

    def __init__(self, reports: np.ndarray):
        self.reports, self.width, self.step = reports, reports.shape[1], _step(reports.shape[1])

    def __len__(self) -> int:
        return len(self.reports)

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.reports[start:stop]


class DrawnReports:
    """`samples` reports of one input of a pair (`which`: "x" or "x_prime"), drawn `step` clients a
    call as their rows are read, and drawn again when read again: the draws are keyed by client, so
    the rows are the same. The last call's reports are kept, for the range that reads on from it."""

    def __init__(self, mechanism: RegisteredMechanism, pair: AuditPair, which: str, samples: int, key: tuple):
        self.mechanism, self.samples, self.key = mechanism, samples, key + (which,)
        self.value, self.label = (pair.x, pair.label_x) if which == "x" else (pair.x_prime, pair.label_x_prime)
        self.width = self._draw(0, 1).shape[1]  # one client's report: how wide a call's rows are
        self.step = _step(self.width)
        self._kept: tuple[int, np.ndarray | None] = (-1, None)

    def __len__(self) -> int:
        return self.samples

    def _draw(self, start: int, stop: int) -> np.ndarray:
        """The reports [stop - start, width] of clients start..stop - 1, in one call."""
        import torch

        from ldpbench.mechanisms.base import DataRelease
        from ldpbench.rng import ClientStreams

        clients = torch.arange(start, stop, dtype=torch.int64)
        streams = ClientStreams(self.key, clients)
        inputs = self.value.to(torch.float32).expand(len(clients), -1).clone()
        if isinstance(self.mechanism, DataRelease):
            released = self.mechanism.release(inputs, torch.full((len(clients),), self.label, dtype=torch.int64),
                                              streams)
            report = torch.cat([released.features.reshape(len(clients), -1).to(torch.float64),
                                released.labels.to(torch.float64).unsqueeze(1)], dim=1)
        else:
            report = self.mechanism.privatize(inputs, streams, self.mechanism.initial_state(len(clients))).reports
        return report.to(torch.float64).numpy()

    def _call(self, index: int) -> np.ndarray:
        if self._kept[0] != index:
            self._kept = (-1, None)  # released before the next call's reports are drawn
            self._kept = (index, self._draw(index * self.step, min((index + 1) * self.step, self.samples)))
        return self._kept[1]

    def rows(self, start: int, stop: int) -> np.ndarray:
        first, last = start // self.step, (stop - 1) // self.step
        if first == last:
            return self._call(first)[start - first * self.step:stop - first * self.step]
        rows = np.empty((stop - start, self.width))
        for index in range(first, last + 1):
            low, high = max(start, index * self.step), min(stop, (index + 1) * self.step)
            rows[low - start:high - start] = self._call(index)[low - index * self.step:high - index * self.step]
        return rows


def _pieces(reports: Reports, start: int, stop: int) -> Iterator[np.ndarray]:
    """Rows start..stop - 1 in pieces of `step` rows counted from start, the last holding the rest: a
    row alone is never a piece (numpy multiplies a one-row matrix by a vector another way than a
    longer one, not bit for bit alike)."""
    edges = [start + k * reports.step for k in range(max(1, (stop - start) // reports.step))] + [stop]
    for low, high in zip(edges, edges[1:]):
        yield reports.rows(low, high)


def _add_rows(total: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
    """`total` plus the column sums of `rows`. numpy sums a 2-D array of several columns over its rows
    (axis 0) one row after the other, so sums of consecutive pieces carried on this way are, bit for
    bit, those of the whole: the streamed first halves' means and variances are the held ones'."""
    return np.add.reduce(rows if total is None else np.concatenate([total[None], rows]), axis=0)


def _direction(w: np.ndarray) -> tuple[str, Projection]:
    """The projection on w, the difference of the first halves' mean reports (on 1 where they agree)."""
    if not np.any(w):  # the first halves' means agree: nothing to project on
        ones = np.ones_like(w)
        return "<y, 1>", lambda reports: reports @ ones
    return "<y, w>", lambda reports: reports @ w


def _coordinates(w: np.ndarray, variance_x: np.ndarray, variance_y: np.ndarray) -> list[tuple[str, Projection]]:
    """The coordinates where the two laws differ most, as directions beside w (a composed report whose
    leak sits in one coordinate, e.g. a label beside many noisy feature bits, is diluted in w)."""
    spread = np.sqrt(variance_x + variance_y)
    separation = np.abs(w) / np.maximum(spread, np.finfo(float).tiny)
    return [(f"y[{j}]", _coordinate(int(j), float(np.sign(w[j]))))
            for j in np.argsort(-separation, kind="stable")[:COORDINATE_DIRECTIONS] if w[j]]


def _coordinate(j: int, sign: float) -> Projection:
    """The projection on coordinate j, signed so that larger values favour x (a column, not a product)."""
    return lambda reports: sign * reports[:, j]


def _sorted(values: np.ndarray) -> np.ndarray:
    values.sort()  # in place: np.sort's algorithm, without its copy
    return values


def _moments(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """rows.mean(axis=0) and rows.var(axis=0) of float64 reports [n, width], bit for bit: compiled
    (ldpbench.numba_moments) where numba is there and rows have two columns or more."""
    from ldpbench.rng import compiled_module

    kernels = compiled_module(NUMBA_MOMENTS) if rows.ndim == 2 and rows.shape[1] > 1 else None
    if kernels is None:
        return rows.mean(axis=0, dtype=np.float64), rows.var(axis=0, dtype=np.float64)
    return kernels.column_moments(np.asarray(rows, dtype=np.float64))


def _held_projections(first_x: np.ndarray, first_y: np.ndarray) -> Iterator[tuple[str, Projection, np.ndarray,
                                                                                np.ndarray]]:
    """Each direction (w, then the coordinates) with the first halves' projections on it, sorted, one
    direction at a time, from the first halves [half, width] in memory."""
    (mean_x, variance_x), (mean_y, variance_y) = _moments(first_x), _moments(first_y)
    w = mean_x - mean_y
    name, project = _direction(w)
    yield name, project, _sorted(project(first_x)), _sorted(project(first_y))
    if np.any(w) and len(w) > 1:
        for name, project in _coordinates(w, variance_x, variance_y):
            yield name, project, _sorted(project(first_x)), _sorted(project(first_y))


def _first_half_pass(reports: Reports, half: int, projections: list[Projection],
                     mean: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """One pass over the first half, piece by piece: its projections [len(projections), half] and, given
    its mean, the column sums of its squared deviations from it (what numpy's var sums)."""
    values, squares, done = np.empty((len(projections), half)), None, 0
    for piece in _pieces(reports, 0, half):
        for row, project in zip(values, projections):
            row[done:done + len(piece)] = project(piece)
        if mean is not None:
            deviations = piece - mean
            squares = _add_rows(squares, np.multiply(deviations, deviations, out=deviations))
        done += len(piece)
    return values, squares


def _streamed_projections(x: Reports, y: Reports, half: int) -> Iterator[tuple[str, Projection, np.ndarray,
                                                                             np.ndarray]]:
    """As _held_projections, the first halves read piece by piece in three passes: their means; their
    variances and projections on w; the chosen coordinates. At most the projections on 8 coordinates,
    8·half values of each input, are held."""
    means = []
    for reports in (x, y):
        total = None
        for piece in _pieces(reports, 0, half):
            total = _add_rows(total, piece)
        means.append(total / half)
    w = means[0] - means[1]
    name, project = _direction(w)
    coordinates_wanted = bool(np.any(w)) and len(w) > 1
    (t_x, squares_x), (t_y, squares_y) = (
        _first_half_pass(reports, half, [project], mean if coordinates_wanted else None)
        for reports, mean in zip((x, y), means))
    yield name, project, _sorted(t_x[0]), _sorted(t_y[0])
    del t_x, t_y  # scored: released before the coordinates' projections are drawn
    if coordinates_wanted:
        coordinates = _coordinates(w, squares_x / half, squares_y / half)
        columns_x, columns_y = (_first_half_pass(reports, half, [project for _, project in coordinates])[0]
                                for reports in (x, y))
        for (name, project), t_x, t_y in zip(coordinates, columns_x, columns_y):
            yield name, project, _sorted(t_x), _sorted(t_y)


def _count(ordered: np.ndarray, side: str, tau: float) -> int:
    """Count of {T > τ} or {T < τ} in a sorted sample, by bisection."""
    if side == ">":
        return len(ordered) - int(np.searchsorted(ordered, tau, side="right"))
    return int(np.searchsorted(ordered, tau, side="left"))


def _hits(reports: Reports, start: int, stop: int, project: Projection, side: str, tau: float) -> int:
    """Count of {T > τ} or {T < τ} among the projections of rows start..stop - 1, piece by piece."""
    beyond = np.greater if side == ">" else np.less
    return sum(int(beyond(project(piece), tau).sum()) for piece in _pieces(reports, start, stop))


def _better_event(best: tuple | None, name: str, project: Projection, t_x: np.ndarray, t_y: np.ndarray,
                  thresholds: list, alpha: float) -> tuple:
    """The best of `best` and the events on one direction, as (first-half bound, name, projection, side,
    τ), from the first halves' sorted projections t_x and t_y; the first of equal bounds is kept
    (directions, then thresholds, in order)."""
    half = len(t_x)
    for hits in thresholds:
        # {T > τ}: rare under x' (its upper tail), {T < τ}: rare under x (its lower tail).
        for side, tau, common, rare in ((">", t_y[-hits], t_x, t_y), ("<", t_x[hits - 1], t_y, t_x)):
            score = _log_ratio(_count(common, side, tau), half, _count(rare, side, tau), half, alpha)
            if best is None or score > best[0]:
                best = (score, name, project, side, tau)
    return best


def bound_of(x: Reports, y: Reports, alpha: float = ALPHA, min_hits: int = MIN_HITS) -> Bound:
    """A lower bound on ε from reports under x and under x' (module docstring), at level alpha, read
    piece by piece: the event is chosen on the first halves' projections, one direction at a time, and
    measured by counting its hits in the second halves, so no more than the first halves (narrow
    reports) or the projections on 8 coordinates (wider ones) are held."""
    half = min(len(x), len(y)) // 2
    thresholds = [hits for hits in np.unique(np.geomspace(min_hits, max(min_hits, half // 2), 40).astype(int))
                  if hits < half]
    if not thresholds:
        return Bound(-math.inf, "none (too few samples)")
    if max(x.width, y.width) <= HELD_WIDTH:
        directions = _held_projections(x.rows(0, half), y.rows(0, half))
    else:
        directions = _streamed_projections(x, y, half)
    best = None
    for name, project, t_x, t_y in directions:
        best = _better_event(best, name, project, t_x, t_y, thresholds, alpha)
        del t_x, t_y  # the next direction's projections replace these rather than join them
    _, name, project, side, tau = best
    hits_x, hits_y = (_hits(reports, half, 2 * half, project, side, tau) for reports in (x, y))
    if side == ">":
        return Bound(_log_ratio(hits_x, half, hits_y, half, alpha), f"{name} > {tau:.6g} (more likely under x)")
    return Bound(_log_ratio(hits_y, half, hits_x, half, alpha), f"{name} < {tau:.6g} (more likely under x')")


def lower_bound(outputs_x: np.ndarray, outputs_y: np.ndarray, alpha: float = ALPHA,
                min_hits: int = MIN_HITS) -> Bound:
    """A lower bound on ε from reports [n, m] under x and under x' (module docstring), at level alpha."""
    return bound_of(InMemoryReports(outputs_x), InMemoryReports(outputs_y), alpha, min_hits)


def random_pairs(dims: int, count: int, seed: int) -> list[AuditPair]:
    """`count` pairs of inputs drawn uniformly from [-1, 1]^dims (a generic search, seeded)."""
    import torch

    from ldpbench.mechanisms.base import AuditPair

    gen = torch.Generator().manual_seed(seed)
    draws = torch.rand(count, 2, dims, generator=gen, dtype=torch.float64) * 2 - 1
    return [AuditPair(f"random {i}", draws[i, 0], draws[i, 1]) for i in range(count)]


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
    """Audit one report of `mechanism` on its own pairs and `random` random ones, at level alpha. Its
    progress (pairs audited, time left) goes to the console and the job's record (ldpbench.progress)."""
    from ldpbench import progress
    from ldpbench.mechanisms.base import DataRelease

    pairs = list(mechanism.audit_pairs())
    if random and not isinstance(mechanism, DataRelease):
        pairs += random_pairs(mechanism.dims, random, seed)
    best, best_pair = Bound(-math.inf, "none"), "none"
    for index, pair in enumerate(pairs):
        key = ("audit", mechanism.name, seed, index)
        bound = bound_of(DrawnReports(mechanism, pair, "x", samples, key),
                         DrawnReports(mechanism, pair, "x_prime", samples, key), alpha / len(pairs))
        if bound.epsilon > best.epsilon:
            best, best_pair = bound, pair.name
        progress.report(index + 1, len(pairs), f"pairs of the audit of {mechanism.name} at ε = {mechanism.epsilon:g}")
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


@dataclass(frozen=True)
class AuditSettings:
    """How a campaign audits (its `audit:` section): what an audit's result depends on besides what is
    audited."""

    samples: int = SAMPLES
    dims: int = DIMS
    alpha: float = ALPHA
    random_pairs: int = RANDOM_PAIRS
    seed: int = 0

    @classmethod
    def from_config(cls, section: dict) -> AuditSettings:
        return cls(**{key: section[key] for key in ("samples", "dims", "alpha", "random_pairs", "seed")})


def audit_environment(settings: AuditSettings, directory) -> str:
    """$LDPBENCH_AUDIT's value for jobs that audit with `settings` into `directory`."""
    import dataclasses

    return json.dumps({"settings": dataclasses.asdict(settings), "directory": str(directory)})


def settings_from_environment() -> tuple[AuditSettings, str] | None:
    """(settings, directory) from $LDPBENCH_AUDIT, or None where the workflow set none (audits off)."""
    import os

    value = os.environ.get(AUDIT_ENV)
    if not value:
        return None
    try:
        described = json.loads(value)
        return AuditSettings(**described["settings"]), str(described["directory"])
    except (ValueError, KeyError, TypeError) as error:
        from ldpbench.errors import LdpbenchError

        raise LdpbenchError(f"${AUDIT_ENV} is not the workflow's audit settings ({error}): {value[:200]!r}") from None


def audited_configurations(summaries: list) -> list[dict]:
    """The distinct private (mechanism, parameters, budget of one report, classes) of the runs whose
    summary files are given: the audit checks what ran, at the budget it ran with."""
    import pyarrow.parquet as pq

    found = {}
    for summary in summaries:
        for row in pq.read_table(summary, columns=RUN_COLUMNS).to_pylist():
            if row["epsilon"] is None or not math.isfinite(row["epsilon"]):
                continue  # a non-private run: nothing to audit
            key = (row["mechanism"], row["mechanism_params"], row["epsilon_per_report"], row["classes"])
            found[key] = {"mechanism": row["mechanism"], "params": json.loads(row["mechanism_params"]),
                          "epsilon": row["epsilon_per_report"], "classes": row["classes"]}
    return [found[key] for key in sorted(found, key=repr)]


def audit_key(configuration: dict, settings: AuditSettings) -> str:
    """The id of one audit: a hash of what is audited and how (its file is audit/<key>.parquet)."""
    import dataclasses
    import hashlib

    described = json.dumps([configuration["mechanism"], configuration["params"], configuration["epsilon"],
                            configuration["classes"], dataclasses.asdict(settings)], sort_keys=True)
    return hashlib.sha256(described.encode("utf-8")).hexdigest()[:16]


def audit_configuration(configuration: dict, settings: AuditSettings) -> AuditResult:
    """Audit one configuration that ran, rebuilt on `settings.dims`-dimensional inputs: a million reports
    of a model's full width would take hours to draw, and every registered mechanism treats coordinates
    alike."""
    from ldpbench import mechanisms

    mechanism = mechanisms.create(configuration["mechanism"], configuration["epsilon"], settings.dims,
                                  configuration["params"], cohort_size=AUDIT_COHORT,
                                  classes=configuration["classes"])
    return audit(mechanism, configuration["params"], samples=settings.samples, random=settings.random_pairs,
                 seed=settings.seed, alpha=settings.alpha)


def cached_audits(configurations: list[dict], directory, settings: AuditSettings,
                  wait: bool = True) -> list[AuditResult]:
    """The audits of `configurations` at `settings`, each computed once and kept in `directory` as
    <audit_key>.parquet (written aside, then renamed).

    Several jobs may need the same audit at once (a mechanism at one ε on two datasets): a lock per
    audit lets one compute it. With `wait` False an audit another process is computing is left to it
    (and missing from the result); with `wait` True this process waits for it.
    """
    import fcntl
    from pathlib import Path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    results = []
    for configuration in configurations:
        path = directory / f"{audit_key(configuration, settings)}.parquet"
        if not path.exists():
            with open(directory / f".{path.stem}.lock", "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                except BlockingIOError:
                    continue
                if not path.exists():
                    write_table(path, [audit_configuration(configuration, settings)])
        results.append(read_results(path)[0])
    return results


def read_results(path) -> list[AuditResult]:
    """The audit results of an audit file."""
    import pyarrow.parquet as pq

    return [AuditResult(**row) for row in pq.read_table(path).to_pylist()]


def defects(results: list[AuditResult]) -> list[str]:
    """The audited configurations whose bound is above their reported worst case, in words."""
    return [f"{result.mechanism} {result.params} at ε = {result.epsilon:g} (audited ≥ "
            f"{result.audited_lower_bound:.4g} > worst case {result.worst_case:.4g})"
            for result in results if result.verdict == DEFECT]


def table_schema():
    """The Arrow schema of an audit table (a configuration's part or tables/audit.parquet): the column
    map's audit table, whose columns are AuditResult's fields (write_table checks it). Written and read
    with it, a table without rows keeps its columns' types, so a campaign with nothing to audit (only
    non-private mechanisms) joins its runs like any other."""
    from ldpbench.results.schema import TABLES

    return TABLES["audit"].schema()


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


def write_table(path, results: list[AuditResult]) -> None:
    """tables/audit.parquet: one row per audited (mechanism, parameters, ε), written atomically."""
    from dataclasses import asdict, fields

    from ldpbench.atomic import write_parquet
    from ldpbench.results.schema import TABLES, check_columns

    check_columns(TABLES["audit"], [field.name for field in fields(AuditResult)])
    write_parquet(path, [asdict(result) for result in results], table_schema())
