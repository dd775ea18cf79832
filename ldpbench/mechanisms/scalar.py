"""Scalar value perturbation on [-1, 1], the flat multi-dimensional sampling wrapper, and NP baselines.

References: ../shared/reference/mechanisms.md §1; Wang et al., ICDE 2019 (Piecewise, Hybrid,
Algorithm 4 sampling); Duchi et al. 2018; Zhao et al. 2020 (Three-Outputs, PM-SUB).

Each scalar perturber is described once (a `ScalarPerturber`: sampler, exact variance and exact
output law) and is used both by the flat baselines registered here and by FedSel's value stage.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ldpbench import rng
from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import FLOAT_BITS, Accounting, Mechanism, Privatized, index_bits
from ldpbench.mechanisms.registry import register
from ldpbench.rng import ClientStreams

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())


# ------------------------------------------------------------------ centre-and-tails family (PM, PM-SUB)
@dataclass(frozen=True)
class CentreTails:
    """Uniform on [left, right] with probability p_centre, else uniform on [-bound, left) ∪ (right, bound]."""

    left: torch.Tensor | np.ndarray | float
    right: torch.Tensor | np.ndarray | float
    bound: float
    p_centre: float

    def sample(self, streams: ClientStreams, like: torch.Tensor) -> torch.Tensor:
        u_central, position = streams.rand_many(2, like.shape, like.dtype)
        central = u_central < self.p_centre
        inside = self.left + (self.right - self.left) * position
        # A point on the tails: walk a distance t from -bound, skipping the central interval.
        tails = 2 * self.bound - (self.right - self.left)
        t = position * tails
        left_tail = self.left + self.bound
        outside = torch.where(t < left_tail, -self.bound + t, self.right + (t - left_tail))
        return torch.where(central, inside, outside)

    def second_moment(self):
        l, r, a = self.left, self.right, self.bound
        centre = (l * l + l * r + r * r) / 3
        tails = (l**3 + a**3 + a**3 - r**3) / (3 * (2 * a - (r - l)))
        return self.p_centre * centre + (1 - self.p_centre) * tails

    def density(self, y):
        """Output density at y (array), for the analytic density-ratio checks."""
        tails = 2 * self.bound - (self.right - self.left)
        inside = (y >= self.left) & (y <= self.right)
        return np.where(inside, self.p_centre / (self.right - self.left), (1 - self.p_centre) / tails)


def pm_law(x, epsilon: float) -> CentreTails:
    """Piecewise mechanism: z = e^{ε/2}, C = (z+1)/(z−1), centre [l(x), l(x)+C−1] with prob z/(z+1)."""
    z = math.exp(epsilon / 2.0)
    c = (z + 1.0) / (z - 1.0)
    left = (c + 1.0) / 2.0 * x - (c - 1.0) / 2.0
    return CentreTails(left, left + c - 1.0, c, z / (z + 1.0))


def pm_sub_law(x, epsilon: float) -> CentreTails:
    """PM-SUB (Zhao et al. 2020): t = e^{ε/3}, centre [L, R] with prob e^ε/(t+e^ε) on [−A, A]."""
    e, t = math.exp(epsilon), math.exp(epsilon / 3.0)
    scale = (e + t) / (t * (e - 1.0))
    return CentreTails(scale * (x * t - 1.0), scale * (x * t + 1.0), scale * (t + 1.0), e / (t + e))


def piecewise(x: torch.Tensor, epsilon: float, streams: ClientStreams) -> torch.Tensor:
    """PM: an unbiased ε-LDP estimate of each entry of x ∈ [-1, 1]."""
    fused = FUSED_PM.sample(x, epsilon, streams)
    return fused if fused is not None else pm_law(x, epsilon).sample(streams, x)


# ------------------------------------------------------------------ the compiled perturbers
NUMBA_PERTURBERS = "ldpbench.mechanisms.numba_perturbers"  # loaded on demand (rng.compiled_module)


@dataclass(frozen=True)
class FusedSampler:
    """A perturber compiled into one pass (ldpbench.mechanisms.numba_perturbers), with the torch path's bits.

    `kernel` names the kernel, `draws` is how many keyed draws one torch sample() makes, and
    `constants(ε)` gives the kernel's numbers. It applies to large float32 CPU inputs
    (rng.speed) when numba is importable; elsewhere the torch code runs.
    """

    kernel: str
    draws: int
    constants: Callable[[float], tuple]

    def _compiled(self, x: torch.Tensor, streams: ClientStreams):
        if (x.dtype != torch.float32 or x.device.type != "cpu" or streams.device.type != "cpu"
                or not rng.speed.compiled_for(x.numel()) or x.dim() == 0 or x.shape[0] != streams.count
                or type(streams).rand is not ClientStreams.rand):  # streams that draw otherwise (tests' edges)
            return None
        module = rng.compiled_module(NUMBA_PERTURBERS)
        return None if module is None else getattr(module, self.kernel)

    def sample(self, x: torch.Tensor, epsilon: float, streams: ClientStreams) -> torch.Tensor | None:
        """The torch sample(x, ε, streams), or None where the kernel does not apply."""
        kernel = self._compiled(x, streams)
        if kernel is None:
            return None
        rows = x.reshape(streams.count, -1)
        return self._run(kernel, rows, math.inf, epsilon, streams, rows.shape[1]).reshape(x.shape)

    def clamp_and_sample_blocks(self, x: torch.Tensor, epsilon: float, streams: ClientStreams,
                                width: int) -> torch.Tensor | None:
        """x clamped to [-1, 1], then the torch sample() on each block of `width` columns in turn.

        None where the kernel does not apply to 2-D x.
        """
        kernel = self._compiled(x, streams) if x.dim() == 2 else None
        return None if kernel is None else self._run(kernel, x, 1.0, epsilon, streams, width)

    def _run(self, kernel, x: torch.Tensor, limit: float, epsilon: float, streams: ClientStreams,
             width: int) -> torch.Tensor:
        """kernel on 2-D x: clamped to ±limit, sampled in blocks of `width` columns, into a new tensor."""
        columns = x.shape[1]
        bases = [streams.call_bases((streams.count, min(width, columns - start)), self.draws)
                 for start in range(0, columns, width)]
        bases = bases[0][np.newaxis] if len(bases) == 1 else np.stack(bases)  # one block: no copy
        # numpy's allocation (huge pages for large arrays) faults in a fresh output at half torch's cost.
        out = np.empty(x.shape, dtype=np.float32)
        kernel(x.detach().numpy(), np.float32(limit), bases, width, *self.constants(epsilon), out)
        return torch.from_numpy(out)


def _float32(*values: float) -> tuple:
    """Python floats as the float32 torch rounds them to before an elementwise float32 operation."""
    return tuple(np.float32(value) for value in values)


@functools.cache  # pure in ε; a small round's fused sample is a few µs
def pm_constants(epsilon: float) -> tuple:
    """pm_law's numbers in the order numba_perturbers._piecewise takes them."""
    z = math.exp(epsilon / 2.0)
    c = (z + 1.0) / (z - 1.0)
    return _float32((c + 1.0) / 2.0, (c - 1.0) / 2.0, c, 1.0, -c, 2 * c, z / (z + 1.0))


@functools.cache
def duchi_constants(epsilon: float) -> tuple:
    """duchi_pmf's numbers in the order numba_perturbers._duchi takes them."""
    e, b = math.exp(epsilon), duchi_bound(epsilon)
    return _float32(e - 1.0, 2.0 * (e + 1.0), 0.5, 1.0, -b, b)


FUSED_PM = FusedSampler("piecewise_float32", 2, lambda epsilon: (pm_constants(epsilon),))
FUSED_DUCHI = FusedSampler("duchi_float32", 1, lambda epsilon: (duchi_constants(epsilon),))
FUSED_HM = FusedSampler(
    "hybrid_float32", 4,
    lambda epsilon: (np.float32(hybrid_pm_weight(epsilon)), pm_constants(epsilon), duchi_constants(epsilon)),
)


def piecewise_variance(x, epsilon: float):
    """Var[PM(x)] = x²/(z−1) + (z+3)/(3(z−1)²), z = e^{ε/2}."""
    z = math.exp(epsilon / 2.0)
    return x * x / (z - 1.0) + (z + 3.0) / (3.0 * (z - 1.0) ** 2)


def piecewise_bound(epsilon: float) -> float:
    z = math.exp(epsilon / 2.0)
    return (z + 1.0) / (z - 1.0)


# ------------------------------------------------------------------ discrete laws (Duchi, Three-Outputs)
def duchi_bound(epsilon: float) -> float:
    return (math.exp(epsilon) + 1.0) / (math.exp(epsilon) - 1.0)


def duchi_pmf(x, epsilon: float):
    """Outputs (−B, +B) and their probabilities; P(+B) = 1/2 + x(e^ε−1)/(2(e^ε+1))."""
    e = math.exp(epsilon)
    p_plus = 0.5 + x * (e - 1.0) / (2.0 * (e + 1.0))
    b = duchi_bound(epsilon)
    return (-b, b), (1.0 - p_plus, p_plus)


def three_outputs_p0(epsilon: float) -> float:
    """P0 of Three-Outputs (reference §1): 0 below ln 2, the cubic root up to ln((3+√65)/2), then e^ε/(e^ε+2)."""
    e = math.exp(epsilon)
    if epsilon < math.log(2.0):
        return 0.0
    if epsilon <= math.log((3.0 + math.sqrt(65.0)) / 2.0):
        d0 = e**4 + 14 * e**3 + 50 * e**2 - 2 * e + 25
        d1 = -2 * e**6 - 42 * e**5 - 270 * e**4 - 404 * e**3 - 918 * e**2 + 30 * e - 250
        angle = math.pi / 3 + math.acos(max(-1.0, min(1.0, -d1 / (2 * d0**1.5)))) / 3
        return -(-e * e - 4 * e - 5 + 2 * math.sqrt(d0) * math.cos(angle)) / 6
    return e / (e + 2.0)


def three_outputs_bound(epsilon: float) -> float:
    e, p0 = math.exp(epsilon), three_outputs_p0(epsilon)
    return (e + 1.0) / ((e - 1.0) * (1.0 - p0 / e))


def _where(condition, a, b):
    """Elementwise choice for Python floats, NumPy arrays and tensors alike."""
    if isinstance(condition, torch.Tensor):
        return torch.where(condition, a, b)
    if isinstance(condition, np.ndarray):
        return np.where(condition, a, b)
    return a if condition else b


def three_outputs_pmf(x, epsilon: float):
    """Outputs (−C, 0, C) and their probabilities at x (mirrored for x < 0)."""
    e, p0 = math.exp(epsilon), three_outputs_p0(epsilon)
    c = three_outputs_bound(epsilon)
    magnitude = abs(x)
    p_same = (1 - p0) / 2 + ((e - p0) / (e + 1) - (1 - p0) / 2) * magnitude
    p_zero = p0 + (p0 / e - p0) * magnitude
    p_other = 1 - p_same - p_zero
    positive = x >= 0
    return (-c, 0.0, c), (_where(positive, p_other, p_same), p_zero, _where(positive, p_same, p_other))


def _sample_discrete(outputs, probabilities, streams, like: torch.Tensor) -> torch.Tensor:
    u = streams.rand(like.shape, like.dtype)
    result = torch.full_like(like, outputs[-1])
    cumulative = torch.zeros_like(like)
    for value, p in zip(outputs[:-1], probabilities[:-1]):
        upper = cumulative + p
        result = torch.where((u >= cumulative) & (u < upper), torch.as_tensor(value, dtype=like.dtype), result)
        cumulative = upper
    return result


# ------------------------------------------------------------------ the perturber table
HYBRID_THRESHOLD = 0.6094  # ε* of Wang et al. (0.61 rounded)


def hybrid_pm_weight(epsilon: float) -> float:
    return 1.0 - math.exp(-epsilon / 2.0) if epsilon > HYBRID_THRESHOLD else 0.0


def _laplace(x, epsilon, streams):
    return x + (2.0 / epsilon) * streams.laplace(x.shape, x.dtype)


def _duchi(x, epsilon, streams):
    fused = FUSED_DUCHI.sample(x, epsilon, streams)
    if fused is not None:
        return fused
    outputs, probabilities = duchi_pmf(x, epsilon)
    return _sample_discrete(outputs, probabilities, streams, x)


def _three_outputs(x, epsilon, streams):
    outputs, probabilities = three_outputs_pmf(x, epsilon)
    return _sample_discrete(outputs, probabilities, streams, x)


def _hybrid(x, epsilon, streams):
    fused = FUSED_HM.sample(x, epsilon, streams)
    if fused is not None:
        return fused
    use_pm = streams.rand(x.shape, x.dtype) < hybrid_pm_weight(epsilon)
    return torch.where(use_pm, piecewise(x, epsilon, streams), _duchi(x, epsilon, streams))


def _pm_sub(x, epsilon, streams):
    return pm_sub_law(x, epsilon).sample(streams, x)


@dataclass(frozen=True)
class ScalarPerturber:
    """An unbiased ε-LDP perturbation of a value in [-1, 1]; `variance(x, ε)` is exact."""

    name: str
    label: str
    sample: Callable[[torch.Tensor, float, torch.Generator], torch.Tensor]
    variance: Callable[[float, float], float]
    value_bits: Callable[[float], float]  # bits to send one perturbed value
    pmf: Callable | None = None  # discrete perturbers: x, ε -> (outputs, probabilities)
    density: Callable | None = None  # continuous perturbers without atoms: (y, x, ε) -> density
    fused: FusedSampler | None = None  # its compiled form, for many columns at once

    def clamp_and_sample_blocks(self, x: torch.Tensor, epsilon: float, streams: ClientStreams,
                                width: int) -> torch.Tensor:
        """2-D x clamped to [-1, 1], then sample() on each block of `width` columns in turn.

        Fixed-width blocks make the draws depend on neither the device nor the chunk of clients, and
        keep the torch path's temporaries in cache; the compiled form does it all in one pass.
        """
        fused = None if self.fused is None else self.fused.clamp_and_sample_blocks(x, epsilon, streams, width)
        if fused is not None:
            return fused
        values = x.clamp(-1.0, 1.0)
        for start in range(0, values.shape[1], width):
            block = values[:, start:start + width]
            block.copy_(self.sample(block, epsilon, streams))
        return values


SCALAR_PERTURBERS: dict[str, ScalarPerturber] = {
    p.name: p
    for p in (
        ScalarPerturber(
            "laplace", "Laplace", _laplace, lambda x, e: 8.0 / e**2, lambda e: FLOAT_BITS,
            density=lambda y, x, e: (e / 4.0) * np.exp(-np.abs(y - x) * e / 2.0),
        ),
        ScalarPerturber(
            "duchi", "Duchi", _duchi, lambda x, e: duchi_bound(e) ** 2 - x * x, lambda e: 1,
            pmf=duchi_pmf, fused=FUSED_DUCHI,
        ),
        ScalarPerturber(
            "pm", "Piecewise", piecewise, piecewise_variance, lambda e: FLOAT_BITS,
            density=lambda y, x, e: pm_law(x, e).density(y), fused=FUSED_PM,
        ),
        ScalarPerturber(
            "hm", "Hybrid", _hybrid,
            lambda x, e: hybrid_pm_weight(e) * piecewise_variance(x, e)
            + (1 - hybrid_pm_weight(e)) * (duchi_bound(e) ** 2 - x * x),
            # Atoms at ±B (Duchi part) need a flag bit beside the float.
            lambda e: FLOAT_BITS + 1 if hybrid_pm_weight(e) > 0 else 1, fused=FUSED_HM,
        ),
        ScalarPerturber(
            "three-outputs", "Three-Outputs", _three_outputs,
            lambda x, e: three_outputs_bound(e) ** 2 * (1 - three_outputs_pmf(x, e)[1][1]) - x * x,
            lambda e: 2, pmf=three_outputs_pmf,
        ),
        ScalarPerturber(
            "pm-sub", "PM-SUB", _pm_sub,
            lambda x, e: float(pm_sub_law(x, e).second_moment()) - x * x, lambda e: FLOAT_BITS,
            density=lambda y, x, e: pm_sub_law(x, e).density(y),
        ),
    )
}


def get_perturber(name: str) -> ScalarPerturber:
    try:
        return SCALAR_PERTURBERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown value perturber '{name}'; known: {', '.join(sorted(SCALAR_PERTURBERS))}"
        ) from None


def load_compiled_kernels() -> bool:
    """Import the compiled draw and perturbers, load their machine code (numba loads it, or compiles
    it on a new installation, at each kernel's first call) and let every later CPU draw of this
    process and of the processes it forks use them (rng.speed.every_draw).

    A preload step of the warm worker, right after what the cells import: its jobs then draw a linear
    model's small rounds compiled, the same values faster, without each paying numba's load (most of a
    second). False, with nothing changed, where numba is missing.
    """
    if any(rng.compiled_module(name) is None for name in (rng.NUMBA_DRAWS, NUMBA_PERTURBERS)):
        return False
    rng.speed.every_draw = True
    try:
        streams = ClientStreams(("load compiled kernels",), 1)
        for dtype in (torch.float32, torch.float64):
            streams.rand((1, 1), dtype)
            streams.laplace((1, 1), dtype)
        for perturber in SCALAR_PERTURBERS.values():
            if perturber.fused is not None:  # the anonymizer's blocks call the same kernel, same types
                perturber.sample(torch.zeros(1, 1), 1.0, streams)
    except BaseException:  # a kernel that does not compile: small draws stay in numpy and torch
        rng.speed.every_draw = False
        raise
    return True


# ------------------------------------------------------------------ flat sampling wrapper
def flat_sample_size(epsilon: float, dims: int) -> int:
    """Wang et al. Alg. 4: k = max(1, min(d, floor(ε/2.5))) coordinates per report."""
    return max(1, min(dims, math.floor(epsilon / 2.5)))


ANONYMIZER_BLOCK_COLUMNS = 4096


def sample_coordinates(clients: int, dims: int, k: int, streams: ClientStreams) -> torch.Tensor:
    """k distinct coordinates per client, uniformly: [clients, k] indices (those of the k largest of
    uniform keys, largest first)."""
    if k == 1:
        return streams.randint(dims, (clients, 1))
    return top_k_indices(streams.rand((clients, dims)), k)


def top_k_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """values.topk(k, dim=1).indices of a [rows, n] tensor without NaN. Large CPU inputs take the
    compiled top_k (rng.speed); a row with a tie among its k + 1 largest takes topk itself, which
    breaks ties its own way, so the indices are topk's in every case."""
    module = (rng.compiled_module(NUMBA_PERTURBERS)
              if values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64)
              and values.dim() == 2 and 0 < k <= values.shape[1] and rng.speed.compiled_for(values.numel())
              else None)
    if module is None:
        return values.topk(k, dim=1).indices
    rows = values.detach().contiguous().numpy()
    indices, tied = np.empty((rows.shape[0], k), dtype=np.int64), np.empty(rows.shape[0], dtype=np.bool_)
    module.top_k(rows, k, indices, tied)
    chosen = torch.from_numpy(indices)
    if tied.any():
        ties = torch.from_numpy(np.flatnonzero(tied))
        chosen[ties] = values[ties].topk(k, dim=1).indices
    return chosen


class FlatSampling(Mechanism):
    """Flat baseline: sample k of d coordinates, perturb each with ε/k, scale by d/k (unbiased).

    Each coordinate is clipped to [-1, 1] first. Guarantee: ε-LDP per report (k values of ε/k on
    coordinates chosen independently of the data), so claimed and worst-case ε coincide.
    With `anonymizer: true` (the accounting BitRand App. L gives its baselines on gradients, after
    LDP-FL): every coordinate is perturbed with the whole ε and not scaled, as if an anonymizer
    unlinked the coordinates; the claim is ε per report with no composition over dimensions or
    rounds, and the worst case of the report is d·ε, composed over rounds.
    """

    perturber_name: str
    anonymizer: bool = False

    def __post_init__(self) -> None:
        self._check_common()
        if not isinstance(self.anonymizer, bool):
            raise ConfigError(f"mechanism '{self.name}': anonymizer must be true or false, got {self.anonymizer!r}")

    @property
    def perturber(self) -> ScalarPerturber:
        return SCALAR_PERTURBERS[self.perturber_name]

    @property
    def k(self) -> int:
        """Coordinates perturbed per report."""
        return self.dims if self.anonymizer else flat_sample_size(self.epsilon, self.dims)

    @property
    def epsilon_coordinate(self) -> float:
        return self.epsilon if self.anonymizer else self.epsilon / self.k

    def privatize(self, updates, streams, state=None) -> Privatized:
        if self.anonymizer:
            noisy = self.perturber.clamp_and_sample_blocks(updates, self.epsilon, streams, ANONYMIZER_BLOCK_COLUMNS)
            return Privatized(noisy, None)
        clients, dims = updates.shape
        k = self.k
        chosen = sample_coordinates(clients, dims, k, streams)
        values = updates.gather(1, chosen).clamp(-1.0, 1.0)
        noisy = self.perturber.sample(values, self.epsilon / k, streams) * (dims / k)
        return Privatized(torch.zeros_like(updates).scatter_(1, chosen, noisy), None)

    def accounting(self) -> Accounting:
        value_bits = self.perturber.value_bits(self.epsilon_coordinate)
        if self.anonymizer:  # all d values, in coordinate order: no indices
            return Accounting(self.epsilon, self.dims * self.epsilon, self.dims * value_bits, claimed_composes=False)
        return Accounting(self.epsilon, self.epsilon, self.k * (value_bits + index_bits(self.dims)))


def _register_flat(perturber: ScalarPerturber) -> type[FlatSampling]:
    cls = type(
        f"Flat{perturber.label.replace('-', '')}",
        (FlatSampling,),
        {
            "__annotations__": {"epsilon": float, "dims": int, "anonymizer": bool},
            "anonymizer": False,
            "name": perturber.name,
            "description": f"flat {perturber.label} with Wang et al. Alg. 4 coordinate sampling "
                           "(optional anonymizer accounting)",
            "perturber_name": perturber.name,
            "__doc__": FlatSampling.__doc__,
            "__module__": __name__,
        },
    )
    return register(dataclass(frozen=True)(cls))


FLAT_MECHANISMS = {name: _register_flat(p) for name, p in SCALAR_PERTURBERS.items()}


# ------------------------------------------------------------------ non-private baselines
@dataclass(frozen=True)
class NonPrivate(Mechanism):
    """Base of the non-private references: no privacy, so claimed and worst-case ε are infinite."""

    private = False

    epsilon: float
    dims: int

    def __post_init__(self) -> None:
        self._check_common()


@register
@dataclass(frozen=True)
class NoPrivacy(NonPrivate):
    """NP: the full gradient is sent as is."""

    name = "np"
    description = "non-private baseline (full gradient)"

    def privatize(self, updates, streams, state=None) -> Privatized:
        # The updates themselves, not a copy: copying a cohort of large models (BitRand's MLP:
        # 100 × 3.4M values) costs as much as their gradients, and nothing writes into reports.
        return Privatized(updates, None)

    def accounting(self) -> Accounting:
        return Accounting(math.inf, math.inf, FLOAT_BITS * self.dims)


@register
@dataclass(frozen=True)
class NoPrivacyRandomSampling(NonPrivate):
    """NP-RS: one uniformly random coordinate, sent exactly and scaled by d (unbiased, no privacy)."""

    name = "np-rs"
    description = "non-private baseline: one random coordinate scaled by d"

    def privatize(self, updates, streams, state=None) -> Privatized:
        clients, dims = updates.shape
        chosen = streams.randint(dims, (clients, 1))
        values = updates.gather(1, chosen) * dims
        return Privatized(torch.zeros_like(updates).scatter_(1, chosen, values), None)

    def accounting(self) -> Accounting:
        return Accounting(math.inf, math.inf, FLOAT_BITS + index_bits(self.dims))
