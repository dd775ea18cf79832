"""sqSGD: PrivQuant_{K,∞} by exact enumeration (pmf, ε, unbiasedness), its sampler against the exact
law, the (κ, p) rule, ScalarDP, and the client's bookkeeping (subsampling, residuals, rotation).

Statistical checks reject a correct implementation with probability ≤ 1e-6 each (tests/stats.py)
and are paired with power checks that a deliberately wrong κ, p or ε is rejected.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import special

from ldpbench import mechanisms
from ldpbench.errors import ConfigError
from ldpbench.mechanisms import sqsgd as sq

from stats import EdgeStreams, frequencies_match, mean_matches, streams

N = 200_000


# ---------------------------------------------------------------- exact enumeration
def enumerate_law(d, count, kappa, odds):
    """[inputs, outputs] pmf of PrivQuant by its definition, set sizes counted by enumeration."""
    grid = np.array(list(itertools.product(range(count), repeat=d)))  # every vector of level indices
    matches = (grid[:, None, :] == grid[None, :, :]).sum(-1)  # [input, output]
    tau = sq.threshold(d, kappa)
    upper = matches >= tau
    size_upper, size_lower = upper[0].sum(), (~upper[0]).sum()  # the same for every input
    assert (upper.sum(1) == size_upper).all()
    p = sq.sigmoid(odds)
    law = np.where(upper, p / size_upper, (1 - p) / size_lower)
    return grid, law


def max_log_ratio(law):
    return float(np.log(law.max(axis=0) / law.min(axis=0)).max())


def level_values(index, count, bound=1.0):
    return -bound + 2 * bound * index / (count - 1)


def test_privquant_reference_values():
    # ../shared/reference/mechanisms.md §6: d = 4, K = 3, κ = 1 (τ = 3), p = 0.7.
    d, count, kappa, odds = 4, 3, 1, sq.log_odds(0.7)
    assert sq.threshold(d, kappa) == 3
    assert sq.normaliser(d, count, kappa, odds) == pytest.approx(0.441667, abs=5e-7)
    assert math.exp(sq.log_ratio_bound(d, count, kappa, odds)) == pytest.approx(18.6667, abs=5e-5)
    grid, law = enumerate_law(d, count, kappa, odds)
    assert max_log_ratio(law) == pytest.approx(math.log(18.6667), abs=1e-5)
    # M(v, u) > κ ⇔ matches ≥ τ for every pair.
    matches = (grid[:, None, :] == grid[None, :, :]).sum(-1)
    assert ((2 * matches - d > kappa) == (matches >= 3)).all()


@pytest.mark.parametrize("d,count,epsilon1", [(4, 3, 3.0), (3, 4, 4.0), (5, 2, 2.0), (4, 4, 5.0)])
def test_privquant_epsilon_and_unbiasedness_by_exact_enumeration(d, count, epsilon1):
    kappa, odds = sq.choose_kappa_p(d, count, epsilon1)
    assert odds == pytest.approx(0.1 * epsilon1)
    grid, law = enumerate_law(d, count, kappa, odds)
    assert np.allclose(law.sum(1), 1.0)
    exact = max_log_ratio(law)
    assert exact <= epsilon1 + 1e-12  # the claim holds
    assert exact == pytest.approx(sq.privquant_epsilon(d, count, kappa, odds), abs=1e-12)
    # E[V | x̂] = m·x̂ for every input, exactly.
    values = level_values(grid, count)
    m = sq.normaliser(d, count, kappa, odds)
    assert m > 0
    np.testing.assert_allclose(law @ values, m * values, atol=1e-12)
    # Power: a κ one threshold above the rule's, or p = e^{ε1}/(1+e^{ε1}) (the whole budget on p
    # instead of 0.1·ε1), breaks ε1.
    tau = sq.threshold(d, kappa)
    wrong_kappa = next(k for k in range(kappa + 1, d) if sq.threshold(d, k) > tau)
    assert max_log_ratio(enumerate_law(d, count, wrong_kappa, odds)[1]) > epsilon1
    assert max_log_ratio(enumerate_law(d, count, kappa, epsilon1)[1]) > epsilon1


def sample_outputs(x_index, count, kappa, odds, seed, n=N):
    index = torch.as_tensor(x_index).repeat(n, 1)
    return sq.privquant_sample(index, count, kappa, odds, streams(seed, n)).numpy()


def test_privquant_sampler_matches_the_enumerated_pmf_with_power():
    d, count, epsilon1 = 4, 3, 3.0
    kappa, odds = sq.choose_kappa_p(d, count, epsilon1)
    grid, law = enumerate_law(d, count, kappa, odds)
    x_row = 37
    codes = (count ** np.arange(d - 1, -1, -1))  # product() order: first coordinate most significant

    def counts(samples):
        return np.bincount(samples @ codes, minlength=count**d)

    observed = counts(sample_outputs(grid[x_row], count, kappa, odds, seed=1))
    assert frequencies_match(observed, law[x_row])
    # Power: a sampler run with another threshold (κ + 2) is rejected against the right law.
    wrong = counts(sample_outputs(grid[x_row], count, kappa + 2, odds, seed=2))
    assert sq.threshold(d, kappa + 2) != sq.threshold(d, kappa)
    assert not frequencies_match(wrong, law[x_row])


@pytest.mark.parametrize("edge", ["low", "high"])
def test_privquant_sampler_stays_in_the_chosen_set_at_the_edges_of_its_uniforms(edge):
    """At d = 4, K = 3, τ = 3 the CDF of S_'s match counts ends at 1 − 2^-52 in float64, below the
    largest draw 1 − 2^-53: that draw must still give a vector of S_ (≤ τ − 1 matches), not x̂ itself.
    Every uniform at 0 picks S̄ and its smallest possible count τ."""
    d, count, kappa, odds = 4, 3, 1, sq.log_odds(0.7)
    tau = sq.threshold(d, kappa)
    assert float(sq._match_count_cdfs(d, count, tau)[1][-1]) < 1 - 2.0**-53  # the case at stake
    x = torch.tensor([[2, 1, 0, 2]]).repeat(8, 1)
    released = sq.privquant_sample(x, count, kappa, odds, EdgeStreams(edge, 8))
    matches = (released == x).sum(dim=1)
    expected = tau - 1 if edge == "high" else tau  # u ≥ p: the lower set S_; u = 0 < p: S̄
    assert (matches == expected).all(), matches


def exact_match_count_law(d, count, kappa, odds):
    weights = np.array([special.comb(d, l, exact=True) * (count - 1) ** (d - l) for l in range(d + 1)], dtype=float)
    tau = sq.threshold(d, kappa)
    p = sq.sigmoid(odds)
    law = np.where(np.arange(d + 1) >= tau, p * weights / weights[tau:].sum(), (1 - p) * weights / weights[:tau].sum())
    return law


def merged(counts, law, n, minimum=20):
    keep = law * n >= minimum
    return np.append(counts[keep], counts[~keep].sum()), np.append(law[keep], law[~keep].sum())


def test_privquant_sampler_at_larger_d_matches_the_exact_match_count_law():
    d, count, epsilon1, n = 64, 16, 150.0, 40_000
    kappa, odds = sq.choose_kappa_p(d, count, epsilon1)
    x = torch.randint(count, (1, d), generator=torch.Generator().manual_seed(3))
    samples = sample_outputs(x, count, kappa, odds, seed=4, n=n)
    matches = (samples == x.numpy()).sum(1)
    law = exact_match_count_law(d, count, kappa, odds)
    assert frequencies_match(*merged(np.bincount(matches, minlength=d + 1), law, n))
    # Matching positions are uniform over the coordinates (exchangeability): coordinate 0 matches
    # with probability E[ℓ]/d.
    p_first = float((law * np.arange(d + 1)).sum() / d)
    first = int((samples[:, 0] == int(x[0, 0])).sum())
    assert frequencies_match(np.array([first, n - first]), np.array([p_first, 1 - p_first]))
    # Unbiasedness of Z = V/m on one coordinate, with its exact variance.
    m = sq.normaliser(d, count, kappa, odds)
    levels = level_values(np.arange(count), count)
    xv = levels[int(x[0, 0])]
    second = p_first * xv**2 + (1 - p_first) * ((levels**2).sum() - xv**2) / (count - 1)
    z = level_values(samples[:, 0], count) / m
    assert mean_matches(z, xv, second / m**2 - xv**2)
    # Power: the law of a sampler with a wrong κ (threshold moved by 4) is rejected.
    wrong_kappa = kappa + 8
    wrong = (sample_outputs(x, count, wrong_kappa, odds, seed=5, n=n) == x.numpy()).sum(1)
    assert not frequencies_match(*merged(np.bincount(wrong, minlength=d + 1), law, n))


# ---------------------------------------------------------------- (κ, p) rule and log space
@pytest.mark.parametrize("d,count,epsilon1",
                         [(16, 4, 20.0), (1024, 16, 400.0), (1024, 16, 900.0), (16384, 128, 2000.0)])
def test_kappa_is_the_largest_meeting_the_rule(d, count, epsilon1):
    kappa, odds = sq.choose_kappa_p(d, count, epsilon1)
    assert odds == pytest.approx(0.1 * epsilon1)
    def log_sets_ratio(k):
        return sq.log_ratio_bound(d, count, k, 0.0)
    assert log_sets_ratio(kappa) <= 0.9 * epsilon1
    if kappa < d - 1:
        assert log_sets_ratio(kappa + 1) > 0.9 * epsilon1
    assert sq.privquant_epsilon(d, count, kappa, odds) <= epsilon1
    m = sq.normaliser(d, count, kappa, odds)
    assert math.isfinite(m) and m > 0


def test_paper_kappa_domain_cannot_reach_the_papers_budgets():
    # LeNet at r = 0.5%: d̃ = 1024, K = 16. With κ ≥ 0 the rule needs ε1 ≥ 832; the paper runs 200..400.
    with pytest.raises(ConfigError, match="needs ε1 >= 83"):
        sq.choose_kappa_p(1024, 16, 400.0, "paper")
    kappa, _ = sq.choose_kappa_p(1024, 16, 400.0, "extended")
    assert kappa < 0 and sq.choose_kappa_p(1024, 16, 900.0, "paper")[0] == sq.choose_kappa_p(1024, 16, 900.0)[0]
    with pytest.raises(ConfigError, match="needs ε1"):
        mechanisms.create("sqsgd", 2.0, 100)


def test_subsample_size():
    assert sq.subsample_size(119_850, 0.005) == 1024
    assert sq.subsample_size(1_722_224, 0.005) == 16384
    assert sq.subsample_size(7850, 0.1) == 1024
    assert sq.subsample_size(12, 0.005) == 1


# ---------------------------------------------------------------- quantisation and ScalarDP
def test_stochastic_quantisation_is_unbiased_with_power():
    count, x = 5, 0.3  # levels −1, −.5, 0, .5, 1: rounds to .5 with probability 0.6
    u = streams(6, N).rand((N,), torch.float64)
    index = sq.stochastic_level(torch.full((N,), x, dtype=torch.float64), count, 1.0, u).numpy()
    counts = np.array([(index == 2).sum(), (index == 3).sum()])
    assert counts.sum() == N and frequencies_match(counts, np.array([0.4, 0.6]))
    assert not frequencies_match(counts, np.array([0.5, 0.5]))
    exact = 0.4 * 0.0 + 0.6 * 0.5
    assert exact == pytest.approx(x)
    ends = sq.stochastic_level(torch.tensor([-1.0, 1.0], dtype=torch.float64), count, 1.0, torch.tensor([0.99, 0.99]))
    assert ends.tolist() == [0, count - 1]


def scalar_dp_law(value, bound, epsilon2):
    """Exact pmf over the k+1 released levels."""
    p, q, k = sq.scalar_dp_probabilities(epsilon2)
    position = min(max(value / bound, 0.0), 1.0) * k
    low = min(math.floor(position), k - 1)
    up = position - low
    rounded = np.zeros(k + 1)
    rounded[low], rounded[low + 1] = 1 - up, up
    return rounded * p + (1 - rounded) * q


@pytest.mark.parametrize("epsilon2", [3.0, 10.0])
def test_scalar_dp_exact_law_ratio_and_unbiasedness(epsilon2):
    bound = 2.0
    p, q, k = sq.scalar_dp_probabilities(epsilon2)
    assert k == math.ceil(math.exp(epsilon2 / 3)) and p / q == pytest.approx(math.exp(epsilon2))
    laws = np.array([scalar_dp_law(v, bound, epsilon2) for v in np.linspace(0, bound, 97)])
    assert np.allclose(laws.sum(1), 1)
    assert max_log_ratio(laws) == pytest.approx(epsilon2, abs=1e-9)  # reached at grid points
    levels = (np.arange(k + 1) - q * k * (k + 1) / 2) / (p - q) * bound / k
    np.testing.assert_allclose(laws @ levels, np.linspace(0, bound, 97), atol=1e-9)


def test_scalar_dp_sampler_matches_its_law_with_power():
    epsilon2, bound, value = 3.0, 2.0, 0.77
    p, q, k = sq.scalar_dp_probabilities(epsilon2)
    released = sq.scalar_dp(torch.full((N,), value, dtype=torch.float64), torch.full((N,), bound, dtype=torch.float64),
                            epsilon2, streams(7, N)).numpy()
    levels = np.round(released * k / bound * (p - q) + q * k * (k + 1) / 2).astype(int)
    counts = np.bincount(levels, minlength=k + 1)
    assert frequencies_match(counts, scalar_dp_law(value, bound, epsilon2))
    level_values = (np.arange(k + 1) - q * k * (k + 1) / 2) / (p - q) * bound / k
    variance = float((scalar_dp_law(value, bound, epsilon2) * level_values**2).sum()) - value**2
    assert mean_matches(released, value, variance)
    # Power: the released levels of a ScalarDP run at 2·ε2 do not follow the ε2 law.
    wrong = sq.scalar_dp(torch.full((N,), value, dtype=torch.float64), torch.full((N,), bound, dtype=torch.float64),
                         2 * epsilon2, streams(8, N)).numpy()
    p2, q2, k2 = sq.scalar_dp_probabilities(2 * epsilon2)
    wrong_levels = np.round(wrong * k2 / bound * (p2 - q2) + q2 * k2 * (k2 + 1) / 2).astype(int)
    wrong_counts = np.bincount(np.round(wrong_levels * k / k2).astype(int), minlength=k + 1)[: k + 1]
    assert not frequencies_match(wrong_counts, scalar_dp_law(value, bound, epsilon2))


# ---------------------------------------------------------------- the sqSGD client
def test_sqsgd_residuals_subsampling_and_clipping():
    dims = 300
    mech = mechanisms.create("sqsgd", 400.0, dims, {"ratio": 0.1, "alpha": 0.5, "bound": 1.0})
    assert mech.subsampled == 32 and mech.state_dims == dims  # residuals only, without `adaptive`
    gen = torch.Generator().manual_seed(9)
    g = torch.randn(3, dims, generator=gen, dtype=torch.float64)
    state = torch.randn(3, dims, generator=gen, dtype=torch.float64) * 0.1
    out = mech.privatize(g, streams(9, g), state)
    sent = out.state == 0  # D_s: the residual is reset there and only there
    assert (sent.sum(1) == 32).all() and (out.reports[~sent] == 0).all()
    clipped = sq.clip_l2(g, 1.0)
    assert clipped.norm(dim=1).max() <= 1.0 + 1e-12
    torch.testing.assert_close(out.state, torch.where(sent, 0.0, state + 0.5 * clipped))


def test_sqsgd_pipeline_is_exact_up_to_quantisation_at_a_huge_budget():
    # ε1 = 1e4: κ = d̃ − 1 (τ = d̃) and p ≈ 1, so V = x̂ and m ≈ 1; only the K-level rounding remains.
    dims, count, bound = 64, 4096, 1.0
    mech = mechanisms.create("sqsgd", 1e4, dims, {"ratio": 1.0, "levels": count, "bound": bound})
    assert mech.kappa_p[0] == dims - 1 and mech.m == pytest.approx(1.0)
    g = torch.randn(4, dims, generator=torch.Generator().manual_seed(10), dtype=torch.float64) * 0.05
    out = mech.privatize(g, streams(10, g), mech.initial_state(4, torch.float64))
    step = 2 * bound / (count - 1)
    assert ((out.reports - sq.clip_l2(g, bound)).norm(dim=1) <= math.sqrt(dims) * step).all()
    # Without rotation too; and when d̃ > d the vector is zero-padded, every coordinate sent.
    plain = mechanisms.create("sqsgd", 1e4, 12, {"ratio": 1.0, "levels": count, "rotate": False})
    assert plain.subsampled == 16
    x = torch.rand(2, 12, generator=torch.Generator().manual_seed(11), dtype=torch.float64) * 0.1
    y = plain.privatize(x, streams(11, x), plain.initial_state(2, torch.float64)).reports
    assert ((y - x).abs() <= 20.0 / (count - 1)).all()


def test_sqsgd_adaptive_norm_bound_and_accounting():
    dims = 2000
    mech = mechanisms.create("sqsgd", 400.0, dims, {"ratio": 0.25, "adaptive": True, "norm_floor": 0.05})
    assert mech.epsilon_quant == 390.0 and mech.epsilon_norm == 10.0
    assert mech.state_dims == dims + 1
    initial = mech.initial_state(50, torch.float64)
    assert (initial == 0).all()  # a zero norm bound stands for U
    g = torch.randn(50, dims, generator=torch.Generator().manual_seed(12), dtype=torch.float64) * 0.01
    out = mech.privatize(g, streams(12, g), initial)
    bound = out.state[:, -1]
    assert (bound <= 10.0).all() and (bound >= 0.05).all() and (bound < 10.0).any()
    # The next round quantises on [−U_t, U_t]: Z = V/m with |V| ≤ U_t, so ‖R⁻¹Z‖₂ ≤ √d̃·U_t/m.
    again = mech.privatize(g, streams(13, g), out.state)
    limit = math.sqrt(mech.subsampled) * bound / mech.m
    assert (again.reports.norm(dim=1) <= limit * (1 + 1e-9)).all()
    accounting = mech.accounting()
    k = sq.scalar_dp_levels(10.0)
    assert accounting.epsilon_claimed == 400.0
    assert accounting.epsilon_worst_case == pytest.approx(
        sq.privquant_epsilon(mech.subsampled, 16, *mech.kappa_p) + 10.0)
    assert accounting.epsilon_worst_case <= 400.0
    assert accounting.bits == mech.subsampled * 4 + 64 + math.ceil(math.log2(k + 1))


@pytest.mark.parametrize("rule", ["track", "shrink"])
def test_sqsgd_norm_bound_tracks_up_and_down_or_only_shrinks(rule):
    """A client whose bound sits at 0.5 while its rotated vector saturates it: "track" raises the
    bound by one ScalarDP level (the released norm is on [0, U_t]), "shrink" keeps it; both follow
    a small vector down to just above its norm."""
    dims = 2000
    mech = mechanisms.create("sqsgd", 400.0, dims, {"ratio": 0.25, "adaptive": True, "norm_update": rule})
    state = torch.zeros(40, dims + 1, dtype=torch.float64)
    state[:, -1] = 0.5
    k = sq.scalar_dp_levels(10.0)
    large = torch.ones(40, dims, dtype=torch.float64)  # ‖x̃‖∞ far above 0.5 after rotation
    grown = mech.privatize(large, streams(14, large), state).state[:, -1]
    if rule == "track":
        assert (grown > 0.5).double().mean() > 0.9 and (grown <= 0.5 + 2 * 0.5 / k + 1e-12).all()
    else:
        assert (grown <= 0.5).all()
    small = torch.full((40, dims), 1e-4, dtype=torch.float64)
    norm = sq.rotate(torch.full((40, mech.subsampled), 1e-4, dtype=torch.float64), 0).abs().amax().item()
    shrunk = mech.privatize(small, streams(15, small), state).state[:, -1]
    assert (shrunk <= norm + 2 * 0.5 / k).double().mean() > 0.9 and (shrunk >= 0.01).all()


@pytest.mark.parametrize("params,field", [
    ({"levels": 1}, "levels"), ({"ratio": 0.0}, "ratio"), ({"bound": 0.0}, "bound"),
    ({"adaptive": True, "norm_epsilon": 500.0}, "norm_epsilon"), ({"kappa_domain": "wide"}, "kappa_domain"),
    ({"norm_update": "grow"}, "norm_update"),
])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(ConfigError, match=field):
        mechanisms.create("sqsgd", 400.0, 1000, params)
