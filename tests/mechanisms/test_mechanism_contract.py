"""The contract every registered mechanism must meet; parametrised over the whole registry.

Update mechanisms are exercised through `privatize`/`aggregate`, data releases through `release`;
both through `stages`, their ledger and their accounting.
"""

import math

import pytest
import torch

from ldpbench import mechanisms
from ldpbench.errors import ConfigError
from ldpbench.fl.settings import TrainingSettings
from ldpbench.mechanisms.base import RECORDS, UPDATES, Accounting, DataRelease, Mechanism
from ldpbench.rng import ClientStreams

from stats import EdgeStreams, streams

ALL = mechanisms.names()
UPDATE_MECHANISMS = [name for name in ALL if mechanisms.get(name).privatises == UPDATES]
RELEASES = [name for name in ALL if mechanisms.get(name).privatises == RECORDS]
DIMS, CLIENTS = 12, 64

# How the privacy claim of each registered mechanism is verified (tests/mechanisms/test_mechanisms.py and
# tests/mechanisms/test_privacy.py run these checks). A new mechanism must be added here, or
# test_every_registered_mechanism_is_covered fails.
PRIVACY_CHECKS = {
    "laplace": "density ratio (analytic) + sampler vs density",
    "duchi": "exact likelihood ratio + sampler vs pmf",
    "pm": "density ratio (analytic) + sampler vs density",
    "hm": "mixture of the PM density and the Duchi pmf, both checked",
    "three-outputs": "exact likelihood ratio + sampler vs pmf",
    "pm-sub": "density ratio (analytic) + sampler vs density",
    "ldp-fl": "exact likelihood ratio per coordinate + composition over dims",
    "exp-pm": "exact selection law + PM density",
    "pe-pm": "exact selection law (binomial) + PM density",
    "ps-pm": "exact selection law + PM density",
    "fedsel": "same laws as the presets, for every selector",
    "pm-rp": "PM density on one projected coordinate chosen independently of the data",
    "bitrand": "exact per-bit likelihood ratio (f-RR) + label RR",
    "latent": "exact per-bit likelihood ratio",
    "ome": "exact per-bit likelihood ratio",
    "flat-release": "identical to the flat mechanism's report (same draws), whose checks apply; DM release "
                    "exact law with power",
    "diffsketch": "claimed ε: Theorem 2 per client (hand-computed value) or Laplace noise added to the "
                  "sketch (noise law and variance checked); worst case ∞, asserted",
    "sketch-laplace": "Laplace noise on every cell, variance checked; with clip, audited on worst-case pairs "
                      "(power: the coordinate-clip calibration is rejected); ∞ without clip",
    "laplace-raw": "Laplace noise law and variance checked; audited on worst-case pairs of the ℓ1 and ℓ∞ balls",
    "cpsgd": "unbiased with closed-form variance; (ε, δ) recorded as claimed, worst case ∞ (moving support), asserted",
    "vqsgd": "exact RR ratio over 2d vertices + sampler vs exact vertex law; unbiased with closed-form variance",
    "ldp-fed": "exact worst-case ratio of the grid exponential mechanism ≤ α·D, sampler vs law, composition over k",
    "sqsgd": "PrivQuant exact enumeration of the output pmf (max log ratio ≤ ε1, power with a wrong κ/p), "
             "sampler vs exact law; ScalarDP exact law (ratio e^ε2)",
    "np": "non-private (ε = ∞)",
    "np-rs": "non-private (ε = ∞)",
    "np-k": "non-private (ε = ∞)",
    "np-sketch": "non-private (ε = ∞): tests/mechanisms/test_sketch.py checks it sends the plain sketch",
}


def make(name: str, dims: int = DIMS):
    return mechanisms.create(name, mechanisms.get(name).example_epsilon, dims, cohort_size=CLIENTS, classes=2)


def cohort(clients: int = CLIENTS, dims: int = DIMS, dtype=torch.float32) -> torch.Tensor:
    return torch.rand(clients, dims, generator=torch.Generator().manual_seed(0), dtype=dtype) * 2 - 1


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_output_shape_dtype_device(name, dtype):
    mech = make(name)
    updates = cohort(dtype=dtype)
    state = mech.initial_state(CLIENTS, dtype)
    out = mech.privatize(updates, streams(1, CLIENTS), state)
    assert out.reports.shape == (CLIENTS, mech.report_dims)
    assert out.reports.dtype == dtype and out.reports.device == updates.device
    assert torch.isfinite(out.reports).all()
    if mech.stateful:
        assert out.state is not None and out.state.shape == state.shape == (CLIENTS, mech.state_dims)
        assert out.state.dtype == dtype
    else:
        assert out.state is None


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_aggregate_of_all_reports_is_a_finite_update(name, dtype):
    mech = make(name)
    updates = cohort(dtype=dtype)
    out = mech.privatize(updates, streams(11, CLIENTS), mech.initial_state(CLIENTS, dtype))
    estimate = mech.aggregate(out.reports)
    assert estimate.shape == (DIMS,) and estimate.dtype == dtype
    assert torch.isfinite(estimate).all()
    corrected = mech.correct(estimate, updates)
    assert corrected.shape == updates.shape and torch.isfinite(corrected).all()


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
def test_deterministic_under_fixed_streams(name):
    mech = make(name)
    first = mech.privatize(cohort(), streams(2, CLIENTS), mech.initial_state(CLIENTS))
    second = mech.privatize(cohort(), streams(2, CLIENTS), mech.initial_state(CLIENTS))
    assert torch.equal(first.reports, second.reports)


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
def test_randomised_mechanisms_differ_under_other_streams(name):
    mech = make(name)
    if name in ("np", "np-k", "np-sketch"):
        pytest.skip(f"'{name}' is deterministic (no privacy, no sampling)")
    first = mech.privatize(cohort(), streams(3, CLIENTS), mech.initial_state(CLIENTS))
    second = mech.privatize(cohort(), streams(4, CLIENTS), mech.initial_state(CLIENTS))
    assert not torch.equal(first.reports, second.reports)


# Non-default settings that change which draws a mechanism makes, checked for chunking too.
VARIANTS = [
    ("sqsgd", {"adaptive": True, "ratio": 0.5}),
    ("diffsketch", {"append_noise": True, "columns": 4}),
    ("sketch-laplace", {"clip": 0.5}),
    ("vqsgd", {"repetitions": 3}),
    ("ldp-fed", {"fraction": 0.5}),
    ("hm", {"anonymizer": True}),
]
RELEASE_VARIANTS = [("flat-release", {"perturber": "three-outputs"}), ("bitrand", {"labels": "laplace"})]


@pytest.mark.parametrize("name,params", [(name, {}) for name in UPDATE_MECHANISMS] + VARIANTS)
def test_reports_do_not_depend_on_how_the_cohort_is_chunked(name, params):
    """Each client's report depends only on (key, client id, its input): chunks of 1, 7 and all agree."""
    mech = mechanisms.create(name, mechanisms.get(name).example_epsilon, DIMS, params, cohort_size=CLIENTS, classes=2)
    updates, state = cohort(), mech.initial_state(CLIENTS)
    ids = torch.arange(100, 100 + CLIENTS)
    whole = mech.privatize(updates, ClientStreams(("chunks",), ids), state)
    for chunk in (1, 7):
        parts = [mech.privatize(updates[rows], ClientStreams(("chunks",), ids[rows]),
                                None if state is None else state[rows])
                 for rows in torch.arange(CLIENTS).split(chunk)]
        assert torch.equal(torch.cat([p.reports for p in parts]), whole.reports)
        if state is not None:
            assert torch.equal(torch.cat([p.state for p in parts]), whole.state)


@pytest.mark.parametrize("name,params", [(name, {}) for name in UPDATE_MECHANISMS] + VARIANTS)
@pytest.mark.parametrize("edge", ["low", "high"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reports_are_finite_when_every_uniform_is_at_an_edge(name, params, edge, dtype):
    """Every uniform exactly 0, or every one the largest draw below 1: inverse-CDF transforms
    (Laplace, Gumbel, Box–Muller) and thresholds must still give finite reports."""
    mech = mechanisms.create(name, mechanisms.get(name).example_epsilon, DIMS, params, cohort_size=CLIENTS, classes=2)
    out = mech.privatize(cohort(dtype=dtype), EdgeStreams(edge, CLIENTS), mech.initial_state(CLIENTS, dtype))
    assert torch.isfinite(out.reports).all()
    assert torch.isfinite(mech.aggregate(out.reports)).all()


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
def test_does_not_modify_its_inputs(name):
    mech = make(name)
    updates, state = cohort(), mech.initial_state(CLIENTS)
    if state is not None:
        state += 0.1
    updates_copy = updates.clone()
    state_copy = None if state is None else state.clone()
    mech.privatize(updates, streams(5, CLIENTS), state)
    assert torch.equal(updates, updates_copy)
    if state is not None:
        assert torch.equal(state, state_copy)


@pytest.mark.parametrize("name", ALL)
def test_accounting_is_complete(name):
    mech = make(name, dims=100)
    accounting = mech.accounting()
    assert isinstance(accounting, Accounting)
    assert accounting.bits > 0 and accounting.epsilon_worst_case > 0
    if mech.private:
        # ε, or ε plus a paper's extra budget
        assert mechanisms.get(name).example_epsilon <= accounting.epsilon_claimed < math.inf
        assert 0.0 <= accounting.delta_claimed < 1.0
    else:
        assert math.isinf(accounting.epsilon_claimed) and math.isinf(accounting.epsilon_worst_case)


# ------------------------------------------------------------------ data releases
def labels_of(records: int = CLIENTS) -> torch.Tensor:
    return torch.arange(records) % 2


@pytest.mark.parametrize("name,params", [(name, {}) for name in RELEASES] + RELEASE_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_release_keeps_shapes_dtypes_and_classes(name, params, dtype):
    mech = mechanisms.create(name, mechanisms.get(name).example_epsilon, DIMS, params, classes=2)
    features, labels = cohort(dtype=dtype), labels_of()
    released = mech.release(features, labels, streams(1, CLIENTS))
    assert released.features.shape == features.shape and released.features.dtype == dtype
    assert torch.isfinite(released.features).all()
    assert released.labels.shape == labels.shape and released.labels.dtype == labels.dtype
    assert set(released.labels.tolist()) <= {0, 1}


@pytest.mark.parametrize("name,params", [(name, {}) for name in RELEASES] + RELEASE_VARIANTS)
def test_release_is_keyed_by_its_streams_alone(name, params):
    """Same streams, same release; other streams, another; each record's release is the same in any chunk."""
    mech = mechanisms.create(name, mechanisms.get(name).example_epsilon, DIMS, params, classes=2)
    features, labels = cohort(), labels_of()
    ids = torch.arange(100, 100 + CLIENTS)
    whole = mech.release(features, labels, ClientStreams(("chunks",), ids))
    again = mech.release(features, labels, ClientStreams(("chunks",), ids))
    other = mech.release(features, labels, ClientStreams(("other",), ids))
    assert torch.equal(whole.features, again.features) and torch.equal(whole.labels, again.labels)
    assert not torch.equal(whole.features, other.features)
    for chunk in (1, 7):
        parts = [mech.release(features[rows], labels[rows], ClientStreams(("chunks",), ids[rows]))
                 for rows in torch.arange(CLIENTS).split(chunk)]
        assert torch.equal(torch.cat([p.features for p in parts]), whole.features)
        assert torch.equal(torch.cat([p.labels for p in parts]), whole.labels)


@pytest.mark.parametrize("name,params", [(name, {}) for name in RELEASES] + RELEASE_VARIANTS)
@pytest.mark.parametrize("edge", ["low", "high"])
def test_release_is_finite_when_every_uniform_is_at_an_edge(name, params, edge):
    mech = mechanisms.create(name, mechanisms.get(name).example_epsilon, DIMS, params, classes=2)
    released = mech.release(cohort(), labels_of(), EdgeStreams(edge, CLIENTS))
    assert torch.isfinite(released.features).all() and set(released.labels.tolist()) <= {0, 1}


@pytest.mark.parametrize("name", RELEASES)
def test_release_does_not_modify_its_inputs(name):
    features, labels = cohort(), labels_of()
    features_copy, labels_copy = features.clone(), labels.clone()
    make(name).release(features, labels, streams(5, CLIENTS))
    assert torch.equal(features, features_copy) and torch.equal(labels, labels_copy)


@pytest.mark.parametrize("name", RELEASES)
def test_releases_randomise_labels(name):
    mech = make(name)
    labels = torch.randint(2, (5000,), generator=torch.Generator().manual_seed(6))
    released = mech.release(torch.zeros(len(labels), DIMS), labels, streams(7, labels)).labels
    assert released.shape == labels.shape and set(released.unique().tolist()) <= {0, 1}
    assert not torch.equal(released, labels)


# ------------------------------------------------------------------ both kinds
@pytest.mark.parametrize("name", ALL)
def test_stages_ledger_and_report_bound_follow_what_it_privatises(name):
    """An update mechanism acts in every round and is charged per round taken part in; a data release
    acts once on the records, before training, and is charged once per client."""
    cls, mech = mechanisms.get(name), make(name)
    stages = mech.stages()
    participations = torch.tensor([0, 3, 1])
    settings = TrainingSettings(epochs=3, rounds=0)
    if isinstance(mech, DataRelease):
        assert stages.release is mech and stages.updates is None and cls.privatises == RECORDS
        assert torch.equal(mech.reports_per_client(participations), torch.ones(3, dtype=torch.int64))
        assert cls.reports_bound(settings, 100) == 1 and cls.input_dims(500, 7) == 7
    else:
        assert isinstance(mech, Mechanism) and cls.privatises == UPDATES
        assert stages.updates is mech and stages.release is None
        assert torch.equal(mech.reports_per_client(participations), participations)
        assert cls.reports_bound(settings, 100) == 3 and cls.input_dims(500, 7) == 500


@pytest.mark.parametrize("name", ALL)
def test_has_a_description_and_documented_guarantee(name):
    cls = mechanisms.get(name)
    assert cls.description and cls.__doc__


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.nan])
@pytest.mark.parametrize("name", ALL)
def test_rejects_non_positive_epsilon(name, epsilon):
    if not mechanisms.get(name).private:
        pytest.skip("non-private baselines take ε = ∞")
    with pytest.raises(ConfigError, match="epsilon must be > 0"):
        mechanisms.create(name, epsilon, DIMS)


def test_every_registered_mechanism_is_covered():
    assert set(PRIVACY_CHECKS) == set(ALL), (
        f"registered but without a privacy check: {sorted(set(ALL) - set(PRIVACY_CHECKS))}; "
        f"listed but not registered: {sorted(set(PRIVACY_CHECKS) - set(ALL))}")
