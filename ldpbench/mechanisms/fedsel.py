"""FedSel: private Top-k dimension selection, then value perturbation of the selected dimension.

Liu et al., "FedSel: Federated SGD under Local Differential Privacy with Top-k Dimension
Selection" (../shared/papers/fedsel.md, Algorithm 1, §4.1, §5.3); reference §2.

Each selector gives, besides its vectorised sampler, the exact law of its output for a status
vector and its exact worst-case log-likelihood ratio, so tests and accounting use the same truth.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import FLOAT_BITS, Accounting, AuditPair, Mechanism, Privatized, index_bits
from ldpbench.mechanisms.registry import register
from ldpbench.mechanisms.scalar import SCALAR_PERTURBERS, NonPrivate, get_perturber
from ldpbench.rng import ClientStreams

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

SELECTORS = ("exp", "pe", "ps")


def top_k_mask(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean [clients, dims] mask of each row's k largest entries: the entries topk(k) picks.

    On CPU a row whose k-th largest entry is above all the others has one such set, the entries at
    or above it, which one partial sort finds (numpy's partition: 2–3× faster than topk on a round's
    [480, 101], 7× on [10, 10⁵]); for k = 1, the row's maximum (a reduction, several times faster
    again on the audit's narrow rows). A row with a tie there, or a NaN, takes topk, which breaks them
    its own way; the mask is topk's in every case.
    """
    dims = magnitudes.shape[1]
    if (magnitudes.device.type != "cpu" or magnitudes.dtype not in (torch.float32, torch.float64)
            or not 0 < k < dims or magnitudes.requires_grad):
        return _top_k_mask_by_topk(magnitudes, k)
    if k == 1:
        # amax is NaN on a row holding one, whose mask is then empty: a NaN row is ambiguous too.
        mask = magnitudes >= magnitudes.amax(dim=1, keepdim=True)
        ambiguous = (mask.sum(dim=1) != 1).numpy()
    else:
        partitioned = np.partition(magnitudes.numpy(), dims - k, axis=1)
        kth = partitioned[:, dims - k]
        # numpy sorts NaN last, so a row's NaNs are among its k largest, as topk counts them too.
        ambiguous = (np.isnan(partitioned[:, dims - k:]).any(axis=1)
                     | ~(kth > partitioned[:, :dims - k].max(axis=1)))
        mask = magnitudes >= torch.from_numpy(kth).unsqueeze(1)
    if ambiguous.any():
        rows = torch.from_numpy(np.flatnonzero(ambiguous))
        mask[rows] = _top_k_mask_by_topk(magnitudes[rows], k)
    return mask


def _top_k_mask_by_topk(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    top = magnitudes.topk(k, dim=1).indices
    return torch.zeros_like(magnitudes, dtype=torch.bool).scatter_(1, top, True)


def _uniform_choice(allowed: torch.Tensor, streams: ClientStreams) -> torch.Tensor:
    """A uniform index among each row's allowed entries (argmax of i.i.d. uniform keys).

    The keys have 53 bits: with float32's 24, the largest of d keys ties with probability about
    d·2^-24 and argmax gives the tie to the lower index, a bias that depends on the (private)
    allowed set. The float64 key refines the float32 one (both are prefixes of the same 64-bit
    draw), so only tied choices change. (ClientStreams.choice draws the keys and picks in one pass.)
    """
    return streams.choice(allowed)


# ------------------------------------------------------------------------------ EXP
def exponential_selection(magnitudes, k, epsilon1, streams):
    """EXP: P(j) ∝ exp(ε1·z_j/(d−1)), z_j ∈ {1..d} the ascending rank of |r_j| (Gumbel-max sampling)."""
    clients, dims = magnitudes.shape
    ranks = magnitudes.argsort(dim=1).argsort(dim=1).to(torch.float64) + 1.0
    return (epsilon1 * ranks / (dims - 1) + streams.gumbel((clients, dims))).argmax(dim=1), None


def exp_probabilities(ranks: np.ndarray, epsilon1: float) -> np.ndarray:
    """Exact P(j) for ranks z (a permutation of 1..d)."""
    weights = np.exp(epsilon1 * ranks / (len(ranks) - 1))
    return weights / weights.sum()


def exp_worst_case(epsilon1: float, dims: int, k: int) -> float:
    # The normaliser is the same for every ranking, so the ratio is e^{ε1(d−1)/(d−1)}.
    return epsilon1


# ------------------------------------------------------------------------------ PE
def pe_keep_probability(epsilon1: float) -> float:
    return math.exp(epsilon1) / (math.exp(epsilon1) + 1.0)


def perturbed_encoding(magnitudes, k, epsilon1, streams):
    """PE: flip each bit of the Top-k indicator with prob 1−p; j uniform among the ones; ⊥ if none."""
    in_top = top_k_mask(magnitudes, k)
    flip = streams.rand(in_top.shape) >= pe_keep_probability(epsilon1)
    noisy = in_top ^ flip
    empty = ~noisy.any(dim=1)
    return _uniform_choice(noisy, streams), empty


@functools.lru_cache(maxsize=256)
def _expected_inverse_count(kept: int, p_kept: float, flipped: int, p_flipped: float) -> float:
    """E[1/(1+N)] for N = Bin(kept, p_kept) + Bin(flipped, p_flipped)."""
    from scipy import stats  # here, not at the top: only PE's accounting needs it (about 1 s to import)

    law = np.convolve(stats.binom.pmf(np.arange(kept + 1), kept, p_kept),
                      stats.binom.pmf(np.arange(flipped + 1), flipped, p_flipped))
    return float((law / (1.0 + np.arange(len(law)))).sum())


def pe_selection_probability(selected_in_top: bool, dims: int, k: int, epsilon1: float) -> float:
    """Exact P(output j) for one index j, given whether j is in the true Top-k set."""
    p = pe_keep_probability(epsilon1)
    if selected_in_top:
        return p * _expected_inverse_count(k - 1, p, dims - k, 1 - p)
    return (1 - p) * _expected_inverse_count(k, p, dims - k - 1, 1 - p)


def pe_worst_case(epsilon1: float, dims: int, k: int) -> float:
    """Exact worst-case ε of PE. The paper's Lemma 2 takes |S| as fixed; it is not, so this exceeds ε1.

    By symmetry P(j | z) depends only on z_j; ⊥ has the same probability for every z (ratio 1).
    """
    if k >= dims:
        return 0.0
    return abs(math.log(pe_selection_probability(True, dims, k, epsilon1)
                        / pe_selection_probability(False, dims, k, epsilon1)))


# ------------------------------------------------------------------------------ PS
def ps_top_probability(epsilon1: float, dims: int, k: int) -> float:
    """PS: probability of sampling from the Top-k set, p = e^{ε1}k / (d − k + e^{ε1}k).

    Each Top-k index then has probability e^{ε1}/(d−k+e^{ε1}k) and every other index
    1/(d−k+e^{ε1}k): their ratio is exactly e^{ε1}. (The paper's §4.1 text writes e^{ε1·k}; its
    Lemma 3 and the reference use e^{ε1}·k, which is the form that gives ε1-LDP.)
    """
    scaled = math.exp(epsilon1) * k
    return scaled / (dims - k + scaled)


def perturbed_sampling(magnitudes, k, epsilon1, streams):
    """PS selection for every client at once: one index per row of `magnitudes` [clients, dims]."""
    clients, dims = magnitudes.shape
    in_top = top_k_mask(magnitudes, k)
    from_top = streams.rand((clients,)) < ps_top_probability(epsilon1, dims, k)
    allowed = in_top == from_top.unsqueeze(1)  # the Top-k set for those sampling from it, else the rest
    return _uniform_choice(allowed, streams), None


def ps_worst_case(epsilon1: float, dims: int, k: int) -> float:
    return epsilon1 if k < dims else 0.0


SELECT = {"exp": exponential_selection, "pe": perturbed_encoding, "ps": perturbed_sampling}
SELECTION_WORST_CASE = {"exp": exp_worst_case, "pe": pe_worst_case, "ps": ps_worst_case}


# ------------------------------------------------------------------------------ the mechanism
@register
@dataclass(frozen=True)
class FedSel(Mechanism):
    """FedSel two-stage mechanism (client side of Algorithm 1).

    r_t = r_{t-1} + g; j = Select(|r_t|, k, ε1); s_j = r_t[j] + η·r_{t-1}[j] clipped to [-1, 1];
    report (j, ValuePerturb(s_j, ε2)); r_t[j] = 0. The server averages without d-scaling.
    ε1 = μ·ε, ε2 = ε − ε1 (Theorem 1: claimed ε per report). With `control` (the paper's "-C"
    variants) the value stage gets the whole ε, so a report costs ε + ε1.
    PE may output ⊥ (no report; counted as a zero vector, r_t unchanged).

    CHOICEs: η (not given in the paper) defaults to 0.5; k = max(1, round(k_fraction·d));
    mu = "auto" is the hyper-parameters-free rule: ε2 ≥ auto_c·sqrt(d·ln d / m) goes to the value
    stage first and μ = clamp(1 − that/ε, 0, auto_theta) (paper: θ = 0.2; c is not given, 1.0 here).
    Worst-case ε = exact worst case of the selector + ε2 (both ratios are reached together).
    """

    name = "fedsel"
    description = "FedSel two-stage: private Top-k selection (exp/pe/ps) + any value perturber"
    stateful = True

    epsilon: float
    dims: int
    selector: str = "ps"
    perturber: str = "pm"
    k_fraction: float = 0.1
    mu: float | str = 0.1
    eta: float = 0.5
    control: bool = False
    auto_c: float = 1.0
    auto_theta: float = 0.2
    cohort_size: int = 0  # context set by the engine (m); used by mu = "auto"

    def __post_init__(self) -> None:
        self._check_common()
        if self.selector not in SELECTORS:
            raise ConfigError(f"mechanism '{self.name}': selector must be one of {SELECTORS}, got {self.selector!r}")
        get_perturber(self.perturber)
        if not 0.0 < self.k_fraction <= 1.0:
            raise ConfigError(f"mechanism '{self.name}': k_fraction must be in (0, 1], got {self.k_fraction!r}")
        if self.mu != "auto" and not (isinstance(self.mu, (int, float)) and 0.0 <= self.mu < 1.0):
            raise ConfigError(f"mechanism '{self.name}': mu must be in [0, 1) or 'auto', got {self.mu!r}")
        if self.mu == 0.0 and self.control:
            raise ConfigError(f"mechanism '{self.name}': a control variant needs mu > 0")
        if self.eta < 0.0:
            raise ConfigError(f"mechanism '{self.name}': eta must be >= 0, got {self.eta!r}")
        if not 0.0 <= self.auto_theta < 1.0 or self.auto_c <= 0:
            raise ConfigError(f"mechanism '{self.name}': need auto_c > 0 and auto_theta in [0, 1)")
        if self.selector == "exp" and self.dims < 2:
            raise ConfigError(f"mechanism '{self.name}': the EXP selector needs dims >= 2")

    @property
    def k(self) -> int:
        return min(self.dims, max(1, round(self.k_fraction * self.dims)))

    def audit_pairs(self) -> list[AuditPair]:
        """The default pairs, plus inputs whose Top-k sets are disjoint where d ≥ 2k (the first k
        coordinates at +1 against the last k): the selection stage's hardest case."""
        pairs = super().audit_pairs()
        if self.dims >= 2 * self.k:
            x, x_prime = torch.zeros(self.dims, dtype=torch.float64), torch.zeros(self.dims, dtype=torch.float64)
            x[:self.k], x_prime[-self.k:] = 1.0, 1.0
            pairs.append(AuditPair("Top-k sets disjoint", x, x_prime))
        return pairs

    @property
    def budget_share(self) -> float:
        """μ, resolved for 'auto' from the cohort size m."""
        if self.mu != "auto":
            return float(self.mu)
        if self.cohort_size < 1:
            raise ConfigError(f"mechanism '{self.name}': mu = 'auto' needs the cohort size (set by the engine)")
        d = max(self.dims, 2)
        value_floor = self.auto_c * math.sqrt(d * math.log(d) / self.cohort_size)
        return min(self.auto_theta, max(0.0, 1.0 - value_floor / self.epsilon))

    @property
    def epsilon_selection(self) -> float:
        return self.budget_share * self.epsilon

    @property
    def epsilon_value(self) -> float:
        return self.epsilon if self.control else self.epsilon - self.epsilon_selection

    def privatize(self, updates, streams, state=None) -> Privatized:
        previous = torch.zeros_like(updates) if state is None else state
        accumulated = previous + updates
        chosen, empty = SELECT[self.selector](accumulated.abs(), self.k, self.epsilon_selection, streams)
        chosen = chosen.unsqueeze(1)
        value = accumulated.gather(1, chosen) + self.eta * previous.gather(1, chosen)
        noisy = get_perturber(self.perturber).sample(value.clamp(-1.0, 1.0), self.epsilon_value, streams)
        sent = torch.ones_like(noisy, dtype=torch.bool) if empty is None else ~empty.unsqueeze(1)
        reports = torch.zeros_like(updates).scatter_(1, chosen, torch.where(sent, noisy, 0.0))
        residual = accumulated.scatter_(1, chosen, torch.where(sent, 0.0, accumulated.gather(1, chosen)))
        return Privatized(reports, residual)

    def accounting(self) -> Accounting:
        selection = SELECTION_WORST_CASE[self.selector](self.epsilon_selection, self.dims, self.k)
        claimed = self.epsilon_selection + self.epsilon_value
        bits = index_bits(self.dims) + get_perturber(self.perturber).value_bits(self.epsilon_value)
        return Accounting(claimed, selection + self.epsilon_value, bits)


def _register_preset(selector: str, perturber: str) -> type[FedSel]:
    """'ps-pm' etc.: FedSel with the selector and perturber fixed by the name."""
    annotations = {f.name: f.type for f in fields(FedSel)}
    namespace = {f.name: f.default for f in fields(FedSel) if f.name not in ("epsilon", "dims")}
    namespace.update({
        "__annotations__": annotations,
        "name": f"{selector}-{perturber}",
        "description": f"FedSel {selector.upper()} selection + {SCALAR_PERTURBERS[perturber].label} value perturbation",
        "selector": selector, "perturber": perturber,
        # Fixed by the name, so not settable from a campaign.
        "hidden_fields": FedSel.hidden_fields + ("selector", "perturber"),
        "__doc__": FedSel.__doc__, "__module__": __name__,
    })
    cls = type(f"FedSel{selector.upper()}{perturber.title().replace('-', '')}", (FedSel,), namespace)
    return register(dataclass(frozen=True)(cls))


PRESETS = {f"{s}-pm": _register_preset(s, "pm") for s in SELECTORS}


@register
@dataclass(frozen=True)
class NoPrivacyTopK(NonPrivate):
    """NP-K: FedSel's pipeline without privacy: exact Top-1 of the accumulated vector, sent unperturbed.

    CHOICE: it keeps FedSel's accumulation and momentum η (the paper calls it the non-private
    limit of the selection), and does not clip.
    """

    name = "np-k"
    description = "non-private baseline: Top-1 of the accumulated gradient"
    stateful = True

    eta: float = 0.5

    def privatize(self, updates, streams, state=None) -> Privatized:
        previous = torch.zeros_like(updates) if state is None else state
        accumulated = previous + updates
        chosen = accumulated.abs().argmax(dim=1, keepdim=True)
        value = accumulated.gather(1, chosen) + self.eta * previous.gather(1, chosen)
        reports = torch.zeros_like(updates).scatter_(1, chosen, value)
        return Privatized(reports, accumulated.scatter_(1, chosen, 0.0))

    def accounting(self) -> Accounting:
        return Accounting(math.inf, math.inf, FLOAT_BITS + index_bits(self.dims))
