"""The contract every registered mechanism must meet (ldpbench.mechanisms.contract), parametrised over
the whole registry: built-in mechanisms and those of installed plugin packages alike.

Update mechanisms are exercised through `privatize`/`aggregate`, data releases through `release`;
both through `stages`, their ledger and their accounting.
"""

import pytest
import torch

from ldpbench import mechanisms
from ldpbench.mechanisms import contract
from ldpbench.mechanisms.base import RECORDS, UPDATES

from stats import make_pm_modify_its_inputs

ALL = mechanisms.names()
UPDATE_MECHANISMS = [name for name in ALL if mechanisms.get(name).privatises == UPDATES]
RELEASES = [name for name in ALL if mechanisms.get(name).privatises == RECORDS]
DTYPES = list(contract.DTYPES)

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



@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_output_shape_dtype_device(name, dtype):
    contract.output_shape_dtype_device(name, dtype=dtype)


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_aggregate_of_all_reports_is_a_finite_update(name, dtype):
    contract.aggregate_is_a_finite_update(name, dtype=dtype)


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
def test_deterministic_under_fixed_streams(name):
    contract.deterministic_under_fixed_streams(name)


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
def test_randomised_mechanisms_differ_under_other_streams(name):
    if name in ("np", "np-k", "np-sketch"):
        pytest.skip(f"'{name}' is deterministic (no privacy, no sampling)")
    contract.differs_under_other_streams(name)


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
    contract.reports_do_not_depend_on_chunking(name, params)


@pytest.mark.parametrize("name,params", [(name, {}) for name in UPDATE_MECHANISMS] + VARIANTS)
def test_reports_do_not_depend_on_the_runs_privatised_alongside(name, params):
    contract.reports_do_not_depend_on_the_runs_alongside(name, params)


def test_a_mechanism_with_one_draw_per_call_fails_the_runs_alongside_check(monkeypatch):
    """Power: a PM that adds one shared draw to every row of a call gives a run other reports when
    other runs' cohorts are privatised in the same call."""
    pm = mechanisms.get("pm")
    original = pm.privatize

    def shared_draw(self, updates, streams, state=None):
        out = original(self, updates, streams, state)
        return type(out)(out.reports + streams.rand((streams.count, 1))[:1], out.state)

    monkeypatch.setattr(pm, "privatize", shared_draw)
    with pytest.raises(contract.ContractViolation, match="differ from each run's own"):
        contract.reports_do_not_depend_on_the_runs_alongside("pm")


@pytest.mark.parametrize("name,params", [(name, {}) for name in UPDATE_MECHANISMS] + VARIANTS)
@pytest.mark.parametrize("edge", contract.EDGES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reports_are_finite_when_every_uniform_is_at_an_edge(name, params, edge, dtype):
    contract.finite_at_uniform_edges(name, params, edge, dtype)


@pytest.mark.parametrize("name", UPDATE_MECHANISMS)
def test_does_not_modify_its_inputs(name):
    contract.does_not_modify_its_inputs(name)


@pytest.mark.parametrize("name", ALL)
def test_accounting_is_complete(name):
    contract.accounting_is_complete(name)


# ------------------------------------------------------------------ data releases
@pytest.mark.parametrize("name,params", [(name, {}) for name in RELEASES] + RELEASE_VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_release_keeps_shapes_dtypes_and_classes(name, params, dtype):
    contract.release_keeps_shapes_dtypes_and_classes(name, params, dtype)


@pytest.mark.parametrize("name,params", [(name, {}) for name in RELEASES] + RELEASE_VARIANTS)
def test_release_is_keyed_by_its_streams_alone(name, params):
    contract.release_is_keyed_by_its_streams_alone(name, params)


@pytest.mark.parametrize("name,params", [(name, {}) for name in RELEASES] + RELEASE_VARIANTS)
@pytest.mark.parametrize("edge", contract.EDGES)
def test_release_is_finite_when_every_uniform_is_at_an_edge(name, params, edge):
    contract.release_finite_at_uniform_edges(name, params, edge)


@pytest.mark.parametrize("name", RELEASES)
def test_release_does_not_modify_its_inputs(name):
    contract.release_does_not_modify_its_inputs(name)


@pytest.mark.parametrize("name", RELEASES)
def test_releases_randomise_labels(name):
    contract.release_randomises_labels(name)


# ------------------------------------------------------------------ both kinds
@pytest.mark.parametrize("name", ALL)
def test_stages_ledger_and_report_bound_follow_what_it_privatises(name):
    contract.stages_ledger_and_report_bound_follow_what_it_privatises(name)


@pytest.mark.parametrize("name", ALL)
def test_has_a_description_and_documented_guarantee(name):
    contract.has_a_description_and_documented_guarantee(name)


@pytest.mark.parametrize("epsilon", contract.NON_POSITIVE_EPSILONS)
@pytest.mark.parametrize("name", ALL)
def test_rejects_non_positive_epsilon(name, epsilon):
    if not mechanisms.get(name).private:
        pytest.skip("non-private baselines take ε = ∞")
    contract.rejects_non_positive_epsilon(name, epsilon=epsilon)


def test_every_registered_mechanism_is_covered():
    """Every built-in mechanism has its own privacy checks; a plugin's mechanism is checked by the
    contract above and by its audit (`ldpbench check`), its exact laws by its own package."""
    built_in = set(ALL) - set(mechanisms.registry.MECHANISMS.added_later())
    assert set(PRIVACY_CHECKS) == built_in, (
        f"registered but without a privacy check: {sorted(built_in - set(PRIVACY_CHECKS))}; "
        f"listed but not registered: {sorted(set(PRIVACY_CHECKS) - built_in)}")


def test_a_broken_mechanism_fails_the_contract(monkeypatch):
    """The checks have power: a PM that doubles its inputs in place fails the input check, and one whose
    reports are infinite when every uniform is at an edge fails the edge check."""
    pm = mechanisms.get("pm")
    original = pm.privatize
    with monkeypatch.context() as patch:
        make_pm_modify_its_inputs(patch)
        with pytest.raises(contract.ContractViolation, match="modified the updates"):
            contract.does_not_modify_its_inputs("pm")

    def infinite(self, updates, streams, state=None):
        out = original(self, updates, streams, state)
        return type(out)(out.reports / torch.zeros(()), out.state) if isinstance(streams, contract.EdgeStreams) \
            else out

    monkeypatch.setattr(pm, "privatize", infinite)
    with pytest.raises(contract.ContractViolation, match="non-finite reports"):
        contract.finite_at_uniform_edges("pm")
