"""cpSGD, vqSGD and LDP-Fed: unbiasedness with closed-form variances, exact laws and ratios.

Statistical checks reject a correct implementation with probability ≤ 1e-6 each (tests/stats.py)
and are paired with power checks that a mis-parameterised mechanism is rejected.
"""

import math

import numpy as np
import pytest
import torch

from ldpbench import mechanisms
from ldpbench.errors import ConfigError
from ldpbench.mechanisms import cldp, quantize

from stats import frequencies_match, mean_matches, streams, variance_matches

N = 200_000


# ---------------------------------------------------------------- cpSGD
@pytest.mark.parametrize("epsilon,bits,k,m", [(5.0, 4, 12, 4), (5.0, 5, 23, 9), (10.0, 4, 14, 2), (10.0, 5, 28, 4)])
def test_cpsgd_takes_k_and_m_from_diffsketch_table_1(epsilon, bits, k, m):
    mech = mechanisms.create("cpsgd", epsilon, 100, {"bits": bits})
    assert (mech.k, mech.m) == (k, m)
    accounting = mech.accounting()
    assert accounting.bits == 100 * bits and accounting.epsilon_claimed == epsilon


def test_cpsgd_refuses_an_epsilon_table_1_does_not_cover_and_unbacked_parameters_claim_nothing():
    with pytest.raises(ConfigError, match=r"Table 1.*ε=2"):
        mechanisms.create("cpsgd", 2.0, 10)
    with pytest.raises(ConfigError, match="both k and m"):
        mechanisms.create("cpsgd", 5.0, 10, {"k": 12})
    # Explicit (k, m) off the table: no source for an ε claim, so none is made.
    assert math.isinf(mechanisms.create("cpsgd", 2.0, 10, {"k": 12, "m": 4}).accounting().epsilon_claimed)
    assert math.isinf(mechanisms.create("cpsgd", 10.0, 10, {"k": 12, "m": 4}).accounting().epsilon_claimed)
    assert mechanisms.create("cpsgd", 5.0, 10, {"k": 12, "m": 4}).accounting().epsilon_claimed == 5.0


def test_cpsgd_is_unbiased_with_closed_form_variance_and_power():
    dims, clip = 4, 0.5
    mech = mechanisms.create("cpsgd", 5.0, dims, {"k": 12, "m": 4, "clip": clip})
    x = torch.tensor([[-0.5, -0.13, 0.2, 0.7]], dtype=torch.float64)  # 0.7 is clipped to 0.5
    reports = mech.privatize(x.repeat(N, 1), streams(1, N)).reports.numpy()
    for j in range(dims):
        xj = float(x[0, j].clamp(-clip, clip))
        assert mean_matches(reports[:, j], xj, mech.variance(xj))
        assert variance_matches(reports[:, j], mech.variance(xj), mean=xj)
    # Reports lie on the grid −clip + step·(z − m/2), z ∈ {0..k+m−1}.
    z = (reports + clip) / mech.step + 2.0
    assert np.allclose(z, np.round(z)) and np.round(z).min() >= 0 and np.round(z).max() <= 12 + 4 - 1
    # Power: a cpSGD without the binomial noise (m = 0) has too little variance.
    quiet = mechanisms.create("cpsgd", 5.0, dims, {"k": 12, "m": 0, "clip": clip})
    quiet_reports = quiet.privatize(x.repeat(N, 1), streams(2, N)).reports.numpy()
    assert not variance_matches(quiet_reports[:, 1], mech.variance(-0.13), mean=-0.13)


def test_cpsgd_binomial_noise_law():
    draws = quantize.binomial_half(streams(3, N), (N,), 9).numpy().astype(int)
    law = np.array([math.comb(9, i) for i in range(10)]) / 2**9
    assert frequencies_match(np.bincount(draws, minlength=10), law)
    wrong = np.array([math.comb(9, i) * 0.55**i * 0.45 ** (9 - i) for i in range(10)])
    assert not frequencies_match(np.bincount(draws, minlength=10), wrong)


def test_cpsgd_accounting_records_delta_and_an_infinite_worst_case():
    accounting = mechanisms.create("cpsgd", 5.0, 10, {"delta": 1e-6}).accounting()
    assert accounting.epsilon_claimed == 5.0 and accounting.delta_claimed == 1e-6
    assert math.isinf(accounting.epsilon_worst_case)
    # The support moves with the input: at x = −clip the output z = 0 is possible, at +clip it is not.
    mech = mechanisms.create("cpsgd", 5.0, 1, {"k": 12, "m": 4, "clip": 1.0})
    low = mech.privatize(torch.full((20_000, 1), -1.0), streams(4, 20_000)).reports
    high = mech.privatize(torch.full((20_000, 1), 1.0), streams(5, 20_000)).reports
    assert low.min() < high.min()


# ---------------------------------------------------------------- vqSGD
def vq_release_law(v, epsilon):
    """Exact law over the 2d released vertices for v in the unit ball."""
    d = v.shape[-1]
    chosen = quantize.cross_polytope_probabilities(v).numpy()
    keep = quantize.vq_keep_probability(epsilon, d)
    return keep * chosen + (1 - keep) * (1 - chosen) / (2 * d - 1)


def test_cross_polytope_choice_is_an_unbiased_distribution():
    gen = torch.Generator().manual_seed(6)
    for d in (1, 3, 10):
        v = torch.randn(20, d, generator=gen, dtype=torch.float64)
        v = v / v.norm(dim=1, keepdim=True) * torch.rand(20, 1, generator=gen, dtype=torch.float64)
        prob = quantize.cross_polytope_probabilities(v)
        assert (prob >= 0).all() and torch.allclose(prob.sum(1), torch.ones(20, dtype=torch.float64))
        vertices = torch.cat([torch.eye(d), -torch.eye(d)]).to(torch.float64) * math.sqrt(d)
        torch.testing.assert_close(prob @ vertices, v)


def test_vqsgd_randomised_response_ratio_is_at_most_epsilon():
    d, epsilon = 5, 1.5
    keep = quantize.vq_keep_probability(epsilon, d)
    assert keep / ((1 - keep) / (2 * d - 1)) == pytest.approx(math.exp(epsilon))
    gen = torch.Generator().manual_seed(7)
    inputs = torch.randn(200, d, generator=gen, dtype=torch.float64)
    inputs = torch.cat([inputs / inputs.norm(dim=1, keepdim=True), torch.zeros(1, d, dtype=torch.float64)])
    laws = vq_release_law(inputs, epsilon)
    assert np.log(laws.max(0) / laws.min(0)).max() <= epsilon + 1e-12


def test_vqsgd_sampler_matches_the_exact_vertex_law_and_is_unbiased():
    d, epsilon, clip = 4, 2.0, 2.0
    mech = mechanisms.create("vqsgd", epsilon, d, {"clip": clip})
    x = torch.tensor([[0.6, -0.9, 0.0, 0.3]], dtype=torch.float64)  # ‖x‖ < clip: not clipped
    reports = mech.privatize(x.repeat(N, 1), streams(8, N)).reports.numpy()
    coordinate = np.abs(reports).argmax(1)
    vertex = coordinate + d * (reports[np.arange(N), coordinate] < 0)
    law = vq_release_law(x / clip, epsilon)[0]
    assert frequencies_match(np.bincount(vertex, minlength=2 * d), law)
    # Unbiased with the closed form Var_i = clip²·d·P(±e_i released)/f² − x_i².
    factor = quantize.vq_debias_factor(epsilon, d)
    for i in range(d):
        xi = float(x[0, i])
        variance = clip**2 * d * (law[i] + law[d + i]) / factor**2 - xi**2
        assert mean_matches(reports[:, i], xi, variance)
        assert variance_matches(reports[:, i], variance, mean=xi)
    # Power: the law at 1.5·ε is rejected.
    assert not frequencies_match(np.bincount(vertex, minlength=2 * d), vq_release_law(x / clip, 1.5 * epsilon)[0])


def test_vqsgd_repetitions_split_the_budget_and_average():
    d, epsilon, b = 3, 3.0, 3
    mech = mechanisms.create("vqsgd", epsilon, d, {"repetitions": b})
    assert mech.epsilon_repetition == 1.0
    accounting = mech.accounting()
    assert accounting.epsilon_claimed == accounting.epsilon_worst_case == epsilon
    assert accounting.bits == b * 3  # ⌈log2(6)⌉ = 3
    x = torch.tensor([[0.2, -0.1, 0.4]], dtype=torch.float64)
    reports = mech.privatize(x.repeat(N, 1), streams(9, N)).reports.numpy()
    law = vq_release_law(x, 1.0)[0]
    factor = quantize.vq_debias_factor(1.0, d)
    for i in range(d):
        xi = float(x[0, i])
        variance = (d * (law[i] + law[d + i]) / factor**2 - xi**2) / b
        assert mean_matches(reports[:, i], xi, variance)
        assert variance_matches(reports[:, i], variance, mean=xi)


# ---------------------------------------------------------------- LDP-Fed
@pytest.mark.parametrize("levels,clip,alpha", [(16, 1.0, 0.5), (4, 0.2, 10.0), (64, 1.0, 0.05)])
def test_cldp_exact_ratio_is_at_most_alpha_times_the_diameter(levels, clip, alpha):
    law = cldp.cldp_law(levels, clip, alpha)
    assert torch.allclose(law.sum(1), torch.ones(levels, dtype=torch.float64))
    worst = cldp.cldp_worst_case(levels, clip, alpha)
    assert 0 < worst <= alpha * 2 * clip + 1e-12
    # α-CLDP: P(y|x) ≤ e^{α·|x − x'|}·P(y|x') for every pair of grid points.
    grid = cldp.cldp_grid(levels, clip)
    log_law = law.log()
    distance = (grid.unsqueeze(1) - grid.unsqueeze(0)).abs()
    gap = (log_law.unsqueeze(1) - log_law.unsqueeze(0)).amax(-1)  # [x, x'] max over y
    assert (gap <= alpha * distance + 1e-12).all()


def test_ldp_fed_accounting_composes_over_the_selected_values():
    mech = mechanisms.create("ldp-fed", 2.0, 1000, {"fraction": 0.01, "levels": 16})
    assert mech.k == 10 and mech.alpha == pytest.approx(2.0 / (10 * 2.0))
    accounting = mech.accounting()
    assert accounting.epsilon_claimed == 2.0 and accounting.epsilon_worst_case <= 2.0 + 1e-12
    assert accounting.epsilon_worst_case == pytest.approx(10 * cldp.cldp_worst_case(16, 1.0, mech.alpha))
    assert accounting.bits == 10 * (4 + 10)


def test_ldp_fed_sampler_matches_the_exponential_mechanism_with_power():
    dims, levels, epsilon = 1, 8, 3.0
    mech = mechanisms.create("ldp-fed", epsilon, dims, {"fraction": 1.0, "levels": levels, "clip": 1.0})
    grid = cldp.cldp_grid(levels, 1.0)
    x = float(grid[5])  # a grid point: no rounding
    reports = mech.privatize(torch.full((N, 1), x, dtype=torch.float64), streams(10, N)).reports.numpy()[:, 0]
    released = np.abs(reports[:, None] - grid.numpy()[None, :]).argmin(1)
    law = cldp.cldp_law(levels, 1.0, mech.alpha)[5].numpy()
    assert frequencies_match(np.bincount(released, minlength=levels), law)
    wrong = cldp.cldp_law(levels, 1.0, 1.5 * mech.alpha)[5].numpy()
    assert not frequencies_match(np.bincount(released, minlength=levels), wrong)
    # Off-grid values are rounded without bias first: the law is the mixture of two rows.
    between = 0.5 * (float(grid[2]) + float(grid[3]))
    reports = mech.privatize(torch.full((N, 1), between, dtype=torch.float64), streams(11, N)).reports.numpy()[:, 0]
    released = np.abs(reports[:, None] - grid.numpy()[None, :]).argmin(1)
    mixture = 0.5 * (cldp.cldp_law(levels, 1.0, mech.alpha)[2] + cldp.cldp_law(levels, 1.0, mech.alpha)[3]).numpy()
    assert frequencies_match(np.bincount(released, minlength=levels), mixture)


def test_ldp_fed_scales_the_selected_coordinates_by_d_over_k():
    mech = mechanisms.create("ldp-fed", 50.0, 20, {"fraction": 0.25, "levels": 2, "clip": 1.0})
    out = mech.privatize(torch.ones(3, 20, dtype=torch.float64), streams(12, 3)).reports
    assert ((out != 0).sum(1) == 5).all() and set(out[out != 0].abs().unique().tolist()) == {4.0}


@pytest.mark.parametrize("name,params,field", [
    ("cpsgd", {"k": 1, "m": 4}, "k"), ("cpsgd", {"k": 12, "m": 1000}, "m"), ("cpsgd", {"bits": 3}, "bits"),
    ("cpsgd", {"k": 12, "m": 4, "delta": 1.0}, "delta"),
    ("vqsgd", {"repetitions": 0}, "repetitions"), ("vqsgd", {"clip": 0.0}, "clip"),
    ("ldp-fed", {"fraction": 0.0}, "fraction"), ("ldp-fed", {"levels": 1}, "levels"),
])
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(ConfigError, match=field):
        mechanisms.create(name, 1.0, 10, params)
