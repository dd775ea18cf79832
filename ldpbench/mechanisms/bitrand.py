"""BitRand and its baselines on embedded features: privatise a client's data set once (features, labels).

Restated from ../shared/papers/bitrand.txt in ../shared/reference/mechanisms.md §5. A feature value
is encoded into l bits (sign, m integer bits, l−1−m fraction bits), every bit is randomised, the
bits are decoded back to a value, and ordinary (non-private) training runs on the released data:
training is post-processing, so the release is the only privacy cost (no composition over rounds).

A data release (`base.DataRelease`): `release` perturbs a client's feature rows [records, r]
(`release_features`) and then its labels (`release_labels`) from the same keyed streams. Accounting
reports the paper's claim ε_X + ε_Y beside the exact worst case of the released bits,
Σ_i max_out |ln P(out | 1)/P(out | 0)| + ε_Y, which for f-RR is r·Σ_j |ln((1−q_j)/q_j)|.
`flat-release` applies the value-perturbation baselines (DM, PM, HM, Three-Outputs, PM-SUB) to the
features instead, through the flat mechanisms of `scalar.py`.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ldpbench import rng
from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import Accounting, DataRelease, Mechanism, Released
from ldpbench.mechanisms.registry import register
from ldpbench.mechanisms.scalar import FLAT_MECHANISMS, NUMBA_PERTURBERS, SCALAR_PERTURBERS
from ldpbench.rng import ClientStreams

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

LABEL_MECHANISMS = ("rr", "laplace")


# ------------------------------------------------------------------------------ encoding
def largest_encodable(l: int, m: int) -> float:
    return sum(2.0 ** (m - i) for i in range(1, l))


def encode(values: torch.Tensor, l: int, m: int) -> torch.Tensor:
    """[..., r] values → [..., r, l] bits; bit 0 = sign (1 if ≥ 0), bit i ≥ 1 has weight 2^{m−i}.

    CHOICE: magnitudes are clipped to the largest encodable value and rounded to the nearest
    multiple of the least significant weight 2^{m−l+1}. The sign bit is the IEEE sign (0 for −0.0),
    so that encode(decode(bits)) gives back every bit pattern, a zero magnitude of sign 0 included.
    """
    lsb_units = torch.round(values.abs().clamp(max=largest_encodable(l, m)) * 2.0 ** (l - 1 - m))
    units = lsb_units.to(torch.int64).clamp(max=2 ** (l - 1) - 1)
    shifts = torch.arange(l - 2, -1, -1, device=values.device)  # bit 1 is the most significant
    magnitude_bits = (units.unsqueeze(-1) >> shifts) & 1
    sign = (~torch.signbit(values)).to(torch.int64).unsqueeze(-1)
    return torch.cat([sign, magnitude_bits], dim=-1).to(torch.bool)


def decode(bits: torch.Tensor, l: int, m: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Inverse of `encode`: E = (2·b0 − 1)·Σ_{i≥1} b_i·2^{m−i}, in `dtype` (default float32).

    CHOICE: an all-zero magnitude decodes to 0, as the paper's E does, as +0.0 or −0.0 after its
    sign bit. Training cannot tell them apart (−0 = 0), but the decoded report keeps the released
    sign bit, so the report carries exactly the released bits (encode gives them back).
    """
    dtype = torch.float32 if dtype is None else dtype
    weights = torch.tensor([2.0 ** (m - i) for i in range(1, l)], dtype=dtype, device=bits.device)
    magnitude = (bits[..., 1:].to(dtype) * weights).sum(-1)
    return torch.where(bits[..., 0], magnitude, -magnitude)


# ------------------------------------------------------------------------------ labels
def label_rr_keep_probability(epsilon_y: float, classes: int) -> float:
    """k-ary randomised response: keep with e^{ε_Y}/(e^{ε_Y}+C−1), else a uniform other class."""
    if math.isinf(epsilon_y):
        return 1.0
    return math.exp(epsilon_y) / (math.exp(epsilon_y) + classes - 1)


def label_rr(labels: torch.Tensor, epsilon_y: float, classes: int, streams) -> torch.Tensor:
    keep = streams.rand(labels.shape) < label_rr_keep_probability(epsilon_y, classes)
    shift = 1 + streams.randint(max(classes, 2) - 1, labels.shape)
    return torch.where(keep, labels, (labels + shift) % classes)


def label_laplace(labels: torch.Tensor, epsilon_y: float, classes: int, streams) -> torch.Tensor:
    """Label-Laplace (Phan et al. 2020): Laplace(2/ε_Y) on the one-hot label, then the argmax.

    CHOICE: the noisy one-hot vector is turned back into a hard label by argmax (post-processing).
    """
    if math.isinf(epsilon_y):
        return labels.clone()
    one_hot = torch.nn.functional.one_hot(labels, classes).to(torch.float64)
    return (one_hot + (2.0 / epsilon_y) * streams.laplace(one_hot.shape, torch.float64)).argmax(dim=1)


# ------------------------------------------------------------------------------ the family
@dataclass(frozen=True)
class LabelledRelease(DataRelease):
    """A client's records released once: features by the subclass, labels with ε_Y.

    Labels go through k-ary randomised response (`labels: rr`) or Label-Laplace (`labels:
    laplace`); `eps_y: .inf` releases them as they are (then the claim and worst case are ∞: the
    label is in the clear).
    """

    epsilon: float
    dims: int
    eps_y: float = 1.0
    labels: str = "rr"
    classes: int = 2  # context set by the engine

    def _check_labels(self) -> None:
        self._check_common()
        if not self.eps_y > 0:
            raise ConfigError(f"mechanism '{self.name}': eps_y must be > 0 (or .inf), got {self.eps_y!r}")
        if self.labels not in LABEL_MECHANISMS:
            raise ConfigError(f"mechanism '{self.name}': labels must be one of {LABEL_MECHANISMS}, got {self.labels!r}")
        if self.classes < 2:
            raise ConfigError(f"mechanism '{self.name}': classes must be >= 2, got {self.classes!r}")

    def release(self, features: torch.Tensor, labels: torch.Tensor, streams: ClientStreams) -> Released:
        return Released(self.release_features(features, streams), self.release_labels(labels, streams))

    @abstractmethod
    def release_features(self, features: torch.Tensor, streams: ClientStreams) -> torch.Tensor:
        """Released feature rows [records, dims] (row i draws from the streams' client i)."""

    def release_labels(self, labels: torch.Tensor, streams: ClientStreams) -> torch.Tensor:
        perturb = label_rr if self.labels == "rr" else label_laplace
        return perturb(labels, self.eps_y, self.classes, streams)

    @property
    def label_bits(self) -> int:
        return math.ceil(math.log2(self.classes))


@dataclass(frozen=True)
class BitRelease(LabelledRelease):
    """Common part: encode, randomise bit i with P(1 | 1) = p1[i], P(1 | 0) = p0[i], decode.

    CHOICE: l = 10, m = 5 (the paper's text defaults are not stated for every data set).
    """

    l: int = 10
    m: int = 5

    def __post_init__(self) -> None:
        self._check_bits()

    def _check_bits(self) -> None:
        self._check_labels()
        if not (isinstance(self.l, int) and isinstance(self.m, int) and 1 <= self.m < self.l <= 62):
            raise ConfigError(f"mechanism '{self.name}': need integers 1 <= m < l <= 62, "
                              f"got l={self.l!r}, m={self.m!r}")

    @abstractmethod
    def bit_probabilities(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(P(out = 1 | bit = 1), P(out = 1 | bit = 0)), each [dims·l] float64, bit i = feature i // l."""

    def release_features(self, features, streams) -> torch.Tensor:
        p1, p0 = (p.view(self.dims, self.l) for p in self.bit_probabilities())
        kernels = self._compiled_kernels(features, streams)
        if kernels is not None:
            return self._release_compiled(kernels, features, streams, p1, p0)
        bits = encode(features, self.l, self.m)  # [n, r, l]
        u = streams.rand(bits.shape, torch.float64)
        released = u < torch.where(bits, p1, p0)
        return decode(released, self.l, self.m, features.dtype)

    def _compiled_kernels(self, features, streams):
        """The compiled kernels (numba_perturbers.bit_release) where they give the code above's values
        (finite float32 or float64 CPU rows, whose l − 1 magnitude weights sum exactly in that dtype, and
        streams that draw as ClientStreams does) and draws are compiled (rng.speed); else None."""
        exact_bits = {torch.float32: 24, torch.float64: 53}.get(features.dtype, 0)
        if (features.device.type != "cpu" or features.dim() != 2 or self.l - 1 > exact_bits
                or type(streams).rand is not ClientStreams.rand
                or not rng.speed.compiled_for(features.numel() * self.l)):
            return None
        kernels = rng.compiled_module(NUMBA_PERTURBERS)
        return kernels if kernels is not None and bool(torch.isfinite(features).all()) else None

    def _release_compiled(self, kernels, features, streams, p1, p0) -> torch.Tensor:
        """release_features' value in one compiled pass (no [n, r, l] bits, uniforms or probabilities)."""
        values = features.contiguous().numpy()
        dtype = values.dtype.type  # torch clamps, scales and sums in the features' dtype
        bases = streams.call_bases((*features.shape, self.l), 1)[0]  # the draw of rand([n, r, l], float64)
        probabilities = torch.stack([p0, p1], dim=-1).reshape(-1).numpy()  # P(1 | bit) at [2k + bit]
        weights = np.zeros((self.l - 1, 2), dtype=values.dtype)  # a released 0 adds 0, a 1 its weight
        weights[:, 1] = [2.0 ** (self.m - i) for i in range(1, self.l)]
        out = np.empty_like(values)
        cap, scale = dtype(largest_encodable(self.l, self.m)), dtype(2.0 ** (self.l - 1 - self.m))
        kernels.bit_release(values, bases, cap, scale, 2 ** (self.l - 1) - 1, probabilities, weights.reshape(-1),
                            out)
        return torch.from_numpy(out)

    def feature_worst_case(self) -> float:
        p1, p0 = self.bit_probabilities()
        per_bit = torch.maximum((p1 / p0).log().abs(), ((1 - p1) / (1 - p0)).log().abs())
        return float(per_bit.sum())

    def claimed_feature_epsilon(self) -> float:
        return self.epsilon

    def accounting(self) -> Accounting:
        return Accounting(
            self.claimed_feature_epsilon() + self.eps_y,
            self.feature_worst_case() + self.eps_y,
            float(self.dims * self.l + self.label_bits),
        )


@register
@dataclass(frozen=True)
class FlatRelease(LabelledRelease):
    """BitRand's value-perturbation baselines applied once to the embedded features (its setting (i)).

    The feature vector [r] of every record goes through the flat mechanism of the chosen
    `perturber` (duchi = DM, pm, hm, three-outputs, pm-sub, laplace): Wang et al. Alg. 4 samples
    k = max(1, min(r, ⌊ε_X/2.5⌋)) coordinates independently of the data, perturbs each clipped
    value with ε_X/k and scales it by r/k; the other coordinates are released as 0. Labels as in
    LabelledRelease. The feature part is exactly ε_X-LDP (claimed = worst case, the flat
    mechanisms' check), so the release claims ε_X + ε_Y with the same worst case.
    CHOICE: BitRand's baselines protect only the features; `eps_y: .inf` reproduces that.
    """

    name = "flat-release"
    description = "flat DM/PM/HM/Three-Outputs/PM-SUB on a record's features (ε_X) + label RR (ε_Y), released once"

    perturber: str = "pm"

    def __post_init__(self) -> None:
        self._check_labels()
        if self.perturber not in SCALAR_PERTURBERS:
            raise ConfigError(f"mechanism '{self.name}': perturber must be one of {sorted(SCALAR_PERTURBERS)}, "
                              f"got {self.perturber!r}")

    @property
    def flat(self) -> Mechanism:
        return FLAT_MECHANISMS[self.perturber](epsilon=self.epsilon, dims=self.dims)

    def release_features(self, features, streams) -> torch.Tensor:
        return self.flat.privatize(features, streams).reports

    def accounting(self) -> Accounting:
        features = self.flat.accounting()
        return Accounting(features.epsilon_claimed + self.eps_y, features.epsilon_worst_case + self.eps_y,
                          features.bits + self.label_bits)


def log_frr_alpha(epsilon_x: float, features: int, l: int) -> float:
    """log α of BitRand's Theorem 2, α = sqrt((ε_X + r·l) / (2r·Σ_{i<l} e^{2ε_X·i/l})), in log space
    so that large budgets (sqSGD-scale ε) do not overflow."""
    log_total = torch.logsumexp(torch.arange(l, dtype=torch.float64) * (2 * epsilon_x / l), 0).item()
    return 0.5 * (math.log(epsilon_x + features * l) - math.log(2 * features) - log_total)


def frr_alpha(epsilon_x: float, features: int, l: int) -> float:
    return math.exp(log_frr_alpha(epsilon_x, features, l))


def frr_flip_probabilities(epsilon_x: float, features: int, l: int) -> torch.Tensor:
    """q_j = α·e^{jε_X/l} / (1 + α·e^{jε_X/l}) for bit position j = 0..l−1 (a logistic in log space)."""
    logits = log_frr_alpha(epsilon_x, features, l) + torch.arange(l, dtype=torch.float64) * epsilon_x / l
    return torch.sigmoid(logits)


@register
@dataclass(frozen=True)
class BitRand(BitRelease):
    """BitRand f-RR on features (ε_X) plus label randomisation (ε_Y); claimed ε = ε_X + ε_Y.

    Labels default to k-ary randomised response (`labels: laplace` gives the f-RR &
    Label-Laplace variant).
    """

    name = "bitrand"
    description = "BitRand: feature-bit f-RR (ε_X) + label RR or Label-Laplace (ε_Y), released once"

    def bit_probabilities(self):
        q = frr_flip_probabilities(self.epsilon, self.dims, self.l).repeat(self.dims)
        return 1 - q, q


@dataclass(frozen=True)
class CorrectedBitRelease(BitRelease):
    """Fields and checks shared by corrected LATENT and OME (their α is the mechanism's own)."""

    alpha: float = 1.0

    def __post_init__(self) -> None:
        self._check_bits()
        if not self.alpha > 0:
            raise ConfigError(f"mechanism '{self.name}': alpha must be > 0, got {self.alpha!r}")

    def zero_to_one(self) -> torch.Tensor:
        """P(1 | 0) = 1/(1 + α·e^{ε/(r·l)}) for every bit."""
        n = self.dims * self.l
        return torch.full((n,), 1 / (1 + self.alpha * math.exp(self.epsilon / n)), dtype=torch.float64)


@register
@dataclass(frozen=True)
class CorrectedLatent(CorrectedBitRelease):
    """LATENT (Arachchige et al. 2019) as corrected in BitRand App. I.

    P(1 | 1) = α/(1+α), P(1 | 0) = 1/(1 + α·e^{ε/(r·l)}). Claimed: LATENT's own ε (+ ε_Y); the
    worst case of the r·l released bits is computed exactly. CHOICE: α = 7.
    """

    name = "latent"
    description = "corrected LATENT bit randomisation of features + label RR"

    alpha: float = 7.0

    def bit_probabilities(self):
        p0 = self.zero_to_one()
        return torch.full_like(p0, self.alpha / (1 + self.alpha)), p0


@register
@dataclass(frozen=True)
class CorrectedOme(CorrectedBitRelease):
    """OME (Lyu et al. 2020) as corrected in BitRand App. J: like LATENT, but a 1 at an odd bit
    index keeps with α³/(1+α³). Claimed: OME's own ε (+ ε_Y); worst case exact. α = 1 (BitRand's runs).
    """

    name = "ome"
    description = "corrected OME bit randomisation of features + label RR"

    def bit_probabilities(self):
        p0 = self.zero_to_one()
        a = self.alpha
        odd = torch.arange(len(p0)) % 2 == 1
        return torch.where(odd, a**3 / (1 + a**3), a / (1 + a)).to(torch.float64), p0
