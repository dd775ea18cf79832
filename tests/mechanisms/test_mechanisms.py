"""Mechanism-specific statistical checks (false-alarm rate 1e-6 each, with power checks)."""

import math

import numpy as np
import pytest
import torch

from ldpbench import mechanisms
from ldpbench.errors import ConfigError
from ldpbench.mechanisms import fedsel
from ldpbench.mechanisms.fedsel import perturbed_sampling, ps_top_probability, top_k_mask
from ldpbench.mechanisms.registry import register
from ldpbench.mechanisms.scalar import flat_sample_size, piecewise, piecewise_variance

from stats import frequencies_match, mean_matches, streams, variance_matches

SAMPLES = 400_000


def draw_pm(x: float, epsilon: float, seed: int = 0, n: int = SAMPLES) -> np.ndarray:
    return piecewise(torch.full((n,), x, dtype=torch.float64), epsilon, streams(seed, n)).numpy()


def test_pm_reference_value():
    # ../shared/reference/mechanisms.md §6: ε = 2, x = 0 gives variance 0.646.
    assert piecewise_variance(0.0, 2.0) == pytest.approx(0.646, abs=5e-4)


def test_pm_mean_check_has_power_against_a_biased_mechanism():
    # PM of a shifted input must fail the mean test (the variance test's power is checked for every
    # scalar perturber in test_privacy).
    x, epsilon = 0.3, 2.0
    biased = draw_pm(x + 0.02, epsilon, seed=2)
    assert not mean_matches(biased, x, piecewise_variance(x, epsilon))


def test_flat_pm_is_unbiased_per_coordinate():
    dims, epsilon = 5, 1.0
    mech = mechanisms.create("pm", epsilon, dims)
    x = torch.tensor([[-0.8, -0.2, 0.0, 0.5, 1.0]], dtype=torch.float64).repeat(SAMPLES, 1)
    reports = mech.privatize(x, streams(4, x)).reports.numpy()
    k = flat_sample_size(epsilon, dims)
    for j in range(dims):
        xj = float(x[0, j])
        # Var of (d/k)·PM·1[selected] = (d/k)·(Var_PM + x²) − x².
        variance = (dims / k) * (piecewise_variance(xj, epsilon / k) + xj * xj) - xj * xj
        assert mean_matches(reports[:, j], xj, variance)
        assert variance_matches(reports[:, j], variance, mean=xj)


@pytest.mark.parametrize("dims,k,epsilon1", [(10, 3, 0.5), (100, 10, 2.0)])
def test_ps_selection_frequencies_match_p(dims, k, epsilon1):
    clients = 200_000
    gen = torch.Generator().manual_seed(5)
    magnitudes = torch.rand(clients, dims, generator=gen)
    chosen = perturbed_sampling(magnitudes, k, epsilon1, streams(6, magnitudes))[0]
    rank = (magnitudes > magnitudes.gather(1, chosen.unsqueeze(1))).sum(1)  # 0 = largest
    in_top = (rank < k).numpy()
    p = ps_top_probability(epsilon1, dims, k)
    assert frequencies_match(np.array([in_top.sum(), (~in_top).sum()]), np.array([p, 1 - p]))
    # Uniform within each set: the rank of the chosen index among the top-k is uniform.
    top_ranks = np.bincount(rank.numpy()[in_top], minlength=k)[:k]
    assert frequencies_match(top_ranks, np.full(k, 1 / k))
    # Power: the paper's literal e^{ε1·k} formula gives another p, which must be rejected.
    wrong = math.exp(epsilon1 * k) / (dims - k + math.exp(epsilon1 * k))
    assert not frequencies_match(np.array([in_top.sum(), (~in_top).sum()]), np.array([wrong, 1 - wrong]))


def test_ps_selection_likelihood_ratio_is_exactly_e_to_epsilon1():
    dims, k, epsilon1 = 20, 4, 0.7
    p = ps_top_probability(epsilon1, dims, k)
    in_top, outside = p / k, (1 - p) / (dims - k)
    assert in_top / outside == pytest.approx(math.exp(epsilon1), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_top_k_mask_is_topks_set_on_every_row_ties_and_nan_included(monkeypatch, dtype):
    """The partial sort finds the set wherever it is unique; rows with a tie at the k-th largest
    entry or a NaN, and those only, go to topk (which breaks ties its own way)."""
    generator = torch.Generator().manual_seed(11)
    rows = torch.rand(400, 101, generator=generator, dtype=dtype)
    rows[1, :] = 0.0  # all tied
    rows[2, :20] = 0.5  # a tie across the boundary (k = 10), the rest below
    rows[2, 20:] = 0.25
    rows[3, 7] = math.nan
    rows[4, :] = rows[4, 0]
    rows[4, 5] = math.inf
    rows[5, :] = -0.0
    rows[5, :3] = 0.0  # −0 and 0 tie
    rows[6, :10] = 0.75  # tied within the top ten only: the set is unique
    rows[7, 0] = -math.inf
    rows[8] = torch.arange(101, dtype=dtype) // 2  # pairs tied everywhere
    sent = []
    by_topk = fedsel._top_k_mask_by_topk
    monkeypatch.setattr(fedsel, "_top_k_mask_by_topk", lambda values, k: sent.append(len(values)) or by_topk(values, k))
    for k in (1, 2, 10, 50, 100):
        sent.clear()
        mask = top_k_mask(rows, k)
        assert torch.equal(mask, by_topk(rows, k)), k
        assert mask.sum(dim=1).eq(k).all()
        assert sent and sum(sent) < 10, (k, sent)  # only the rows built with ties or NaN
    sent.clear()
    assert torch.equal(top_k_mask(rows[9:], 10), by_topk(rows[9:], 10)) and not sent
    assert torch.equal(top_k_mask(rows[:3], 101), torch.ones(3, 101, dtype=torch.bool))


def test_fedsel_residual_accumulation_and_momentum():
    mech = mechanisms.create("ps-pm", 4.0, 6, {"k_fraction": 0.5, "eta": 0.5})
    previous = torch.tensor([[0.1, 0.0, -0.2, 0.0, 0.0, 0.3]])
    gradient = torch.tensor([[0.2, 0.1, 0.1, 0.0, 0.05, 0.0]])
    out = mech.privatize(gradient, streams(7, gradient), previous)
    j = int(out.reports[0].nonzero()[0, 0])
    assert out.reports[0].count_nonzero() == 1
    expected_residual = previous + gradient
    expected_residual[0, j] = 0.0
    torch.testing.assert_close(out.state, expected_residual)


def test_fedsel_selected_value_includes_momentum():
    # With k = d the top set is everything and PS never leaves it; a huge ε2 makes PM nearly exact.
    mech = mechanisms.create("ps-pm", 200.0, 1, {"k_fraction": 1.0, "eta": 0.5, "mu": 0.0})
    previous, gradient = torch.tensor([[0.2]]), torch.tensor([[0.1]])
    out = mech.privatize(gradient, streams(8, gradient), previous)
    assert float(out.reports[0, 0]) == pytest.approx(0.3 + 0.5 * 0.2, abs=1e-6)


def test_registry_refuses_unknown_and_duplicate_names():
    with pytest.raises(ConfigError, match="unknown mechanism 'nope'"):
        mechanisms.create("nope", 1.0, 10)
    with pytest.raises(ValueError, match="registered twice"):
        register(mechanisms.get("pm"))
