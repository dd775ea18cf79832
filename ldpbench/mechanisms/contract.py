"""The contract every registered mechanism meets, as checks that the test suite and `ldpbench check`
both run.

tests/mechanisms/test_mechanism_contract.py parametrises these checks over the whole registry, so a
new mechanism, built in or from a plugin package (ldpbench.plugins), is checked as soon as it is
registered; `ldpbench check <name>` runs them on one mechanism and then its black-box privacy audit
(ldpbench.audit). A check raises ContractViolation (an AssertionError) saying what failed.

Update mechanisms are exercised through `privatize`/`aggregate`, data releases through `release`;
both through `stages`, their ledger, their accounting and their parameter checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ldpbench.errors import ConfigError
from ldpbench.mechanisms import registry
from ldpbench.mechanisms.base import RECORDS, UPDATES, Accounting, DataRelease, Mechanism
from ldpbench.rng import ClientStreams

DIMS, CLIENTS = 12, 64
DTYPES = (torch.float32, torch.float64)
EDGES = ("low", "high")
NON_POSITIVE_EPSILONS = (0.0, -1.0, math.nan)


class ContractViolation(AssertionError):
    """A mechanism broke its contract; the message says how."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ContractViolation(message)


def streams(seed: int, rows) -> ClientStreams:
    """Per-row random streams for a check: `rows` is a count or the tensor to be privatised."""
    return ClientStreams(("test", seed), rows if isinstance(rows, int) else rows.shape[0])


class EdgeStreams(ClientStreams):
    """Streams whose every uniform is one edge of what ClientStreams.rand can return: exactly 0
    (`low`) or the largest draw below 1 (`high`: 1 − 2^-24 in float32, 1 − 2^-53 in float64).

    Every other draw (randint, randn, laplace, gumbel) is derived from rand, so a mechanism run on
    these streams meets the edge in every transform it applies."""

    def __init__(self, edge: str, clients: int):
        if edge not in EDGES:
            raise ValueError(f"edge must be 'low' or 'high', got {edge!r}")
        super().__init__(("edge", edge), clients)
        self.edge = edge

    def rand(self, shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        value = 0.0 if self.edge == "low" else 1.0 - torch.finfo(dtype).eps / 2
        return torch.full(tuple(int(s) for s in shape), value, dtype=dtype, device=self.device)


def make(name: str, params: dict[str, Any] | None = None, dims: int = DIMS):
    """The mechanism at its example ε, on `dims` inputs, for a cohort of CLIENTS and 2 classes."""
    return registry.create(name, registry.get(name).example_epsilon, dims, params, cohort_size=CLIENTS, classes=2)


def cohort(clients: int = CLIENTS, dims: int = DIMS, dtype=torch.float32) -> torch.Tensor:
    return torch.rand(clients, dims, generator=torch.Generator().manual_seed(0), dtype=dtype) * 2 - 1


def labels_of(records: int = CLIENTS) -> torch.Tensor:
    return torch.arange(records) % 2


# ------------------------------------------------------------------ update mechanisms
def output_shape_dtype_device(name: str, params=None, dtype=torch.float32) -> None:
    mech = make(name, params)
    updates = cohort(dtype=dtype)
    state = mech.initial_state(CLIENTS, dtype)
    out = mech.privatize(updates, streams(1, CLIENTS), state)
    require(out.reports.shape == (CLIENTS, mech.report_dims),
            f"reports of shape {tuple(out.reports.shape)}, expected {(CLIENTS, mech.report_dims)}")
    require(out.reports.dtype == dtype and out.reports.device == updates.device,
            f"reports {out.reports.dtype} on {out.reports.device} for inputs {dtype} on {updates.device}")
    require(bool(torch.isfinite(out.reports).all()), "reports not all finite")
    if mech.stateful:
        require(out.state is not None and out.state.shape == state.shape == (CLIENTS, mech.state_dims)
                and out.state.dtype == dtype, "a stateful mechanism must return its state, shaped and typed")
    else:
        require(out.state is None, "a stateless mechanism returned a state")


def aggregate_is_a_finite_update(name: str, params=None, dtype=torch.float32) -> None:
    mech = make(name, params)
    updates = cohort(dtype=dtype)
    out = mech.privatize(updates, streams(11, CLIENTS), mech.initial_state(CLIENTS, dtype))
    estimate = mech.aggregate(out.reports)
    require(estimate.shape == (DIMS,) and estimate.dtype == dtype,
            f"aggregate of shape {tuple(estimate.shape)} and {estimate.dtype}, expected {(DIMS,)} and {dtype}")
    require(bool(torch.isfinite(estimate).all()), "aggregate not finite")
    corrected = mech.correct(estimate, updates)
    require(corrected.shape == updates.shape and bool(torch.isfinite(corrected).all()),
            "correct() must give one finite update per client")


def deterministic_under_fixed_streams(name: str, params=None) -> None:
    mech = make(name, params)
    first = mech.privatize(cohort(), streams(2, CLIENTS), mech.initial_state(CLIENTS))
    second = mech.privatize(cohort(), streams(2, CLIENTS), mech.initial_state(CLIENTS))
    require(torch.equal(first.reports, second.reports), "the same streams gave other reports")


def differs_under_other_streams(name: str, params=None) -> None:
    """A private mechanism samples: other streams give other reports."""
    mech = make(name, params)
    first = mech.privatize(cohort(), streams(3, CLIENTS), mech.initial_state(CLIENTS))
    second = mech.privatize(cohort(), streams(4, CLIENTS), mech.initial_state(CLIENTS))
    require(not torch.equal(first.reports, second.reports), "other streams gave the same reports: no sampling?")


def reports_do_not_depend_on_chunking(name: str, params=None) -> None:
    """Each client's report depends only on (key, client id, its input): chunks of 1, 7 and all agree."""
    mech = make(name, params)
    updates, state = cohort(), mech.initial_state(CLIENTS)
    ids = torch.arange(100, 100 + CLIENTS)
    whole = mech.privatize(updates, ClientStreams(("chunks",), ids), state)
    for chunk in (1, 7):
        parts = [mech.privatize(updates[rows], ClientStreams(("chunks",), ids[rows]),
                                None if state is None else state[rows])
                 for rows in torch.arange(CLIENTS).split(chunk)]
        require(torch.equal(torch.cat([p.reports for p in parts]), whole.reports),
                f"reports privatised in chunks of {chunk} differ from the whole cohort's")
        if state is not None:
            require(torch.equal(torch.cat([p.state for p in parts]), whole.state),
                    f"state in chunks of {chunk} differs from the whole cohort's")


def reports_do_not_depend_on_the_runs_alongside(name: str, params=None) -> None:
    """Runs trained together (the engine's train_together) privatise the cohorts of several
    runs in one call, on streams joined from each run's own keys: each run must get the reports, and
    the state, that its own call gives."""
    mech = make(name, params)
    runs = [(("run", seed, 3, "mechanism"), torch.arange(first, first + count))
            for seed, first, count in ((0, 100, CLIENTS), (1, 3, 7), (2, 100, 13))]
    updates = [cohort(len(ids)) * (1.0 - 0.25 * index) for index, (_, ids) in enumerate(runs)]
    # A stateful mechanism's state after an earlier round of its own.
    states = [mech.privatize(update, ClientStreams(("earlier", *key), ids), mech.initial_state(len(ids))).state
              if mech.stateful else None for update, (key, ids) in zip(updates, runs)]
    alone = [mech.privatize(update, ClientStreams(key, ids), state)
             for update, state, (key, ids) in zip(updates, states, runs)]
    together = mech.privatize(torch.cat(updates), ClientStreams.joined([ClientStreams(key, ids) for key, ids in runs]),
                              torch.cat(states) if mech.stateful else None)
    require(torch.equal(together.reports, torch.cat([out.reports for out in alone])),
            "reports privatised together with other runs' cohorts differ from each run's own")
    if mech.stateful:
        require(torch.equal(together.state, torch.cat([out.state for out in alone])),
                "state privatised together with other runs' cohorts differs from each run's own")


def finite_at_uniform_edges(name: str, params=None, edge: str = "low", dtype=torch.float32) -> None:
    """Every uniform exactly 0, or every one the largest draw below 1: inverse-CDF transforms
    (Laplace, Gumbel, Box–Muller) and thresholds must still give finite reports."""
    mech = make(name, params)
    out = mech.privatize(cohort(dtype=dtype), EdgeStreams(edge, CLIENTS), mech.initial_state(CLIENTS, dtype))
    require(bool(torch.isfinite(out.reports).all()), f"non-finite reports with every uniform at the {edge} edge")
    require(bool(torch.isfinite(mech.aggregate(out.reports)).all()),
            f"non-finite aggregate with every uniform at the {edge} edge")


def does_not_modify_its_inputs(name: str, params=None) -> None:
    mech = make(name, params)
    updates, state = cohort(), mech.initial_state(CLIENTS)
    if state is not None:
        state += 0.1
    updates_copy = updates.clone()
    state_copy = None if state is None else state.clone()
    mech.privatize(updates, streams(5, CLIENTS), state)
    require(torch.equal(updates, updates_copy), "privatize() modified the updates it was given")
    require(state is None or torch.equal(state, state_copy), "privatize() modified the state it was given")


# ------------------------------------------------------------------ data releases
def release_keeps_shapes_dtypes_and_classes(name: str, params=None, dtype=torch.float32) -> None:
    mech = make(name, params)
    features, labels = cohort(dtype=dtype), labels_of()
    released = mech.release(features, labels, streams(1, CLIENTS))
    require(released.features.shape == features.shape and released.features.dtype == dtype,
            f"released features {tuple(released.features.shape)} {released.features.dtype}, "
            f"expected {tuple(features.shape)} {dtype}")
    require(bool(torch.isfinite(released.features).all()), "released features not all finite")
    require(released.labels.shape == labels.shape and released.labels.dtype == labels.dtype
            and set(released.labels.tolist()) <= {0, 1}, "released labels must keep shape, dtype and classes")


def release_is_keyed_by_its_streams_alone(name: str, params=None) -> None:
    """Same streams, same release; other streams, another; each record's release is the same in any chunk."""
    mech = make(name, params)
    features, labels = cohort(), labels_of()
    ids = torch.arange(100, 100 + CLIENTS)
    whole = mech.release(features, labels, ClientStreams(("chunks",), ids))
    again = mech.release(features, labels, ClientStreams(("chunks",), ids))
    other = mech.release(features, labels, ClientStreams(("other",), ids))
    require(torch.equal(whole.features, again.features) and torch.equal(whole.labels, again.labels),
            "the same streams gave another release")
    require(not torch.equal(whole.features, other.features), "other streams gave the same release")
    for chunk in (1, 7):
        parts = [mech.release(features[rows], labels[rows], ClientStreams(("chunks",), ids[rows]))
                 for rows in torch.arange(CLIENTS).split(chunk)]
        require(torch.equal(torch.cat([p.features for p in parts]), whole.features)
                and torch.equal(torch.cat([p.labels for p in parts]), whole.labels),
                f"records released in chunks of {chunk} differ from the whole set's")


def release_finite_at_uniform_edges(name: str, params=None, edge: str = "low") -> None:
    released = make(name, params).release(cohort(), labels_of(), EdgeStreams(edge, CLIENTS))
    require(bool(torch.isfinite(released.features).all()) and set(released.labels.tolist()) <= {0, 1},
            f"non-finite release with every uniform at the {edge} edge")


def release_does_not_modify_its_inputs(name: str, params=None) -> None:
    features, labels = cohort(), labels_of()
    features_copy, labels_copy = features.clone(), labels.clone()
    make(name, params).release(features, labels, streams(5, CLIENTS))
    require(torch.equal(features, features_copy) and torch.equal(labels, labels_copy),
            "release() modified the records it was given")


def release_randomises_labels(name: str, params=None) -> None:
    labels = torch.randint(2, (5000,), generator=torch.Generator().manual_seed(6))
    released = make(name, params).release(torch.zeros(len(labels), DIMS), labels, streams(7, labels)).labels
    require(released.shape == labels.shape and set(released.unique().tolist()) <= {0, 1},
            "released labels must keep shape and classes")
    require(not torch.equal(released, labels), "5,000 labels released unchanged: labels are not randomised")


# ------------------------------------------------------------------ both kinds
def accounting_is_complete(name: str, params=None) -> None:
    mech = make(name, params, dims=100)
    accounting = mech.accounting()
    require(isinstance(accounting, Accounting), f"accounting() returned {type(accounting).__name__}")
    require(accounting.bits > 0 and accounting.epsilon_worst_case > 0, "bits and worst-case ε must be > 0")
    if mech.private:
        # ε, or ε plus a paper's extra budget
        require(registry.get(name).example_epsilon <= accounting.epsilon_claimed < math.inf,
                f"claimed ε {accounting.epsilon_claimed} below the ε asked for, or infinite")
        require(0.0 <= accounting.delta_claimed < 1.0, f"δ {accounting.delta_claimed} outside [0, 1)")
    else:
        require(math.isinf(accounting.epsilon_claimed) and math.isinf(accounting.epsilon_worst_case),
                "a non-private mechanism claims a finite ε")


def stages_ledger_and_report_bound_follow_what_it_privatises(name: str, params=None) -> None:
    """An update mechanism acts in every round and is charged per round taken part in; a data release
    acts once on the records, before training, and is charged once per client."""
    cls, mech = registry.get(name), make(name, params)
    stages = mech.stages()
    participations = torch.tensor([0, 3, 1])
    if isinstance(mech, DataRelease):
        require(stages.release is mech and stages.updates is None and cls.privatises == RECORDS,
                "a data release must be the release stage alone and privatise records")
        require(torch.equal(mech.reports_per_client(participations), torch.ones(3, dtype=torch.int64)),
                "a data release is charged once per client")
        require(cls.reports_bound(3) == 1 and cls.input_dims(500, 7) == 7,
                "a data release reports once, on the records' features")
    else:
        require(isinstance(mech, Mechanism) and cls.privatises == UPDATES,
                "an update mechanism must be a Mechanism privatising updates")
        require(stages.updates is mech and stages.release is None, "an update mechanism is the updates stage alone")
        require(torch.equal(mech.reports_per_client(participations), participations),
                "an update mechanism is charged once per round a client takes part in")
        require(cls.reports_bound(3) == 3 and cls.input_dims(500, 7) == 500,
                "an update mechanism reports once per round taken part in, on the model's parameters")


def has_a_description_and_documented_guarantee(name: str, params=None) -> None:
    cls = registry.get(name)
    require(bool(cls.description) and bool(cls.__doc__),
            "a mechanism needs a `description` and a docstring stating its guarantee")


def rejects_non_positive_epsilon(name: str, params=None, epsilon: float = 0.0) -> None:
    try:
        registry.create(name, epsilon, DIMS, params)
    except ConfigError as error:
        require("epsilon must be > 0" in str(error), f"ε = {epsilon} rejected with another message: {error}")
    else:
        raise ContractViolation(f"ε = {epsilon} accepted")


@dataclass(frozen=True)
class Check:
    """One contract check of one mechanism, ready to run."""

    description: str
    run: Callable[[], None]


def checks(name: str, params: dict[str, Any] | None = None) -> list[Check]:
    """The contract's checks that apply to mechanism `name` with `params` (its kind, its privacy)."""
    cls = registry.get(name)
    found = [Check("accounting is complete", lambda: accounting_is_complete(name, params)),
             Check("stages, ledger and report bound follow what it privatises",
                   lambda: stages_ledger_and_report_bound_follow_what_it_privatises(name, params)),
             Check("has a description and a documented guarantee",
                   lambda: has_a_description_and_documented_guarantee(name, params))]
    if cls.private:
        found += [Check(f"rejects ε = {epsilon:g}", lambda epsilon=epsilon: rejects_non_positive_epsilon(
            name, params, epsilon)) for epsilon in NON_POSITIVE_EPSILONS]
    if cls.privatises == UPDATES:
        for dtype in DTYPES:
            found += [Check(f"reports' shape, dtype and device ({dtype})",
                            lambda dtype=dtype: output_shape_dtype_device(name, params, dtype)),
                      Check(f"aggregate is a finite update ({dtype})",
                            lambda dtype=dtype: aggregate_is_a_finite_update(name, params, dtype))]
            found += [Check(f"finite with every uniform at the {edge} edge ({dtype})",
                            lambda edge=edge, dtype=dtype: finite_at_uniform_edges(name, params, edge, dtype))
                      for edge in EDGES]
        found += [Check("deterministic under fixed streams", lambda: deterministic_under_fixed_streams(name, params)),
                  Check("reports do not depend on how the cohort is chunked",
                        lambda: reports_do_not_depend_on_chunking(name, params)),
                  Check("reports do not depend on the runs privatised alongside",
                        lambda: reports_do_not_depend_on_the_runs_alongside(name, params)),
                  Check("does not modify its inputs", lambda: does_not_modify_its_inputs(name, params))]
        if cls.private:
            found.append(Check("other streams give other reports", lambda: differs_under_other_streams(name, params)))
    else:
        found += [Check(f"release keeps shapes, dtypes and classes ({dtype})",
                        lambda dtype=dtype: release_keeps_shapes_dtypes_and_classes(name, params, dtype))
                  for dtype in DTYPES]
        found += [Check(f"release finite with every uniform at the {edge} edge",
                        lambda edge=edge: release_finite_at_uniform_edges(name, params, edge)) for edge in EDGES]
        found += [Check("release is keyed by its streams alone", lambda: release_is_keyed_by_its_streams_alone(
            name, params)),
                  Check("release does not modify its inputs", lambda: release_does_not_modify_its_inputs(name, params)),
                  Check("release randomises labels", lambda: release_randomises_labels(name, params))]
    return found
