"""Privacy verification: exact likelihood ratios where outputs are discrete, analytic density
ratios where they are continuous, and every sampler tested against the law the ratio was computed
from (false-alarm rate 1e-6 each), with a power check that a mis-calibrated sampler is rejected.
"""

import math

import numpy as np
import pytest
import torch

from ldpbench import mechanisms
from ldpbench.errors import ConfigError
from ldpbench.mechanisms import bitrand, fedsel, scalar
from ldpbench.mechanisms.ldpfl import ldp_fl_plus_probability
from ldpbench.rng import ClientStreams

from stats import EdgeStreams, frequencies_match, mean_matches, streams, variance_matches

N = 200_000
X_GRID = np.linspace(-1, 1, 41)


def sample(perturber, x, epsilon, seed=0, n=N):
    return perturber.sample(torch.full((n,), float(x), dtype=torch.float64), epsilon, streams(seed, n)).numpy()


def discrete_counts(samples, outputs):
    return np.array([np.isclose(samples, o).sum() for o in outputs])


# ---------------------------------------------------------------- discrete scalar perturbers
@pytest.mark.parametrize("name", ["duchi", "three-outputs"])
@pytest.mark.parametrize("epsilon", [0.5, 1.2, 3.0])
def test_discrete_perturber_exact_likelihood_ratio(name, epsilon):
    perturber = scalar.SCALAR_PERTURBERS[name]
    laws = np.array([perturber.pmf(float(x), epsilon)[1] for x in X_GRID])  # [x, output]
    assert np.allclose(laws.sum(axis=1), 1.0) and (laws >= 0).all()
    possible = laws.max(axis=0) > 0  # outputs that never occur (0 below ln 2) carry no ratio
    ratio = np.log(laws[:, possible].max(axis=0) / laws[:, possible].min(axis=0)).max()
    assert ratio == pytest.approx(epsilon, abs=1e-9)


@pytest.mark.parametrize("name", ["duchi", "three-outputs"])
@pytest.mark.parametrize("x", [-0.6, 0.2, 1.0])
def test_discrete_sampler_matches_its_pmf_with_power(name, x):
    perturber, epsilon = scalar.SCALAR_PERTURBERS[name], 1.2
    outputs, probabilities = perturber.pmf(x, epsilon)
    assert frequencies_match(discrete_counts(sample(perturber, x, epsilon), outputs), np.array(probabilities))
    # Power: a sampler run at 1.5·ε (less noise than claimed) is rejected.
    wrong_outputs = perturber.pmf(x, 1.5 * epsilon)[0]
    wrong = sample(perturber, x, 1.5 * epsilon, seed=1)
    assert not frequencies_match(discrete_counts(wrong, wrong_outputs), np.array(probabilities))


def test_three_outputs_reference_values():
    outputs, (p_minus, p_zero, p_plus) = scalar.three_outputs_pmf(0.5, 2.0)
    assert (p_plus, p_zero, p_minus) == pytest.approx((0.447, 0.447, 0.107), abs=5e-4)
    assert scalar.three_outputs_p0(math.log(2.0)) == pytest.approx(0.0, abs=1e-9)
    assert scalar.three_outputs_p0(1.7104) == pytest.approx(0.73444, abs=1e-4)


# ---------------------------------------------------------------- continuous scalar perturbers
SUPPORT = {"laplace": lambda e: 12.0, "pm": scalar.piecewise_bound,
           "pm-sub": lambda e: float(scalar.pm_sub_law(0.0, e).bound)}
BOUNDED_SUPPORT = ("pm", "pm-sub")  # Laplace's 12 is where the density checks stop, not a bound


@pytest.mark.parametrize("name", ["laplace", "pm", "pm-sub"])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_continuous_perturber_density_ratio(name, epsilon):
    perturber = scalar.SCALAR_PERTURBERS[name]
    bound = SUPPORT[name](epsilon)
    y = np.linspace(-bound, bound, 4001)
    densities = np.array([perturber.density(y, float(x), epsilon) for x in X_GRID])
    ratio = np.log(densities.max(axis=0) / densities.min(axis=0)).max()
    assert ratio == pytest.approx(epsilon, abs=1e-9)


@pytest.mark.parametrize("name", ["laplace", "pm", "pm-sub"])
def test_continuous_sampler_matches_its_density_with_power(name):
    perturber, epsilon, x = scalar.SCALAR_PERTURBERS[name], 1.0, 0.4
    bound = SUPPORT[name](epsilon)
    edges = np.linspace(-bound, bound, 31)
    fine = np.linspace(-bound, bound, 30 * 400 + 1)
    mids, width = (fine[:-1] + fine[1:]) / 2, fine[1] - fine[0]
    mass = perturber.density(mids, x, epsilon) * width
    expected = np.add.reduceat(mass, np.arange(0, len(mass), 400))
    tail = 1.0 - expected.sum()  # Laplace mass outside [-bound, bound]
    probabilities = np.append(expected, tail) if tail > 1e-12 else expected / expected.sum()

    def counts(samples):
        inside = np.histogram(samples, bins=edges)[0]
        return np.append(inside, len(samples) - inside.sum()) if tail > 1e-12 else inside

    assert frequencies_match(counts(sample(perturber, x, epsilon)), probabilities)
    assert not frequencies_match(counts(sample(perturber, x, 1.5 * epsilon, seed=1)), probabilities)


def test_hybrid_is_a_checked_mixture():
    epsilon, x = 2.0, 0.3
    hm = scalar.SCALAR_PERTURBERS["hm"]
    weight = scalar.hybrid_pm_weight(epsilon)
    assert weight == pytest.approx(1 - math.exp(-1.0)) and scalar.hybrid_pm_weight(0.6) == 0.0
    samples = sample(hm, x, epsilon)
    b = scalar.duchi_bound(epsilon)
    outputs, probabilities = scalar.duchi_pmf(x, epsilon)
    atoms = discrete_counts(samples, outputs)
    # Atoms at ±B come only from the Duchi part (PM has no atoms): (1 − a)·pmf, the rest continuous.
    expected = np.array([(1 - weight) * probabilities[0], (1 - weight) * probabilities[1], weight])
    assert frequencies_match(np.append(atoms, N - atoms.sum()), expected)
    assert abs(samples).max() <= max(b, scalar.piecewise_bound(epsilon))


# ---------------------------------------------------------------- unbiasedness and variance
@pytest.mark.parametrize("name", sorted(scalar.SCALAR_PERTURBERS))
@pytest.mark.parametrize("epsilon", [0.5, 1.2, 3.0])
@pytest.mark.parametrize("x", [-0.7, 0.0, 0.9])
def test_scalar_perturbers_unbiased_with_exact_variance(name, epsilon, x):
    from stats import variance_matches

    perturber = scalar.SCALAR_PERTURBERS[name]
    samples = sample(perturber, x, epsilon, n=300_000)
    variance = perturber.variance(x, epsilon)
    assert mean_matches(samples, x, variance)
    assert variance_matches(samples, variance, mean=x)
    if name in BOUNDED_SUPPORT:
        bound = SUPPORT[name](epsilon)
        assert samples.min() >= -bound and samples.max() <= bound


@pytest.mark.parametrize("name", sorted(scalar.SCALAR_PERTURBERS))
def test_variance_check_has_power(name):
    from stats import variance_matches

    perturber = scalar.SCALAR_PERTURBERS[name]
    wrong = sample(perturber, 0.3, 1.5, seed=2, n=300_000)  # run at 1.5 instead of 1.0
    assert not variance_matches(wrong, perturber.variance(0.3, 1.0), mean=0.3)


def test_pm_sub_reference_values():
    assert scalar.pm_sub_law(0.0, 1.0).bound == pytest.approx(4.110, abs=5e-4)
    assert scalar.pm_sub_law(0.0, 3.0).bound == pytest.approx(1.634, abs=5e-4)


# ---------------------------------------------------------------- FedSel selectors
def fixed_cohort(magnitudes, clients=N):
    return torch.as_tensor(magnitudes, dtype=torch.float64).repeat(clients, 1)


def test_exp_selection_exact_law_and_ratio_with_power():
    dims, epsilon1 = 6, 1.5
    magnitudes = np.array([0.3, 0.1, 0.9, 0.5, 0.2, 0.7])
    ranks = magnitudes.argsort().argsort() + 1.0
    law = fedsel.exp_probabilities(ranks, epsilon1)
    chosen = fedsel.exponential_selection(fixed_cohort(magnitudes), 2, epsilon1,
                                          streams(3, fixed_cohort(magnitudes)))[0].numpy()
    assert frequencies_match(np.bincount(chosen, minlength=dims), law)
    wrong = fedsel.exponential_selection(fixed_cohort(magnitudes), 2, 1.5 * epsilon1,
                                         streams(4, fixed_cohort(magnitudes)))[0].numpy()
    assert not frequencies_match(np.bincount(wrong, minlength=dims), law)
    # Exact ratio: the index ranked last vs first under another ranking.
    reversed_law = fedsel.exp_probabilities(dims + 1 - ranks, epsilon1)
    assert np.log(law / reversed_law).max() == pytest.approx(epsilon1, abs=1e-12)
    assert fedsel.exp_worst_case(epsilon1, dims, 2) == epsilon1


@pytest.mark.parametrize("dims,k,epsilon1,check_power", [(8, 2, 1.0, True), (20, 5, 0.3, False)])
def test_pe_selection_exact_law_with_power(dims, k, epsilon1, check_power):
    magnitudes = np.arange(dims, dtype=float)  # Top-k = the last k indices
    p = fedsel.pe_keep_probability(epsilon1)
    in_top = fedsel.pe_selection_probability(True, dims, k, epsilon1)
    outside = fedsel.pe_selection_probability(False, dims, k, epsilon1)
    empty = (1 - p) ** k * p ** (dims - k)
    law = np.array([outside] * (dims - k) + [in_top] * k + [empty])
    assert law.sum() == pytest.approx(1.0, abs=1e-12)  # the binomial law is complete
    chosen, bottom = fedsel.perturbed_encoding(fixed_cohort(magnitudes), k, epsilon1,
                                               streams(5, fixed_cohort(magnitudes)))
    counts = np.append(np.bincount(chosen.numpy()[~bottom.numpy()], minlength=dims), bottom.sum().item())
    assert frequencies_match(counts, law)
    if not check_power:  # at d = 20 the approximation is too close to tell apart at this n
        return
    # Power: the paper's Lemma 2 law (|S| replaced by its mean l) is rejected.
    mean_size = k * p + (dims - k) * (1 - p)
    approx = np.array([(1 - p) / mean_size] * (dims - k) + [p / mean_size] * k + [empty])
    approx[:-1] *= (1 - empty) / approx[:-1].sum()
    assert not frequencies_match(counts, approx)


class TiedFloat32Keys(ClientStreams):
    """Keys 1/2 + j·2^-30 (j < 64), as ClientStreams draws them: distinct in float64, and all 1/2 in
    float32, whose 24 bits are the top of the same draw."""

    def rand(self, shape, dtype=torch.float32):
        keys = (0.5 + 2.0**-30 * torch.arange(shape[-1], dtype=torch.float64)).expand(*shape)
        return keys.clone() if dtype == torch.float64 else (torch.floor(keys * 2**24) / 2**24).to(dtype)


def test_uniform_choice_is_not_decided_by_float32_ties():
    """A tie among float32 keys went to the lowest allowed index (a bias of about d·2^-24 toward it,
    which depends on the private allowed set); the full 53-bit keys break it."""
    allowed = torch.ones(3, 64, dtype=torch.bool)
    allowed[1, 40:] = False
    chosen = fedsel._uniform_choice(allowed, TiedFloat32Keys(("tie",), 3))
    assert chosen.tolist() == [63, 39, 63]  # the largest full-precision key among the allowed


def test_pe_worst_case_exceeds_the_papers_claim():
    for dims, k, epsilon1 in [(8, 2, 1.0), (100, 10, 0.2), (123, 12, 0.8)]:
        worst = fedsel.pe_worst_case(epsilon1, dims, k)
        exact = math.log(fedsel.pe_selection_probability(True, dims, k, epsilon1)
                         / fedsel.pe_selection_probability(False, dims, k, epsilon1))
        assert worst == pytest.approx(exact) and worst > epsilon1


def test_fedsel_accounting_control_and_auto_mu():
    base = mechanisms.create("ps-pm", 2.0, 100)
    assert (base.epsilon_selection, base.epsilon_value) == pytest.approx((0.2, 1.8))
    control = mechanisms.create("ps-pm", 2.0, 100, {"control": True})
    assert control.epsilon_value == 2.0 and control.accounting().epsilon_claimed == pytest.approx(2.2)
    auto = mechanisms.create("fedsel", 2.0, 100, {"mu": "auto"}, cohort_size=480)
    floor = math.sqrt(100 * math.log(100) / 480)
    assert auto.budget_share == pytest.approx(min(0.2, 1 - floor / 2.0))
    small = mechanisms.create("fedsel", 0.5, 100, {"mu": "auto"}, cohort_size=480)
    assert small.budget_share == 0.0  # too little budget: everything goes to the value stage
    pe = mechanisms.create("pe-pm", 2.0, 100)
    assert pe.accounting().epsilon_worst_case == pytest.approx(fedsel.pe_worst_case(0.2, 100, 10) + 1.8)


def test_pe_bottom_reports_nothing_and_keeps_the_residual():
    mech = mechanisms.create("pe-pm", 0.02, 4, {"k_fraction": 0.25, "mu": 0.5})  # ⊥ is likely
    updates = torch.full((2000, 4), 0.1)
    out = mech.privatize(updates, streams(6, updates))
    silent = out.reports.abs().sum(1) == 0
    assert silent.any()
    assert torch.equal(out.state[silent], updates[silent])


@pytest.mark.parametrize("name,params,field", [
    ("pm", {"bogus": 1}, "bogus"),
    ("ps-pm", {"k_fraction": 0.0}, "k_fraction"),
    ("ps-pm", {"k_fraction": 1.5}, "k_fraction"),
    ("ps-pm", {"mu": 1.0}, "mu"),
    ("ps-pm", {"eta": -1.0}, "eta"),
    ("fedsel", {"selector": "top"}, "selector"),
    ("fedsel", {"perturber": "gauss"}, "perturber"),
    ("fedsel", {"mu": "sometimes"}, "mu"),
    ("ps-pm", {"selector": "exp"}, "selector"),  # fixed by the preset's name
    ("pm-rp", {"ratio": 0.0}, "ratio"),
    ("ldp-fl", {"radius": 0.0}, "radius"),
    ("bitrand", {"l": 5, "m": 5}, "m < l"),
    ("bitrand", {"eps_y": 0.0}, "eps_y"),
    ("bitrand", {"labels": "flip"}, "labels"),
    ("latent", {"alpha": -1.0}, "alpha"),
    ("flat-release", {"perturber": "gaussian"}, "perturber"),
    ("flat-release", {"eps_y": -1.0}, "eps_y"),
])
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(ConfigError, match=field):
        mechanisms.create(name, 1.0, 10, params)


def test_k_larger_than_d_is_impossible():
    assert mechanisms.create("ps-pm", 1.0, 10, {"k_fraction": 1.0}).k == 10
    with pytest.raises(ConfigError, match="k_fraction"):
        mechanisms.create("ps-pm", 1.0, 10, {"k_fraction": 1.5})


# ---------------------------------------------------------------- LDP-FL
@pytest.mark.parametrize("anonymizer", [False, True])
def test_ldp_fl_exact_ratio_unbiased_and_composition(anonymizer):
    dims, epsilon = 5, 2.0
    mech = mechanisms.create("ldp-fl", epsilon, dims, {"anonymizer": anonymizer})
    eps = mech.epsilon_coordinate
    plus = np.array([ldp_fl_plus_probability(w, eps, 0.0, 1.0) for w in X_GRID])
    ratio = max(np.log(plus.max() / plus.min()), np.log((1 - plus).max() / (1 - plus).min()))
    assert ratio == pytest.approx(eps, abs=1e-12)
    accounting = mech.accounting()
    assert accounting.epsilon_worst_case == pytest.approx(dims * eps)
    assert accounting.epsilon_claimed == epsilon and accounting.claimed_composes == (not anonymizer)
    w = torch.tensor([[-1.0, -0.3, 0.0, 0.5, 1.0]], dtype=torch.float64).repeat(N, 1)
    out = mech.privatize(w, streams(7, w)).reports.numpy()
    half = (math.exp(eps) + 1) / (math.exp(eps) - 1)
    for j in range(dims):
        wj = float(w[0, j])
        assert mean_matches(out[:, j], wj, half**2 - wj**2)
        p = ldp_fl_plus_probability(wj, eps, 0.0, 1.0)
        positives = int((out[:, j] > 0).sum())
        if 0 < p < 1:
            assert frequencies_match(np.array([positives, N - positives]), np.array([p, 1 - p]))


@pytest.mark.parametrize("name", sorted(scalar.SCALAR_PERTURBERS))
def test_flat_anonymizer_perturbs_every_coordinate_with_the_whole_budget(name):
    """anonymizer: each of the d coordinates is the scalar perturber at ε (whose law and ratio are
    checked above), unscaled; the claim is ε per report, not composed; the worst case d·ε."""
    dims, epsilon = 6, 1.5
    mech = mechanisms.create(name, epsilon, dims, {"anonymizer": True})
    raw = torch.tensor([[-1.7, -0.4, 0.0, 0.3, 0.8, 2.0]], dtype=torch.float64).repeat(N, 1)
    out = mech.privatize(raw, streams(15, raw)).reports
    x = raw.clamp(-1.0, 1.0)  # clipped first
    torch.testing.assert_close(out, scalar.SCALAR_PERTURBERS[name].sample(x, epsilon, streams(15, x)),
                               rtol=0, atol=0)
    perturber = scalar.SCALAR_PERTURBERS[name]
    for j, xj in enumerate(x[0].tolist()):
        assert mean_matches(out[:, j].numpy(), xj, perturber.variance(xj, epsilon))
        assert variance_matches(out[:, j].numpy(), perturber.variance(xj, epsilon), xj)
    # Power: the variance of a budget split over the d coordinates (ε/d each) is rejected.
    assert not any(variance_matches(out[:, j].numpy(), perturber.variance(xj, epsilon / dims), xj)
                   for j, xj in enumerate(x[0].tolist()))
    accounting = mech.accounting()
    assert accounting.epsilon_claimed == epsilon and not accounting.claimed_composes
    assert accounting.epsilon_worst_case == pytest.approx(dims * epsilon)
    assert accounting.bits == dims * perturber.value_bits(epsilon)


def test_flat_anonymizer_column_blocks_keep_reports_independent_of_the_chunk():
    dims = 2 * scalar.ANONYMIZER_BLOCK_COLUMNS + 5  # three column blocks, the last one short
    mech = mechanisms.create("hm", 1.0, dims, {"anonymizer": True})
    updates = torch.rand(6, dims, generator=torch.Generator().manual_seed(4)) * 2 - 1
    ids = torch.arange(30, 36)
    whole = mech.privatize(updates, ClientStreams(("blocks",), ids)).reports
    parts = [mech.privatize(updates[rows], ClientStreams(("blocks",), ids[rows])).reports
             for rows in torch.arange(6).split(4)]
    assert torch.equal(torch.cat(parts), whole)
    assert not torch.equal(whole[:, :100], whole[:, -100:])  # blocks draw fresh numbers


# ---------------------------------------------------------------- BitRand family
def test_binary_encoding_round_trip():
    l, m = 10, 5
    values = torch.tensor([0.0, 0.0625, -0.5, 3.25, -17.9375, 31.9375, -31.9375])
    torch.testing.assert_close(bitrand.decode(bitrand.encode(values, l, m), l, m), values)
    clipped = bitrand.decode(bitrand.encode(torch.tensor([100.0, -100.0]), l, m), l, m)
    torch.testing.assert_close(clipped, torch.tensor([31.9375, -31.9375]))
    assert bitrand.largest_encodable(l, m) == 31.9375


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("l,m", [(10, 5), (6, 1)])
def test_decoding_keeps_every_released_bit_a_zero_magnitudes_sign_included(l, m, dtype):
    """Every l-bit pattern decodes to a value that encodes back to it; an all-zero magnitude decodes
    to 0 (the paper's E) carrying the released sign bit: +0.0 for sign 1, −0.0 for sign 0."""
    codes = torch.arange(2**l)
    bits = ((codes.unsqueeze(1) >> torch.arange(l - 1, -1, -1)) & 1).to(torch.bool)  # bit 0 = sign
    decoded = bitrand.decode(bits, l, m, dtype)
    assert torch.equal(bitrand.encode(decoded, l, m), bits)
    zero_magnitude = ~bits[:, 1:].any(dim=1)
    assert zero_magnitude.sum() == 2 and (decoded[zero_magnitude] == 0).all()
    assert torch.equal(torch.signbit(decoded[zero_magnitude]), ~bits[zero_magnitude, 0])


def test_bitrand_report_of_all_zero_released_bits_is_a_negative_zero():
    """Every uniform at the top edge keeps no bit at 1: each feature is released as sign 0 with a zero
    magnitude, and its report is −0.0, which encodes back to those bits."""
    mech = mechanisms.create("bitrand", 1.0, 4)
    features = torch.rand(3, 4, generator=torch.Generator().manual_seed(1))
    reports = mech.release_features(features, EdgeStreams("high", 3))
    assert (reports == 0).all() and torch.signbit(reports).all()
    assert not bitrand.encode(reports, mech.l, mech.m).any()


def test_frr_reference_values():
    # ../shared/reference/mechanisms.md §6 (r = 768, l = 10, ε_X = 1).
    assert bitrand.frr_alpha(1.0, 768, 10) == pytest.approx(0.4163, abs=5e-5)
    q = bitrand.frr_flip_probabilities(1.0, 768, 10).numpy()
    expected = [0.294, 0.315, 0.337, 0.360, 0.383, 0.407, 0.431, 0.456, 0.481, 0.506]
    assert q == pytest.approx(expected, abs=5e-4)
    mech = mechanisms.create("bitrand", 1.0, 768, {"eps_y": 1.0})
    features_worst = 768 * np.abs(np.log((1 - q) / q)).sum()
    assert mech.feature_worst_case() == pytest.approx(features_worst)
    assert features_worst == pytest.approx(3311, rel=2e-3)
    assert mech.accounting().epsilon_claimed == 2.0
    assert mech.accounting().epsilon_worst_case == pytest.approx(features_worst + 1.0)


@pytest.mark.parametrize("name", ["bitrand", "latent", "ome"])
def test_bit_randomisation_matches_its_law_with_power(name):
    dims, l, m = 2, 10, 5
    mech = mechanisms.create(name, 1.0, dims, {"l": l, "m": m})
    p1, p0 = (p.view(dims, l).numpy() for p in mech.bit_probabilities())
    value = torch.tensor([[5.5, -0.8125]], dtype=torch.float64)
    bits = bitrand.encode(value, l, m)[0].numpy()
    clients = 100_000
    released = mech.release_features(value.repeat(clients, 1), streams(8, clients))
    ones = bitrand.encode(released, l, m).numpy().sum(axis=0)  # [dims, l]
    law = np.where(bits, p1, p0)
    for i in range(dims):
        for j in range(l):
            assert frequencies_match(np.array([ones[i, j], clients - ones[i, j]]),
                                     np.array([law[i, j], 1 - law[i, j]]))
    # Exact per-bit ratio: the worst case is the sum over bits of the larger output ratio.
    per_bit = np.maximum(np.abs(np.log(p1 / p0)), np.abs(np.log((1 - p1) / (1 - p0))))
    assert mech.feature_worst_case() == pytest.approx(per_bit.sum())
    # Power: a law computed with twice the budget is rejected on some bit.
    wrong = mechanisms.create(name, 2.0 * dims * l if name != "bitrand" else 3.0, dims, {"l": l, "m": m})
    w1, w0 = (p.view(dims, l).numpy() for p in wrong.bit_probabilities())
    wrong_law = np.where(bits, w1, w0)
    if not np.allclose(wrong_law, law):
        assert not all(
            frequencies_match(np.array([ones[i, j], clients - ones[i, j]]),
                              np.array([wrong_law[i, j], 1 - wrong_law[i, j]]))
            for i in range(dims) for j in range(l))


@pytest.mark.parametrize("perturber", sorted(scalar.SCALAR_PERTURBERS))
def test_flat_release_features_are_the_flat_mechanism_applied_once(perturber):
    """The release of a record's features is exactly the flat mechanism's report (same draws), so the
    flat mechanisms' privacy checks cover it; the accounting adds the label's ε_Y."""
    dims, epsilon = 16, 7.5
    features = torch.rand(500, dims, generator=torch.Generator().manual_seed(3)) * 0.6 - 0.3
    release = mechanisms.create("flat-release", epsilon, dims, {"perturber": perturber, "eps_y": 2.0}, classes=4)
    flat = mechanisms.create(perturber, epsilon, dims)
    released = release.release_features(features, streams(12, features))
    assert torch.equal(released, flat.privatize(features, streams(12, features)).reports)
    assert (released != 0).sum(dim=1).max() <= flat.k  # k = ⌊ε/2.5⌋ = 3 coordinates per record
    accounting = release.accounting()
    assert accounting.epsilon_claimed == accounting.epsilon_worst_case == epsilon + 2.0
    assert accounting.bits == flat.accounting().bits + 2  # + ⌈log2 4⌉ label bits
    in_clear = mechanisms.create("flat-release", epsilon, dims, {"perturber": perturber, "eps_y": math.inf})
    assert math.isinf(in_clear.accounting().epsilon_claimed) and math.isinf(in_clear.accounting().epsilon_worst_case)
    labels = torch.arange(4).repeat(25)
    assert torch.equal(in_clear.release_labels(labels, streams(13, labels)), labels)


def test_flat_release_duchi_exact_law_with_power():
    """DM on a 3-feature record at ε_X = 2.5 (k = 1): coordinate j uniform, value ±B·3; the exact
    law of the 6 outputs is matched, and the law at 1.5·ε_X is rejected."""
    dims, epsilon, x = 3, 2.5, torch.tensor([[0.3, -0.2, 0.9]])
    released = mechanisms.create("flat-release", epsilon, dims, {"perturber": "duchi"}).release_features(
        x.repeat(N, 1), streams(14, N)).numpy()
    column = np.abs(released).argmax(axis=1)
    positive = released[np.arange(N), column] > 0
    assert np.allclose(np.abs(released[np.arange(N), column]), dims * scalar.duchi_bound(epsilon))
    counts = np.bincount(2 * column + positive, minlength=2 * dims)

    def law(budget, record):
        up = np.array([scalar.duchi_pmf(float(v), budget)[1][1] for v in record])
        return np.stack([1 - up, up], axis=1).reshape(-1) / dims

    for budget in (epsilon, 1.5 * epsilon):
        assert frequencies_match(counts, law(budget, x[0])) == (budget == epsilon)
    # Exact worst case of the release: the extreme records ±(1, 1, 1) differ by e^ε on every output.
    ratio = np.log(law(epsilon, [1.0] * dims) / law(epsilon, [-1.0] * dims))
    assert np.abs(ratio).max() == pytest.approx(epsilon)


def test_label_randomised_response_exact_law():
    classes, epsilon_y = 4, 1.5
    keep = bitrand.label_rr_keep_probability(epsilon_y, classes)
    other = (1 - keep) / (classes - 1)
    assert math.log(keep / other) == pytest.approx(epsilon_y)
    labels = torch.full((N,), 2)
    released = bitrand.label_rr(labels, epsilon_y, classes, streams(9, labels)).numpy()
    law = np.array([other, other, keep, other])
    assert frequencies_match(np.bincount(released, minlength=classes), law)
    wrong = np.array([1, 1, 0, 1]) * (1 - bitrand.label_rr_keep_probability(1.2, classes)) / 3
    wrong[2] = bitrand.label_rr_keep_probability(1.2, classes)
    assert not frequencies_match(np.bincount(released, minlength=classes), wrong)


def test_label_laplace_flip_probability():
    epsilon_y, scale = 1.0, 2.0
    flip = 0.5 * math.exp(-1 / scale) * (1 + 1 / (2 * scale))  # P(L2 − L1 > 1), L iid Laplace(2/ε)
    released = bitrand.label_laplace(torch.zeros(N, dtype=torch.int64), epsilon_y, 2, streams(10, N)).numpy()
    flips = int(released.sum())
    assert frequencies_match(np.array([flips, N - flips]), np.array([flip, 1 - flip]))


# ---------------------------------------------------------------- edges of the uniform draws
@pytest.mark.slow
def test_laplace_perturber_gives_no_non_finite_value_in_a_large_sample():
    """2·10⁸ float32 draws in chunks of 10⁷. A uniform of exactly 0 (probability 2^-24 per value,
    about 12 expected here) made the old inverse CDF return −∞; the open-interval uniform cannot."""
    laplace, clients, columns = scalar.SCALAR_PERTURBERS["laplace"], 1000, 10_000
    x = torch.zeros(clients, columns)
    non_finite = 0
    for chunk in range(20):
        noisy = laplace.sample(x, 1.0, ClientStreams(("large Laplace draw", chunk), clients))
        non_finite += int((~torch.isfinite(noisy)).sum())
    assert non_finite == 0
