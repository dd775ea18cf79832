"""Count sketch, DiffSketch (Theorem 2, validation noise, App. C flags) and the Laplace baselines.

Statistical checks reject a correct implementation with probability ≤ 1e-6 each (tests/stats.py)
and each is paired with a power check that a mis-scaled mechanism is rejected.
"""

import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from ldpbench import mechanisms
from ldpbench.errors import ConfigError
from ldpbench.mechanisms import sketch as cs
from ldpbench.mechanisms.base import Accounting
from ldpbench.rng import ClientStreams

from stats import audited_epsilon, frequencies_match, mean_matches, streams, variance_matches

SEED, ROWS, COLUMNS = 3, 5, 16


def laplace_matches(samples: np.ndarray, scale: float, bins: int = 40) -> bool:
    """Chi-squared fit of Laplace(0, scale) on equal-probability bins (false alarm 1e-6)."""
    edges = scipy_stats.laplace.ppf(np.linspace(0, 1, bins + 1), scale=scale)
    counts = np.histogram(samples, bins=edges)[0]
    return frequencies_match(counts, np.full(bins, 1 / bins)) and counts.sum() == samples.size


# ---------------------------------------------------------------- count sketch
def test_hashes_are_public_in_range_and_seeded():
    cells, signs = cs.count_sketch_hashes(SEED, ROWS, COLUMNS, 1000)
    buckets = cells - torch.arange(ROWS).unsqueeze(1) * COLUMNS
    assert buckets.min() >= 0 and buckets.max() < COLUMNS
    assert set(signs.unique().tolist()) == {-1.0, 1.0}
    again = cs.count_sketch_hashes(SEED, ROWS, COLUMNS, 1000)
    assert torch.equal(cells, again[0]) and torch.equal(signs, again[1])
    assert not torch.equal(cells, cs.count_sketch_hashes(SEED + 1, ROWS, COLUMNS, 1000)[0])
    # A longer vector keeps the hashes of its first coordinates (appended noise is queryable).
    longer = cs.count_sketch_hashes(SEED, ROWS, COLUMNS, 1500)
    assert torch.equal(longer[0][:, :1000], cells) and torch.equal(longer[1][:, :1000], signs)
    # Buckets are close to uniform (a loose check of the hash family, not a privacy claim).
    counts = np.bincount(buckets.reshape(-1).numpy(), minlength=COLUMNS)
    assert frequencies_match(counts, np.full(COLUMNS, 1 / COLUMNS))


def test_merge_by_addition_is_the_sketch_of_the_sum():
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(6, 500, generator=gen, dtype=torch.float64)
    tables = cs.sketch(g, SEED, ROWS, COLUMNS)
    torch.testing.assert_close(tables.sum(0), cs.sketch(g.sum(0, keepdim=True), SEED, ROWS, COLUMNS)[0])
    # The table is exactly Alg. 1's loop.
    cells, signs = cs.count_sketch_hashes(SEED, ROWS, COLUMNS, 500)
    expected = torch.zeros(ROWS * COLUMNS, dtype=torch.float64)
    for j in range(ROWS):
        for i in range(500):
            expected[cells[j, i]] += signs[j, i] * g[0, i]
    torch.testing.assert_close(tables[0], expected)


@pytest.mark.parametrize("rows", [5, 6])
def test_median_query_is_exact_for_a_one_sparse_vector(rows):
    n, i, value = 300, 17, -2.5
    g = torch.zeros(1, n, dtype=torch.float64)
    g[0, i] = value
    estimate = cs.query(cs.sketch(g, SEED, rows, COLUMNS)[0], SEED, rows, COLUMNS, n)
    assert estimate[i] == value
    # Any other coordinate is exactly 0 unless it shares i's bucket in at least half of the rows.
    cells, _ = cs.count_sketch_hashes(SEED, rows, COLUMNS, n)
    collisions = (cells == cells[:, i:i + 1]).sum(0)
    quiet = collisions < rows / 2
    quiet[i] = False
    assert quiet.sum() > n // 2 and (estimate[quiet] == 0).all()


def test_median_of_an_even_count_is_the_midpoint():
    values = torch.tensor([[4.0, 1.0, 3.0, 2.0]])
    assert cs.median(values, dim=1).item() == 2.5
    assert cs.median(values[:, :3], dim=1).item() == 3.0


# ---------------------------------------------------------------- Theorem 2
def test_theorem2_epsilon_against_a_hand_computed_value():
    # α = 0.5, σ² = 1, n = 10002, k = 10, t = 5:
    # X = 0.25·90·(1 + ln 9992)/10000 = 0.0229715; β = 1/(1/2 − X); ε = 5·ln(1 + βX) = 0.2351589.
    x = cs.theorem2_x(0.5, 1.0, 10002, 10)
    assert float(x) == pytest.approx(0.02297146511656218, rel=1e-12)
    assert float(cs.theorem2_epsilon(0.5, 1.0, 10002, 5, 10)) == pytest.approx(0.23515893882259375, rel=1e-12)
    # The closed form t·ln(1/(1 − 2X)) (reference §6) and the β form agree on a grid of X.
    for alpha in (0.1, 0.3, 0.6):
        x = float(cs.theorem2_x(alpha, 1.0, 10002, 10))
        beta = 1 / (0.5 - x)
        assert float(cs.theorem2_epsilon(alpha, 1.0, 10002, 5, 10)) == pytest.approx(5 * math.log(1 + beta * x))


def test_theorem2_does_not_apply_at_or_above_one_half():
    alpha = math.sqrt(0.5 * 10000 / (90 * (1 + math.log(9992))))  # X = 1/2 exactly
    assert math.isinf(float(cs.theorem2_epsilon(alpha * 1.0001, 1.0, 10002, 5, 10)))
    assert math.isfinite(float(cs.theorem2_epsilon(alpha * 0.999, 1.0, 10002, 5, 10)))
    assert math.isinf(float(cs.theorem2_epsilon(0.1, 0.0, 10002, 5, 10)))  # σ² = 0
    assert math.isinf(float(cs.theorem2_epsilon(0.1, 1.0, 10, 5, 10)))  # n ≤ k


def test_gradient_statistics_are_the_90th_percentile_and_the_variance():
    g = torch.randn(3, 1001, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    alpha, variance = cs.gradient_statistics(g)
    np.testing.assert_allclose(alpha.numpy(), np.percentile(np.abs(g.numpy()), 90, axis=1))
    np.testing.assert_allclose(variance.numpy(), g.numpy().var(axis=1))


# ---------------------------------------------------------------- DiffSketch
def sparse_gradient(clients, n, seed=0):
    """95% zeros: α (90th percentile of |g|) is 0, so X = 0 and Theorem 2 claims ε = 0."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.zeros(clients, n, dtype=torch.float64)
    g[:, : n // 20] = torch.randn(clients, n // 20, generator=gen, dtype=torch.float64)
    return g


def test_diffsketch_adds_no_noise_when_theorem2_meets_the_target():
    mech = mechanisms.create("diffsketch", 1.0, 2000, {"rows": ROWS, "columns": COLUMNS, "hash_seed": SEED})
    g = sparse_gradient(4, 2000)
    assert (mech.client_epsilon(g) == 0).all() and not mech.noised(g).any()
    out = mech.privatize(g, streams(1, g))
    torch.testing.assert_close(out.reports, cs.sketch(g, SEED, ROWS, COLUMNS), rtol=0, atol=0)
    # The server's estimate is the median query of the mean sketch.
    torch.testing.assert_close(mech.aggregate(out.reports), cs.query(out.reports.mean(0), SEED, ROWS, COLUMNS, 2000))


def test_diffsketch_validation_noise_is_laplace_with_scale_2_alpha_t_over_epsilon():
    n, epsilon, clients = 400, 0.5, 4000
    mech = mechanisms.create("diffsketch", epsilon, n, {"rows": ROWS, "columns": COLUMNS, "hash_seed": SEED})
    g = torch.randn(1, n, generator=torch.Generator().manual_seed(2), dtype=torch.float64).repeat(clients, 1)
    assert mech.noised(g).all()  # Gaussian input at n = 400: X ≥ 1/2, the theorem does not apply
    alpha = float(cs.gradient_statistics(g[:1])[0])
    scale = 2 * alpha * ROWS / epsilon
    noise = (mech.privatize(g, streams(2, g)).reports - cs.sketch(g, SEED, ROWS, COLUMNS)).numpy().ravel()
    assert laplace_matches(noise, scale)
    assert variance_matches(noise, 2 * scale**2, mean=0.0)
    # Power: noise at 1.5·ε (scale / 1.5) is rejected by both checks.
    wrong = mechanisms.create("diffsketch", 1.5 * epsilon, n, {"rows": ROWS, "columns": COLUMNS, "hash_seed": SEED})
    wrong_noise = (wrong.privatize(g, streams(3, g)).reports - cs.sketch(g, SEED, ROWS, COLUMNS)).numpy().ravel()
    assert not laplace_matches(wrong_noise, scale)
    assert not variance_matches(wrong_noise, 2 * scale**2, mean=0.0)


def test_diffsketch_noise_is_decided_per_client():
    n = 2000
    mech = mechanisms.create("diffsketch", 1.0, n, {"rows": ROWS, "columns": COLUMNS, "hash_seed": SEED})
    g = torch.cat([sparse_gradient(1, n), torch.randn(1, n, dtype=torch.float64)])
    assert mech.noised(g).tolist() == [False, True]
    difference = mech.privatize(g, streams(4, g)).reports - cs.sketch(g, SEED, ROWS, COLUMNS)
    assert (difference[0] == 0).all() and (difference[1] != 0).all()


def test_diffsketch_accounting_claims_the_target_and_an_infinite_worst_case():
    mech = mechanisms.create("diffsketch", 1.0, 7850, {"rows": 7, "columns": 22})
    accounting = mech.accounting()
    assert accounting.epsilon_claimed == 1.0 and math.isinf(accounting.epsilon_worst_case)
    assert accounting.bits == 32 * 7 * 22 and mech.report_dims == 154


def test_diffsketch_appended_noise_enlarges_n_and_has_the_gradients_sigma():
    n, columns, clients = 400, 4, 1000
    params = {"rows": ROWS, "columns": columns, "hash_seed": SEED}
    plain = mechanisms.create("diffsketch", 10.0, n, params)
    padded = mechanisms.create("diffsketch", 10.0, n, {**params, "append_noise": True, "append_ratio": 3.0})
    g = torch.randn(1, n, generator=torch.Generator().manual_seed(5), dtype=torch.float64).repeat(clients, 1)
    alpha, variance = cs.gradient_statistics(g)
    torch.testing.assert_close(padded.client_epsilon(g), cs.theorem2_epsilon(alpha, variance, 4 * n, ROWS, columns))
    # At n = 400 the theorem does not apply (X ≥ 1/2); with 3n appended values it does.
    assert math.isinf(float(plain.client_epsilon(g[:1]))) and not padded.noised(g).any()
    out = padded.privatize(g, streams(6, g))
    assert out.reports.shape == (clients, ROWS * columns) and padded.report_dims == plain.report_dims
    # What the appended N(0, σ²) values add to cell b of row 0 is N(0, σ²·c_b), c_b the number of
    # appended indices hashed there; standardised, the cells of a row are i.i.d. N(0, 1).
    cells, _ = cs.count_sketch_hashes(SEED, ROWS, columns, 4 * n)
    counts = torch.bincount(cells[0, n:], minlength=columns).to(torch.float64)
    extra = (out.reports - cs.sketch(g, SEED, ROWS, columns))[:, :columns]
    sigma = float(variance[0].sqrt())

    def normal_fit(scale):
        z = (extra / (scale * counts.sqrt())).numpy().ravel()
        edges = scipy_stats.norm.ppf(np.linspace(0, 1, 21))
        return frequencies_match(np.histogram(z, bins=edges)[0], np.full(20, 1 / 20))

    assert normal_fit(sigma)
    assert not normal_fit(1.5 * sigma)  # power: noise of another σ is rejected


def test_error_correction_zeroes_the_half_farthest_from_the_local_update():
    estimate = torch.tensor([1.0, 2.0, 3.0, 4.0])
    local = torch.tensor([[1.0, 0.0, 3.0, 0.0], [0.0, 2.0, 0.0, 4.0]])
    torch.testing.assert_close(cs.error_correct(estimate, local, 0.5),
                               torch.tensor([[1.0, 0.0, 3.0, 0.0], [0.0, 2.0, 0.0, 4.0]]))
    plain = mechanisms.create("diffsketch", 1.0, 4, {"columns": 2})
    corrected = mechanisms.create("diffsketch", 1.0, 4, {"columns": 2, "error_correction": True})
    torch.testing.assert_close(plain.correct(estimate, local), estimate.expand(2, 4))
    torch.testing.assert_close(corrected.correct(estimate, local), cs.error_correct(estimate, local, 0.5))


# ---------------------------------------------------------------- Laplace baselines
@pytest.mark.parametrize("clip,norm", [(0.0, "l1"), (0.2, "l1"), (0.2, "linf")])
def test_sketch_laplace_noise_scale_and_accounting(clip, norm):
    n, epsilon, clients = 300, 2.0, 4000
    mech = mechanisms.create("sketch-laplace", epsilon, n,
                             {"rows": ROWS, "columns": COLUMNS, "hash_seed": SEED, "clip": clip, "norm": norm})
    g = torch.randn(1, n, generator=torch.Generator().manual_seed(7), dtype=torch.float64).repeat(clients, 1)
    # Half the L1 sensitivity of the clipped input: clip (ℓ1 ball), clip·d (ℓ∞ ball), or α (no clip).
    bound = (clip if norm == "l1" else clip * n) if clip else float(cs.gradient_statistics(g[:1])[0])
    clipped = cs.clip_to_ball(g, clip, norm) if clip else g
    if clip and norm == "l1":
        assert float(clipped[0].abs().sum()) == pytest.approx(clip)
    scale = 2 * bound * ROWS / epsilon
    noise = (mech.privatize(g, streams(8, g)).reports - cs.sketch(clipped, SEED, ROWS, COLUMNS)).numpy().ravel()
    assert laplace_matches(noise, scale) and variance_matches(noise, 2 * scale**2, mean=0.0)
    assert not laplace_matches(noise, 1.5 * scale)  # power: a wrong scale is rejected
    worst = mech.accounting().epsilon_worst_case
    assert worst == epsilon if clip else math.isinf(worst)


@pytest.mark.parametrize("norm", ["l1", "linf"])
def test_laplace_raw_clips_and_adds_noise_of_the_sensitivity(norm):
    dims, epsilon, clip, clients = 4, 2.0, 0.5, 100_000
    mech = mechanisms.create("laplace-raw", epsilon, dims, {"clip": clip, "norm": norm})
    x = torch.tensor([[0.3, -0.6, 0.1, 0.0]], dtype=torch.float64)
    clipped = mech.clipped(x)
    if norm == "l1":
        assert float(clipped.abs().sum()) == pytest.approx(clip)
        assert mech.scale == pytest.approx(2 * clip / epsilon)
    else:
        torch.testing.assert_close(clipped, x.clamp(-clip, clip))
        assert mech.scale == pytest.approx(2 * clip * dims / epsilon)
    reports = mech.privatize(x.repeat(clients, 1), streams(9, clients)).reports.numpy()
    for j in range(dims):
        assert mean_matches(reports[:, j], float(clipped[0, j]), 2 * mech.scale**2)
        assert variance_matches(reports[:, j], 2 * mech.scale**2, mean=float(clipped[0, j]))
    assert laplace_matches(reports[:, 0] - float(clipped[0, 0]), mech.scale)
    wrong = mechanisms.create("laplace-raw", 1.5 * epsilon, dims, {"clip": clip, "norm": norm})
    wrong_reports = wrong.privatize(x.repeat(clients, 1), streams(10, clients)).reports.numpy()
    assert not variance_matches(wrong_reports[:, 0], 2 * mech.scale**2, mean=float(clipped[0, 0]))
    accounting = mech.accounting()
    assert accounting.epsilon_claimed == accounting.epsilon_worst_case == epsilon


# ---------------------------------------------------------------- worst-case pairs (audit, false alarm 1e-6)
AUDIT_CLIENTS = 100_000


def worst_case_pair(kind: str, dims: int, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """+clip·𝟙 vs −clip·𝟙 (the extremes of the ℓ∞ ball), or ±clip·e_0 (of the ℓ1 ball)."""
    x = torch.full((1, dims), clip if kind == "ones" else 0.0, dtype=torch.float64)
    x[0, 0] = clip
    return x, -x


def reports_of(privatize, x: torch.Tensor, seed: int) -> np.ndarray:
    """Reports of AUDIT_CLIENTS copies of x, privatised in chunks (the same draws as one cohort)."""
    ids = torch.arange(AUDIT_CLIENTS)
    return np.concatenate([privatize(x.repeat(len(rows), 1), ClientStreams(("audit", seed), rows)).numpy()
                           for rows in ids.split(20_000)])


def coordinate_clip_with_one_coordinate_noise(mech):
    """The old sketch-laplace calibration, deliberately wrong: coordinates clipped to [−B, B] but noise
    of scale 2B·t/ε, which covers a change of one coordinate and not of the whole update."""
    def privatize(updates, streams):
        tables = mech.sketch(updates.clamp(-mech.clip, mech.clip))
        scale = torch.full((updates.shape[0], 1), 2.0 * mech.clip * mech.rows / mech.epsilon, dtype=torch.float64)
        return tables + cs.laplace_noise(streams, tables.shape, scale, tables.dtype)
    return privatize


@pytest.mark.slow
@pytest.mark.parametrize("norm,pair", [("l1", "ones"), ("l1", "one-hot"), ("linf", "ones")])
def test_sketch_laplace_with_clip_is_epsilon_ldp_on_worst_case_pairs(norm, pair):
    dims, epsilon, clip = 100, 1.0, 1.0
    params = {"clip": clip} if norm == "l1" else {"clip": clip, "norm": norm}  # l1 is the default
    mech = mechanisms.create("sketch-laplace", epsilon, dims, params)  # 7 × 22
    x, x_prime = worst_case_pair(pair, dims, clip)

    def privatize(updates, streams):
        return mech.privatize(updates, streams).reports

    assert audited_epsilon(reports_of(privatize, x, 1), reports_of(privatize, x_prime, 2)) <= epsilon
    assert mech.accounting().epsilon_worst_case == epsilon


@pytest.mark.slow
def test_sketch_laplace_audit_rejects_the_coordinate_clip_calibration():
    """Power: the same audit on the old calibration (the issue's pair, d = 100, ε = 1, clip = 1) finds
    ε ≥ 5.9 (these seeds) against the ε = 1 it reported as its worst case."""
    mech = mechanisms.create("sketch-laplace", 1.0, 100, {"clip": 1.0})
    wrong = coordinate_clip_with_one_coordinate_noise(mech)
    x, x_prime = worst_case_pair("ones", 100, 1.0)
    assert audited_epsilon(reports_of(wrong, x, 1), reports_of(wrong, x_prime, 2)) > 4.0


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["l1", "linf"])
@pytest.mark.parametrize("pair", ["ones", "one-hot"])
def test_laplace_raw_is_epsilon_ldp_on_worst_case_pairs(norm, pair):
    dims, epsilon, clip = 20, 1.0, 0.5
    mech = mechanisms.create("laplace-raw", epsilon, dims, {"clip": clip, "norm": norm})
    x, x_prime = worst_case_pair(pair, dims, 2 * clip)  # beyond the clip on purpose

    def privatize(updates, streams):
        return mech.privatize(updates, streams).reports

    assert audited_epsilon(reports_of(privatize, x, 3), reports_of(privatize, x_prime, 4)) <= epsilon
    # Power: ℓ∞ clipping with the noise of the ℓ1 ball (scale 2·clip/ε) is rejected by the same audit.
    if norm == "linf" and pair == "ones":
        def wrong(updates, streams):
            scale = torch.full((updates.shape[0], 1), 2.0 * clip / epsilon, dtype=torch.float64)
            return updates.clamp(-clip, clip) + cs.laplace_noise(streams, updates.shape, scale, updates.dtype)

        assert audited_epsilon(reports_of(wrong, x, 3), reports_of(wrong, x_prime, 4)) > 2 * epsilon


def test_noiseless_sketch_sends_the_plain_sketch_of_a_gaussian_update_and_claims_nothing():
    # A Gaussian update at n = 400 is where DiffSketch must noise every cell (Theorem 2 fails):
    # the reference sends the sketch itself, bit for bit, whatever the streams.
    mech = mechanisms.create("np-sketch", math.inf, 400, {"rows": ROWS, "columns": COLUMNS, "hash_seed": SEED})
    g = torch.randn(3, 400, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = mech.privatize(g, streams(1, g))
    torch.testing.assert_close(out.reports, cs.sketch(g, SEED, ROWS, COLUMNS), rtol=0, atol=0)
    torch.testing.assert_close(mech.aggregate(out.reports), cs.query(out.reports.mean(0), SEED, ROWS, COLUMNS, 400))
    assert not mech.private and mech.report_dims == ROWS * COLUMNS
    assert mech.accounting() == Accounting(math.inf, math.inf, 32 * ROWS * COLUMNS)


@pytest.mark.parametrize("name,params,field", [
    ("diffsketch", {"rows": 0}, "rows"),
    ("diffsketch", {"columns": 1}, "columns"),
    ("diffsketch", {"append_ratio": -1.0}, "append_ratio"),
    ("diffsketch", {"correction_fraction": 1.0}, "correction_fraction"),
    ("sketch-laplace", {"clip": -1.0}, "clip"),
    ("sketch-laplace", {"clip": 1.0, "norm": "l2"}, "norm"),
    ("laplace-raw", {"norm": "l2"}, "norm"),
    ("laplace-raw", {"clip": 0.0}, "clip"),
    ("np-sketch", {"rows": 0}, "rows"),
])
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(ConfigError, match=field):
        mechanisms.create(name, 1.0, 10, params)
