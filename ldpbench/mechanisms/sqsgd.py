"""sqSGD (Feng et al., ../shared/papers/sqsgd.md §3, Alg. 1–2, Appendix A–B); reference §4.

PrivQuant_{K,∞}: stochastic K-level quantisation of x ∈ [−U, U]^d to x̂ ∈ B^d (B_k = −U + 2(k−1)U/(K−1)),
then V uniform on {u : u matches x̂ in ≥ τ coordinates} with probability p, else uniform on
{u : matches ≤ τ−1}, τ = ⌈(d+κ+1)/2⌉ (M(u, x̂) > κ ⇔ matches ≥ τ); Z = V/m is unbiased.

Both sets have sizes that do not depend on x̂: |S̄| = Σ_{ℓ≥τ} C(d,ℓ)(K−1)^{d−ℓ}, |S_| = Σ_{ℓ<τ} ...
So P(v | x̂) is p/|S̄| or (1−p)/|S_|, and the exact worst-case log-likelihood ratio of one report is
|ln(p·|S_| / ((1−p)·|S̄|))|, the log of Eq. (9)'s left side. All binomial sums are kept in log space
(lgamma, logsumexp): they overflow a float64 from d ≈ 300 on.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ldpbench.deferred_import import deferred
from ldpbench.errors import ConfigError
from ldpbench.mechanisms.base import Accounting, Mechanism, Privatized
from ldpbench.mechanisms.hadamard import rotate, unrotate
from ldpbench.mechanisms.registry import register
from ldpbench.rng import ClientStreams

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

SEED_BITS = 64  # the subset D_s is data-independent: the client sends the seed it drew it from


# ------------------------------------------------------------------------------ quantisation
def levels(count: int, bound: float, dtype: torch.dtype | None = None) -> torch.Tensor:
    """B_k = −U + 2(k−1)U/(K−1), k = 1..K (Eq. 6); default float64."""
    return torch.linspace(-bound, bound, count, dtype=torch.float64 if dtype is None else dtype)


def stochastic_level(x: torch.Tensor, count: int, bound, u: torch.Tensor) -> torch.Tensor:
    """Index in {0..K−1} of the unbiased rounding of x ∈ [−U, U] to its two neighbouring levels.

    Rounds up with probability (x − B_low)/(B_high − B_low) (Eq. 7, whose printed probability is
    garbled by extraction; this is the unbiased rule it describes), using the uniforms `u`.
    `bound` is a float or a [clients, 1] tensor.
    """
    position = (x + bound) / (2 * bound) * (count - 1)
    position = position.clamp(0, count - 1)
    low = position.floor().clamp(max=count - 2)
    return (low + (u < position - low).to(low.dtype)).to(torch.int64)


# ------------------------------------------------------------------------------ PrivQuant law
def log_match_weights(d: int, count: int) -> torch.Tensor:
    """log(C(d, ℓ)·(K−1)^{d−ℓ}) for ℓ = 0..d: the log number of vectors matching x̂ in ℓ places."""
    ell = torch.arange(d + 1, dtype=torch.float64)
    log_binomial = math.lgamma(d + 1) - torch.lgamma(ell + 1) - torch.lgamma(d - ell + 1)
    return log_binomial + (d - ell) * math.log(count - 1)


def threshold(d: int, kappa: int) -> int:
    """τ = ⌈(d+κ+1)/2⌉."""
    return -(-(d + kappa + 1) // 2)


def log_set_sizes(d: int, count: int, tau: int) -> tuple[float, float]:
    """(log |S̄|, log |S_|): vectors matching in ≥ τ places, and in ≤ τ−1 places."""
    weights = log_match_weights(d, count)
    return float(torch.logsumexp(weights[tau:], 0)), float(torch.logsumexp(weights[:tau], 0))


# p is carried as its log-odds λ = ln(p/(1−p)): Appendix B's p = e^{0.1ε1}/(1+e^{0.1ε1}) is 1.0 in
# float64 from ε1 ≈ 370 on, while λ = 0.1·ε1 stays exact.
def log_odds(p: float) -> float:
    return math.log(p) - math.log1p(-p)


def sigmoid(log_odds_value: float) -> float:
    """p from λ (and 1 − p = sigmoid(−λ)), without cancellation."""
    if log_odds_value >= 0:
        return 1.0 / (1.0 + math.exp(-log_odds_value))
    e = math.exp(log_odds_value)
    return e / (1.0 + e)


def log_ratio_bound(d: int, count: int, kappa: int, odds: float) -> float:
    """log of Eq. (9)'s left side: λ + ln(|S_|/|S̄|) with λ = ln(p/(1−p)); the exact worst case when ≥ 0."""
    upper, lower = log_set_sizes(d, count, threshold(d, kappa))
    return odds + lower - upper


def privquant_epsilon(d: int, count: int, kappa: int, odds: float) -> float:
    """Exact worst-case ε of PrivQuant: max over outputs and inputs of |log P(v|x̂)/P(v|x̂')|.

    P(v | x̂) takes two values, p/|S̄| (v matches x̂ in ≥ τ places) and (1−p)/|S_|; for d ≥ 1 and
    1 ≤ τ ≤ d some v is in S̄(x̂) and in S_(x̂'), so the maximum is |λ + ln(|S_|/|S̄|)|.
    """
    return abs(log_ratio_bound(d, count, kappa, odds))


KAPPA_DOMAINS = ("paper", "extended")
NORM_UPDATES = ("track", "shrink")


@functools.lru_cache(maxsize=64)
def choose_kappa_p(d: int, count: int, epsilon1: float, domain: str = "extended") -> tuple[int, float]:
    """Appendix B: (κ, λ) with λ = ln(p/(1−p)) = 0.1·ε1, i.e. p = e^{0.1ε1}/(1+e^{0.1ε1}), and κ the
    largest integer with ln(|S_|/|S̄|) ≤ 0.9·ε1 (so Eq. (9) holds: λ + ln(|S_|/|S̄|) ≤ ε1).

    domain "paper": κ ∈ {0..d−1} as the paper states. domain "extended" (CHOICE, default):
    κ ∈ {−d..d−1}, i.e. τ ∈ {1..d}. The paper's own settings need it: at d̃ = 1024, K = 16 (LeNet,
    r = 0.5%) κ = 0 already needs ε1 ≥ 832, yet the paper trains at ε = 200..400. Theorem 1 and the
    normaliser m hold for every τ in 1..d (Appendix A never uses κ ≥ 0). Raises ConfigError when
    no κ in the domain meets the rule.
    """
    if domain not in KAPPA_DOMAINS:
        raise ConfigError(f"PrivQuant: kappa_domain must be one of {KAPPA_DOMAINS}, got {domain!r}")
    weights = log_match_weights(d, count)
    from_top = torch.logcumsumexp(weights.flip(0), 0).flip(0)  # [τ] = log Σ_{ℓ≥τ}
    from_bottom = torch.logcumsumexp(weights, 0)  # [τ−1] = log Σ_{ℓ≤τ−1}
    kappas = torch.arange(0 if domain == "paper" else -d, d)
    taus = -torch.div(-(d + kappas + 1), 2, rounding_mode="floor")
    log_ratio = from_bottom[taus - 1] - from_top[taus]  # non-decreasing in κ
    valid = (log_ratio <= 0.9 * epsilon1).nonzero()
    if valid.numel() == 0:
        needed = float(log_ratio[0]) / 0.9
        raise ConfigError(f"PrivQuant: no κ in {int(kappas[0])}..{d - 1} meets Appendix B's rule at "
                          f"ε1 = {epsilon1:g} for d = {d}, K = {count}; it needs ε1 >= {needed:.4g}")
    return int(kappas[valid.max()]), 0.1 * epsilon1


def normaliser(d: int, count: int, kappa: int, odds: float) -> float:
    """m of Alg. 1: E[V | x̂] = m·x̂ (Appendix A), computed in log space; odds = λ = ln(p/(1−p))."""
    tau = threshold(d, kappa)
    upper, lower = log_set_sizes(d, count, tau)
    log_shared = (math.lgamma(d) - math.lgamma(tau) - math.lgamma(d - tau + 1)) + (d - tau) * math.log(count - 1)
    return sigmoid(odds) * math.exp(log_shared - upper) - sigmoid(-odds) * math.exp(log_shared - lower)


@functools.lru_cache(maxsize=64)
def _match_count_cdfs(d: int, count: int, tau: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CDFs over ℓ = 0..d of the number of matches, restricted to ℓ ≥ τ and to ℓ ≤ τ−1."""
    weights = log_match_weights(d, count)
    upper = torch.where(torch.arange(d + 1) >= tau, weights, -math.inf)
    lower = torch.where(torch.arange(d + 1) < tau, weights, -math.inf)
    return (torch.softmax(upper, 0).cumsum(0), torch.softmax(lower, 0).cumsum(0))


def privquant_sample(index: torch.Tensor, count: int, kappa: int, odds: float, streams: ClientStreams) -> torch.Tensor:
    """Exact sampler of V's level indices [clients, d] given x̂'s level indices [clients, d].

    1. S̄ with probability p, else S_ (one uniform per client);
    2. ℓ from P(ℓ) ∝ C(d,ℓ)(K−1)^{d−ℓ} on the chosen range, by inverse CDF (one uniform);
    3. the ℓ matching positions: the ℓ smallest of d i.i.d. uniform keys (a uniform ℓ-subset);
    4. every other position: one of the K−1 wrong levels, uniformly (x̂ + 1 + U{0..K−2} mod K).
    Uniform over the chosen set: every vector with ℓ matches is equally likely given ℓ, and ℓ has
    the law of the match count of a uniform member of the set. Outcomes whose probability is below
    2^-53 (extreme ℓ) are never drawn (float64 inverse CDF).
    """
    clients, d = index.shape
    tau = threshold(d, kappa)
    upper_cdf, lower_cdf = (c.to(index.device) for c in _match_count_cdfs(d, count, tau))
    upper_set = streams.rand((clients,), torch.float64) < sigmoid(odds)
    u = streams.rand((clients, 1), torch.float64)
    cdf = torch.where(upper_set.unsqueeze(1), upper_cdf.unsqueeze(0), lower_cdf.unsqueeze(0))
    # A CDF's last entry can round to 1 − 2^-52, below the largest draw 1 − 2^-53: searchsorted then
    # answers d + 1, so the count is capped at the chosen range's top (d, or τ − 1 for S_).
    top = torch.where(upper_set, d, tau - 1).unsqueeze(1)
    matches = torch.minimum(torch.searchsorted(cdf, u, right=True), top)  # [clients, 1]
    keys = streams.rand((clients, d), torch.float64)
    ranks = keys.argsort(dim=1).argsort(dim=1)
    wrong = (index + 1 + streams.randint(count - 1, (clients, d))) % count
    return torch.where(ranks < matches, index, wrong)


# ------------------------------------------------------------------------------ ScalarDP
def scalar_dp_levels(epsilon2: float) -> int:
    """k = ⌈e^{ε2/3}⌉ (Alg. 2 line 20)."""
    return math.ceil(math.exp(epsilon2 / 3.0))


def scalar_dp_probabilities(epsilon2: float) -> tuple[float, float, int]:
    """(p keep, q each other level, k): p = e^{ε2}/(e^{ε2}+k), q = 1/(e^{ε2}+k) over k+1 levels."""
    k = scalar_dp_levels(epsilon2)
    e = math.exp(epsilon2)
    return e / (e + k), 1.0 / (e + k), k


def scalar_dp(value: torch.Tensor, bound: torch.Tensor, epsilon2: float, streams: ClientStreams) -> torch.Tensor:
    """ScalarDP (Bhowmick et al. 2018) of value ∈ [0, bound] per client: an unbiased ε2-LDP estimate.

    Stochastic rounding to {0, bound/k, ..., bound} (index J), (k+1)-ary randomised response on J
    (keep with p, else a uniform other level), debiased: Ĵ' = (Ĵ − q·k(k+1)/2)/(p − q); returns
    Ĵ'·bound/k. value, bound: [clients].
    """
    p, q, k = scalar_dp_probabilities(epsilon2)
    clients = value.shape[0]
    position = (value / bound).clamp(0, 1) * k
    low = position.floor().clamp(max=k - 1)
    level = low + (streams.rand((clients,), torch.float64) < position - low).to(low.dtype)
    keep = streams.rand((clients,), torch.float64) < p
    other = streams.randint(k, (clients,)).to(level.dtype)
    other = other + (other >= level).to(level.dtype)  # a uniform level among the k others
    released = torch.where(keep, level, other)
    debiased = (released - q * k * (k + 1) / 2) / (p - q)
    return debiased * bound / k


# ------------------------------------------------------------------------------ the mechanism
def subsample_size(dims: int, ratio: float) -> int:
    """d̃ = 2^⌈log2(r·d)⌉ (Alg. 2 line 3), at least 1."""
    return 2 ** max(0, math.ceil(math.log2(ratio * dims)))


@register
@dataclass(frozen=True)
class SqSGD(Mechanism):
    """sqSGD client (Alg. 2): subsample, accumulate, rotate, PrivQuant_{K,∞}, optional ScalarDP.

    Per report: D_s = d̃ = 2^⌈log2(r·d)⌉ coordinates drawn uniformly (CHOICE: when d̃ > d, all d
    coordinates are sent, zero-padded to d̃); X = gradient clipped to the ℓ2 ball of radius U
    (line 13); v = res[D_s] + β·X[D_s], projected again onto the ℓ2 ball of radius U (§3.4: what
    guarantees ‖R·v‖∞ ≤ U); x̃ = R·v with R = H·A/√d̃ (fast Walsh–Hadamard, public signs from
    `rotation_seed`); Z = PrivQuant(x̃)/m; res[D_s^C] += α·X[D_s^C], res[D_s] = 0. The report is
    decoded per client: R⁻¹·Z scattered back to D_s (no d/d̃ scaling, as in Alg. 2 line 23).

    Budget: ε1 = ε − ε2 goes to PrivQuant with (κ, p) from Appendix B (κ searched over
    `kappa_domain`: "extended" = {−d̃..d̃−1} by default, "paper" = {0..d̃−1}, see choose_kappa_p);
    ε2 = `norm_epsilon` (paper: 10) goes to ScalarDP when `adaptive` is on, else ε2 = 0. Claimed
    ε = ε1 + ε2 per report; the worst case is PrivQuant's exact ratio (≤ ε1, by the rule) plus
    ScalarDP's ε2 (its randomised response ratio is exactly e^{ε2}); subsampling and rotation are
    data-independent.

    Adaptive norm bound (§3.5), CHOICEs:
      * The value released by ScalarDP is ‖x̃‖∞ of the rotated vector on [0, U_t] (Alg. 2 writes
        ‖Z‖∞, but Z is the privatised output, whose scale does not follow the gradient).
      * U_t is the quantisation range: x̃ is clipped to [−U_t, U_t]; the ℓ2 clip keeps the fixed U
        (an ℓ∞ estimate is not an ℓ2 bound).
      * Update (`norm_update`): "track" (default) U_{t+1} = clamp(Û + U_t/k, norm_floor, U), the
        bound follows the released norm down and back up to U; "shrink" U_{t+1} =
        max(norm_floor, min(U_t, Û + U_t/k)), the text's "distributes it ... if the gradient
        norm bound decreases" read literally (Alg. 2's max() would never shrink it). The slack of
        one ScalarDP level U_t/k covers the stochastic rounding, so the bound stays above the true
        norm whenever the randomised response kept the level; without it, a norm below U_t/k
        (mostly released as 0) would collapse the bound to the floor in one round. Since Û is
        released on [0, U_t], tracking grows the bound by at most U_t/k a round. "shrink" fails
        when early gradients are small: in the sqSGD campaign (LeNet-5, K = 16, ε = 400) the
        bound locked at the size of the first, tiny gradients and the run ended at 19.6 % (88.5 %
        with the fixed U); error feedback makes later vectors larger, which only "track" follows.
      * The bound is per client, kept in the client's state (a last column, state_dims = d + 1,
        only with `adaptive`; 0 there stands for U, so the state starts at zeros), updated from that
        client's own released Û, so it is post-processing of released values and the server can
        track it to decode. The paper's server takes the max of Û over the cohort and broadcasts
        it; that needs server state across rounds, which the mechanism interface does not have.
    Bits: d̃·⌈log2 K⌉ + 64 (the seed of D_s) + ⌈log2(k+1)⌉ for ScalarDP's level when adaptive.
    """

    name = "sqsgd"
    description = "sqSGD: subsampling + Walsh–Hadamard rotation + PrivQuant_{K,∞} (+ ScalarDP adaptive bound)"
    stateful = True
    example_epsilon = 400.0  # the paper's LeNet budget; PrivQuant has no valid (κ, p) at small ε

    epsilon: float
    dims: int
    levels: int = 16
    ratio: float = 0.005
    bound: float = 10.0
    alpha: float = 1.0
    beta: float = 1.0
    rotate: bool = True
    rotation_seed: int = 0
    kappa_domain: str = "extended"
    adaptive: bool = False
    norm_epsilon: float = 10.0
    norm_floor: float = 0.01
    norm_update: str = "track"

    def __post_init__(self) -> None:
        self._check_common()
        if not (isinstance(self.levels, int) and self.levels >= 2):
            raise ConfigError(f"mechanism '{self.name}': levels must be an integer >= 2, got {self.levels!r}")
        if not 0.0 < self.ratio <= 1.0:
            raise ConfigError(f"mechanism '{self.name}': ratio must be in (0, 1], got {self.ratio!r}")
        if not self.bound > 0:
            raise ConfigError(f"mechanism '{self.name}': bound must be > 0, got {self.bound!r}")
        if self.alpha < 0 or self.beta < 0:
            raise ConfigError(f"mechanism '{self.name}': alpha and beta must be >= 0")
        if self.adaptive and not (0 < self.norm_epsilon < self.epsilon):
            raise ConfigError(f"mechanism '{self.name}': norm_epsilon must be in (0, epsilon) when adaptive, "
                              f"got {self.norm_epsilon!r}")
        if self.norm_update not in NORM_UPDATES:
            raise ConfigError(f"mechanism '{self.name}': norm_update must be one of {NORM_UPDATES}, "
                              f"got {self.norm_update!r}")
        if self.adaptive and not 0 < self.norm_floor <= self.bound:
            raise ConfigError(f"mechanism '{self.name}': norm_floor must be in (0, bound], got {self.norm_floor!r}")
        # Fails early if ε1 is too small.
        choose_kappa_p(self.subsampled, self.levels, self.epsilon_quant, self.kappa_domain)

    # -------------------------------------------------------------- parameters
    @property
    def subsampled(self) -> int:
        return subsample_size(self.dims, self.ratio)

    @property
    def epsilon_norm(self) -> float:
        return self.norm_epsilon if self.adaptive else 0.0

    @property
    def epsilon_quant(self) -> float:
        return self.epsilon - self.epsilon_norm

    @property
    def kappa_p(self) -> tuple[int, float]:
        return choose_kappa_p(self.subsampled, self.levels, self.epsilon_quant, self.kappa_domain)

    @property
    def m(self) -> float:
        return normaliser(self.subsampled, self.levels, *self.kappa_p)

    @property
    def state_dims(self) -> int:
        # Residuals and, with `adaptive`, the client's current norm bound U_t in a last column, where
        # 0 means "not set yet" (U): a zero state of this width is the initial state.
        return self.dims + 1 if self.adaptive else self.dims

    # -------------------------------------------------------------- client
    def privatize(self, updates, streams, state=None) -> Privatized:
        clients, dims = updates.shape
        dtype = updates.dtype
        if state is None:
            state = self.initial_state(clients, dtype)
        if state.shape[1] != self.state_dims:
            raise ValueError(f"sqsgd: the client state must have {self.state_dims} columns "
                             f"(mechanism.state_dims), got {state.shape[1]}")
        if self.adaptive:
            residual, norm_bound = state[:, :-1], state[:, -1:].to(torch.float64)
            norm_bound = torch.where(norm_bound > 0, norm_bound, self.bound)
        else:
            residual = state
            norm_bound = torch.full((clients, 1), float(self.bound), dtype=torch.float64, device=updates.device)
        d_sub = self.subsampled
        sent = min(d_sub, dims)

        chosen = streams.rand((clients, dims), torch.float64).topk(sent, dim=1).indices  # D_s
        clipped = clip_l2(updates.to(torch.float64), self.bound)
        mask = torch.zeros(clients, dims, dtype=torch.bool, device=updates.device).scatter_(1, chosen, True)
        vector = residual.to(torch.float64).gather(1, chosen) + self.beta * clipped.gather(1, chosen)
        vector = clip_l2(vector, self.bound)
        if d_sub > sent:
            vector = torch.cat([vector, vector.new_zeros(clients, d_sub - sent)], dim=1)
        rotated = rotate(vector, self.rotation_seed) if self.rotate else vector
        rotated = torch.minimum(torch.maximum(rotated, -norm_bound), norm_bound)

        kappa, odds = self.kappa_p
        index = stochastic_level(rotated, self.levels, norm_bound, streams.rand((clients, d_sub), torch.float64))
        sampled = privquant_sample(index, self.levels, kappa, odds, streams)
        values = (-norm_bound + 2 * norm_bound * sampled / (self.levels - 1)) / self.m  # Z = V/m
        decoded = unrotate(values, self.rotation_seed) if self.rotate else values
        reports = torch.zeros(clients, dims, dtype=torch.float64, device=updates.device)
        reports = reports.scatter_(1, chosen, decoded[:, :sent])

        new_state = torch.where(mask, 0.0, residual.to(torch.float64) + self.alpha * clipped)
        if self.adaptive:
            bound = norm_bound.squeeze(1)
            estimate = scalar_dp(rotated.abs().amax(dim=1), bound, self.epsilon_norm, streams)
            slack = bound / scalar_dp_levels(self.epsilon_norm)
            if self.norm_update == "shrink":
                bound = torch.clamp(torch.minimum(bound, estimate + slack), min=self.norm_floor)
            else:
                bound = torch.clamp(estimate + slack, min=self.norm_floor, max=self.bound)
            new_state = torch.cat([new_state, bound.unsqueeze(1)], dim=1)
        return Privatized(reports.to(dtype), new_state.to(dtype))

    def accounting(self) -> Accounting:
        worst = privquant_epsilon(self.subsampled, self.levels, *self.kappa_p) + self.epsilon_norm
        bits = self.subsampled * math.ceil(math.log2(self.levels)) + SEED_BITS
        if self.adaptive:
            bits += math.ceil(math.log2(scalar_dp_levels(self.epsilon_norm) + 1))
        return Accounting(self.epsilon, worst, bits)


def clip_l2(x: torch.Tensor, radius: float) -> torch.Tensor:
    """Project each row onto the ℓ2 ball of the given radius."""
    norms = x.norm(dim=1, keepdim=True)
    return x * (radius / norms.clamp_min(radius))
