"""DiffSketch (Li et al., ../shared/papers/diffsketch.md) and its Laplace baselines; reference §3.

Count sketch (Alg. 1): t rows of k buckets; public pairwise-independent bucket hashes
h_j(i) = ((a_j·i + b_j) mod P) mod k and sign hashes s_j(i) = ±1 from ((c_j·i + e_j) mod P) mod 2,
P = 2^31 − 1, with (a, b, c, e) drawn from a public generator keyed by the mechanism's `hash_seed`
(the same for every client and round, so sketches merge by addition: S(g1) + S(g2) = S(g1 + g2)).
Query: ĝ_i = median_j s_j(i)·S[j][h_j(i)].

A client's report is its (possibly noised) sketch flattened to t·k columns; `aggregate` adds the
cohort's sketches, divides by the number of clients (Alg. 2 step 5: S(v) = (1/m)·ΣS_k) and answers
the median query for the d coordinates of the update. The distributed-SGD form (Alg. 3) and the
FedAvg form (Alg. 4) send the same report, one of a gradient, the other of a model delta: they are
one mechanism here, and the engine decides what the update is.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import FLOAT_BITS, Accounting, Mechanism, Privatized
from ldpbench.mechanisms.registry import register
from ldpbench.rng import ClientStreams
from ldpbench.rng import generator as keyed_generator

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

PRIME = 2**31 - 1


# ------------------------------------------------------------------------------ count sketch
@functools.lru_cache(maxsize=32)
def _hashes(seed: int, rows: int, columns: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = keyed_generator("count sketch hashes", seed, rows, columns)
    a = torch.randint(1, PRIME, (rows, 1), generator=gen, dtype=torch.int64)
    b = torch.randint(0, PRIME, (rows, 1), generator=gen, dtype=torch.int64)
    c = torch.randint(1, PRIME, (rows, 1), generator=gen, dtype=torch.int64)
    e = torch.randint(0, PRIME, (rows, 1), generator=gen, dtype=torch.int64)
    i = torch.arange(length, dtype=torch.int64).unsqueeze(0)
    buckets = ((a * i + b) % PRIME) % columns  # a·i < 2^62: no overflow
    signs = (((c * i + e) % PRIME) % 2) * 2 - 1
    # Flat cell index j·k + h_j(i) into the t·k table.
    cells = buckets + torch.arange(rows, dtype=torch.int64).unsqueeze(1) * columns
    return cells, signs.to(torch.float64)


def count_sketch_hashes(seed: int, rows: int, columns: int, length: int):
    """(cells [t, n], signs [t, n]): cell j·k + h_j(i) and sign s_j(i) of every index i < n.

    The hashes of index i do not depend on n, so a sketch of an extended vector (DiffSketch's
    appended noise) is queried for its first coordinates with the same hashes.
    """
    if length >= PRIME:
        raise ConfigError(f"count sketch: vectors must be shorter than {PRIME}, got {length}")
    return _hashes(seed, rows, columns, length)


def sketch(values: torch.Tensor, seed: int, rows: int, columns: int) -> torch.Tensor:
    """Count sketches [clients, t·k] of the rows of `values` [clients, n] (Alg. 1, encoding).

    index_add_ sums each row's contributions in index order, so a row's table does not depend on
    the other rows of the batch.
    """
    clients, n = values.shape
    cells, signs = count_sketch_hashes(seed, rows, columns, n)
    contributions = (values.unsqueeze(1) * signs.to(values.device, values.dtype)).reshape(clients, rows * n)
    table = torch.zeros(clients, rows * columns, dtype=values.dtype, device=values.device)
    return table.index_add_(1, cells.reshape(-1).to(values.device), contributions)


def median(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Median along `dim`; the mean of the two middle values when the count is even.

    CHOICE: the paper says "median" and uses t = 7 and t = 10; for even t the midpoint is used
    (torch.median would return the lower middle value, a biased choice).
    """
    ordered = values.sort(dim=dim).values
    t = values.shape[dim]
    middle = ordered.narrow(dim, (t - 1) // 2, 1 if t % 2 else 2)
    return middle.mean(dim=dim)


def query(tables: torch.Tensor, seed: int, rows: int, columns: int, length: int) -> torch.Tensor:
    """Median estimates [..., n] of the first n coordinates from sketches [..., t·k] (Alg. 1, query)."""
    cells, signs = count_sketch_hashes(seed, rows, columns, length)
    estimates = tables[..., cells.to(tables.device)] * signs.to(tables.device, tables.dtype)  # [..., t, n]
    return median(estimates, dim=-2)


# ------------------------------------------------------------------------------ Theorem 2
def theorem2_x(alpha, variance, n: int, columns: int):
    """X = α²·k(k−1)·(1 + ln(n−k)) / (σ²·(n−2)); `inf` where the theorem does not apply (n ≤ k, σ² = 0)."""
    alpha = torch.as_tensor(alpha, dtype=torch.float64)
    variance = torch.as_tensor(variance, dtype=torch.float64)
    if n <= max(columns, 2):
        return torch.full_like(alpha, math.inf)
    numerator = alpha**2 * columns * (columns - 1) * (1.0 + math.log(n - columns))
    x = numerator / (variance * (n - 2))
    return torch.where(variance > 0, x, torch.full_like(x, math.inf))


def theorem2_epsilon(alpha, variance, n: int, rows: int, columns: int):
    """Per-client claimed ε of a t×k count sketch of n values (Theorem 2, smallest valid β).

    β must satisfy X ≤ 1/2 − 1/β; the smallest, β = 1/(1/2 − X), gives
    ε = t·ln(1 + β·X) = t·ln(1/(1 − 2X)). Valid only for X < 1/2, `inf` otherwise.
    """
    x = theorem2_x(alpha, variance, n, columns)
    valid = x < 0.5
    safe = torch.where(valid, x, torch.zeros_like(x))
    return torch.where(valid, -rows * torch.log1p(-2.0 * safe), torch.full_like(x, math.inf))


def percentile(values: torch.Tensor, q: float) -> torch.Tensor:
    """Per-row q-quantile with linear interpolation (numpy's default), by sorting each row."""
    ordered = values.sort(dim=-1).values
    position = q * (values.shape[-1] - 1)
    low = math.floor(position)
    high = min(low + 1, values.shape[-1] - 1)
    weight = position - low
    return ordered[..., low] * (1 - weight) + ordered[..., high] * weight


def gradient_statistics(updates: torch.Tensor, quantile: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
    """(α, σ²) per client: α = the 90th percentile of |g| (App. C.1), σ² the variance of g's entries.

    CHOICE: σ² is the population variance about the row's mean (Assumption 1 takes g_i ~ N(0, σ²);
    the mean of a gradient is close to 0 and subtracting it is the conservative estimate).
    """
    return percentile(updates.abs(), quantile), updates.var(dim=1, correction=0)


def laplace_noise(streams: ClientStreams, shape, scale: torch.Tensor, dtype) -> torch.Tensor:
    """Laplace(0, scale) by the inverse CDF of one uniform per entry; `scale` [clients, 1]."""
    return streams.laplace(shape, torch.float64).mul_(scale.to(torch.float64)).to(dtype)


def error_correct(estimate: torch.Tensor, local: torch.Tensor, fraction: float) -> torch.Tensor:
    """App. C.1 error correction: each worker zeroes the `fraction` of the queried coordinates
    whose estimate is farthest from its own local update. estimate [dims], local [clients, dims]."""
    gap = (estimate.unsqueeze(0) - local).abs()
    drop = round(fraction * estimate.shape[-1])
    corrected = estimate.expand_as(local).clone()
    if drop > 0:
        worst = gap.topk(drop, dim=1).indices
        corrected.scatter_(1, worst, 0.0)
    return corrected


LAPLACE_NORMS = ("l1", "linf")


def clip_to_ball(updates: torch.Tensor, clip: float, norm: str) -> torch.Tensor:
    """Each row moved into the ℓ1 ball of radius `clip` (scaled down) or into [−clip, clip]^d (clamped)."""
    if norm == "linf":
        return updates.clamp(-clip, clip)
    norms = updates.abs().sum(dim=1, keepdim=True)
    return updates * (clip / norms.clamp_min(clip))


def clipped_l1_radius(clip: float, norm: str, dims: int) -> float:
    """The largest ℓ1 norm of a clipped update: clip (ℓ1 ball) or clip·d (ℓ∞ ball). Two clipped
    updates are at most twice this apart in L1, the sensitivity the Laplace noise must cover."""
    return clip * (1 if norm == "l1" else dims)


# ------------------------------------------------------------------------------ mechanisms
@dataclass(frozen=True)
class SketchMechanism(Mechanism):
    """Shared fields and server side of the sketch mechanisms: report = t·k table, median decoding."""

    epsilon: float
    dims: int
    rows: int = 7
    columns: int = 22
    hash_seed: int = 0
    error_correction: bool = False
    correction_fraction: float = 0.5

    def _check_sketch(self) -> None:
        self._check_common()
        if not (isinstance(self.rows, int) and self.rows >= 1 and isinstance(self.columns, int) and self.columns >= 2):
            raise ConfigError(f"mechanism '{self.name}': need integer rows >= 1 and columns >= 2, "
                              f"got rows={self.rows!r}, columns={self.columns!r}")
        if not 0.0 <= self.correction_fraction < 1.0:
            raise ConfigError(f"mechanism '{self.name}': correction_fraction must be in [0, 1), "
                              f"got {self.correction_fraction!r}")

    @property
    def report_dims(self) -> int:
        return self.rows * self.columns

    def sketch(self, values: torch.Tensor) -> torch.Tensor:
        return sketch(values, self.hash_seed, self.rows, self.columns)

    def aggregate(self, reports: torch.Tensor) -> torch.Tensor:
        """Merge by addition, divide by the number of clients, median query of the d coordinates."""
        merged = reports.sum(dim=0) / reports.shape[0]
        return query(merged, self.hash_seed, self.rows, self.columns, self.dims)

    def correct(self, estimate: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        if not self.error_correction:
            return super().correct(estimate, local)
        return error_correct(estimate, local, self.correction_fraction)


@register
@dataclass(frozen=True)
class DiffSketch(SketchMechanism):
    """DiffSketch (Alg. 2–4): a count sketch whose own randomness is claimed private (Theorem 2).

    Per client: α = 90th percentile of |g|, σ² = variance of g, X = α²k(k−1)(1+ln(n−k))/(σ²(n−2)),
    claimed ε_client = t·ln(1/(1−2X)) when X < 1/2 (Theorem 2 with the smallest valid β).
    Validation (Alg. 2 step 4): if X ≥ 1/2 or ε_client > ε, Laplace noise of scale 2α·t/ε is added
    to every cell (CHOICE of the reference: L1 sensitivity 2α·t of the sketch between inputs that
    differ in one coordinate, each bounded by α: the paper's Definition 1 neighbours, not any two
    updates, which can move the sketch by 2α·d·t).

    Appendix C flags: `append_noise` appends round(append_ratio·n) values drawn from N(0, σ²) (the
    gradient's σ) before sketching, so Theorem 2 is applied with n + n' (CHOICE: α and σ² stay the
    gradient's; the paper does not say how many values it appends, append_ratio = 1 doubles n);
    `error_correction` makes `correct` zero, for each worker, the `correction_fraction` (= 1/2) of
    the queried coordinates farthest from its own latest update (distributed SGD only; the engine
    must call `correct` for it to have an effect).

    Accounting. The claim per report is the target ε: every report meets it, by Theorem 2 (then its
    own ε_client ≤ ε, available from `client_epsilon`) or by the added noise. The worst case is
    `inf`: without noise a sketch is a deterministic function of the input, and the noise that is
    added is calibrated to the data-dependent α, so no input domain gives it a finite bound.
    Theorem 2 itself rests on a Gaussian assumption about the input and holds "with high
    probability"; the paper's footnote 1 says its proof has known issues.
    """

    name = "diffsketch"
    description = "DiffSketch: count sketch with Theorem-2 claimed ε, Laplace noise only when the claim fails"

    append_noise: bool = False
    append_ratio: float = 1.0

    def __post_init__(self) -> None:
        self._check_sketch()
        if not self.append_ratio >= 0:
            raise ConfigError(f"mechanism '{self.name}': append_ratio must be >= 0, got {self.append_ratio!r}")

    @property
    def appended(self) -> int:
        return round(self.append_ratio * self.dims) if self.append_noise else 0

    def client_epsilon(self, updates: torch.Tensor) -> torch.Tensor:
        """Theorem 2's ε [clients] of each client's sketch (`inf` where the theorem does not apply)."""
        alpha, variance = gradient_statistics(updates)
        return theorem2_epsilon(alpha, variance, self.dims + self.appended, self.rows, self.columns)

    def noised(self, updates: torch.Tensor) -> torch.Tensor:
        """Which clients' sketches get Laplace noise: the claim fails or exceeds the target."""
        return ~(self.client_epsilon(updates) <= self.epsilon)

    def privatize(self, updates, streams, state=None) -> Privatized:
        clients = updates.shape[0]
        alpha, variance = gradient_statistics(updates)
        claimed = theorem2_epsilon(alpha, variance, self.dims + self.appended, self.rows, self.columns)
        values = updates
        if self.appended:
            noise = streams.randn((clients, self.appended), torch.float64) * variance.sqrt().unsqueeze(1)
            values = torch.cat([updates, noise.to(updates.dtype)], dim=1)
        tables = self.sketch(values)
        # Drawn for every client (the sequence of draws may not depend on the data), used where needed.
        scale = torch.where(~(claimed <= self.epsilon), 2.0 * alpha.to(torch.float64) * self.rows / self.epsilon, 0.0)
        # In place: the sketch's tables are this call's own (a fresh tensor, sketch()).
        return Privatized(tables.add_(laplace_noise(streams, tables.shape, scale.unsqueeze(1), tables.dtype)), None)

    def accounting(self) -> Accounting:
        return Accounting(self.epsilon, math.inf, FLOAT_BITS * self.report_dims)


@register
@dataclass(frozen=True)
class SketchLaplace(SketchMechanism):
    """Baseline of DiffSketch §5.2: a count sketch with Laplace noise added at every round.

    With `clip` = B > 0 the update is clipped to the ℓ1 ball of radius B (`norm: l1`, default) or
    to [−B, B]^d (`norm: linf`). A t-row count sketch is linear with ‖S(v)‖₁ ≤ t·‖v‖₁, so two
    clipped updates move it by at most 2B·t (ℓ1) or 2B·d·t (ℓ∞) in L1, and noise of scale
    2B·t/ε (ℓ∞: 2B·d·t/ε) per cell makes the report ε-LDP (worst case = ε). With clip = 0
    (default, the paper's comparison), the scale is 2α·t/ε, α the client's 90th percentile of |g|
    as in DiffSketch's validation: it covers inputs that differ in one coordinate bounded by α
    (the paper's neighbours), and the worst case is `inf` (data-dependent scale, nothing clipped).
    """

    name = "sketch-laplace"
    description = "count sketch with Laplace noise (scale 2·B·t/ε) at every round"

    clip: float = 0.0
    norm: str = "l1"

    def __post_init__(self) -> None:
        self._check_sketch()
        if not self.clip >= 0:
            raise ConfigError(f"mechanism '{self.name}': clip must be >= 0, got {self.clip!r}")
        if self.norm not in LAPLACE_NORMS:
            raise ConfigError(f"mechanism '{self.name}': norm must be one of {LAPLACE_NORMS}, got {self.norm!r}")

    def privatize(self, updates, streams, state=None) -> Privatized:
        if self.clip > 0:
            values = clip_to_ball(updates, self.clip, self.norm)
            radius = clipped_l1_radius(self.clip, self.norm, self.dims)
            bound = torch.full((updates.shape[0],), radius, dtype=torch.float64, device=updates.device)
        else:
            values, bound = updates, gradient_statistics(updates)[0].to(torch.float64)
        tables = self.sketch(values)
        scale = (2.0 * bound * self.rows / self.epsilon).unsqueeze(1)
        return Privatized(tables.add_(laplace_noise(streams, tables.shape, scale, tables.dtype)), None)

    def accounting(self) -> Accounting:
        worst = self.epsilon if self.clip > 0 else math.inf
        return Accounting(self.epsilon, worst, FLOAT_BITS * self.report_dims)


@register
@dataclass(frozen=True)
class LaplaceRaw(Mechanism):
    """Baseline of DiffSketch §5.2: Laplace noise on the raw (clipped) update, every coordinate sent.

    norm = "l1" (default): the update is scaled into the ℓ1 ball of radius `clip`, L1 sensitivity
    2·clip, noise Lap(2·clip/ε) per coordinate. norm = "linf": each coordinate is clipped to
    [−clip, clip], L1 sensitivity 2·clip·d, noise Lap(2·clip·d/ε). Either way the report is
    ε-LDP over its clipped domain (claimed = worst case = ε); Var = 2·scale² per coordinate.
    CHOICE: the paper does not say how it bounds the raw gradient; both readings are offered.
    """

    name = "laplace-raw"
    description = "Laplace noise on the whole clipped update (ℓ1 or ℓ∞ clipping)"

    epsilon: float
    dims: int
    clip: float = 1.0
    norm: str = "l1"

    def __post_init__(self) -> None:
        self._check_common()
        if not self.clip > 0:
            raise ConfigError(f"mechanism '{self.name}': clip must be > 0, got {self.clip!r}")
        if self.norm not in LAPLACE_NORMS:
            raise ConfigError(f"mechanism '{self.name}': norm must be one of {LAPLACE_NORMS}, got {self.norm!r}")

    @property
    def scale(self) -> float:
        return 2.0 * clipped_l1_radius(self.clip, self.norm, self.dims) / self.epsilon

    def clipped(self, updates: torch.Tensor) -> torch.Tensor:
        return clip_to_ball(updates, self.clip, self.norm)

    def privatize(self, updates, streams, state=None) -> Privatized:
        scale = torch.full((updates.shape[0], 1), self.scale, dtype=torch.float64, device=updates.device)
        return Privatized(self.clipped(updates) + laplace_noise(streams, updates.shape, scale, updates.dtype), None)

    def accounting(self) -> Accounting:
        return Accounting(self.epsilon, self.epsilon, FLOAT_BITS * self.dims)


@register
@dataclass(frozen=True)
class NoiselessSketch(SketchMechanism):
    """Non-private reference of DiffSketch: the same t×k count sketch and median decoding, never
    noised, so a campaign can tell what the sketch's compression costs from what its privacy costs.
    Like NP it runs once per seed (no ε) and its claimed and worst-case ε are infinite."""

    name = "np-sketch"
    description = "non-private reference: the count sketch alone (DiffSketch without noise)"
    private = False

    def __post_init__(self) -> None:
        self._check_sketch()

    def privatize(self, updates, streams, state=None) -> Privatized:
        return Privatized(self.sketch(updates), None)

    def accounting(self) -> Accounting:
        return Accounting(math.inf, math.inf, FLOAT_BITS * self.report_dims)
