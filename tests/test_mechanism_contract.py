"""The contract every registered mechanism must meet; parametrised over the whole registry."""

import math

import pytest
import torch

from ldpbench import mechanisms
from ldpbench.mechanisms.base import Accounting

ALL = mechanisms.names()


def make(name: str, dims: int = 12):
    return mechanisms.create(name, 2.0, dims)


def cohort(clients: int = 64, dims: int = 12, dtype=torch.float32) -> torch.Tensor:
    return torch.rand(clients, dims, generator=torch.Generator().manual_seed(0), dtype=dtype) * 2 - 1


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_output_shape_dtype_device(name, dtype):
    mech = make(name)
    updates = cohort(dtype=dtype)
    out = mech.privatize(updates, torch.Generator().manual_seed(1), mech.initial_state(64, dtype))
    assert out.reports.shape == updates.shape
    assert out.reports.dtype == dtype and out.reports.device == updates.device
    assert torch.isfinite(out.reports).all()
    if mech.stateful:
        assert out.state is not None and out.state.shape == updates.shape
    else:
        assert out.state is None


@pytest.mark.parametrize("name", ALL)
def test_deterministic_under_a_fixed_generator(name):
    mech = make(name)
    first = mech.privatize(cohort(), torch.Generator().manual_seed(2), mech.initial_state(64))
    second = mech.privatize(cohort(), torch.Generator().manual_seed(2), mech.initial_state(64))
    assert torch.equal(first.reports, second.reports)


@pytest.mark.parametrize("name", ALL)
def test_randomised_mechanisms_differ_under_another_generator(name):
    mech = make(name)
    if math.isinf(mech.accounting().epsilon_worst_case):
        pytest.skip(f"'{name}' is deterministic (no privacy)")
    first = mech.privatize(cohort(), torch.Generator().manual_seed(3), mech.initial_state(64))
    second = mech.privatize(cohort(), torch.Generator().manual_seed(4), mech.initial_state(64))
    assert not torch.equal(first.reports, second.reports)


@pytest.mark.parametrize("name", ALL)
def test_does_not_modify_its_inputs(name):
    mech = make(name)
    updates, state = cohort(), mech.initial_state(64)
    if state is not None:
        state += 0.1
    updates_copy = updates.clone()
    state_copy = None if state is None else state.clone()
    mech.privatize(updates, torch.Generator().manual_seed(5), state)
    assert torch.equal(updates, updates_copy)
    if state is not None:
        assert torch.equal(state, state_copy)


@pytest.mark.parametrize("name", ALL)
def test_accounting_is_complete(name):
    accounting = make(name, dims=100).accounting()
    assert isinstance(accounting, Accounting)
    assert accounting.bits > 0
    assert accounting.epsilon_worst_case >= accounting.epsilon_claimed or math.isinf(accounting.epsilon_worst_case)
    if math.isfinite(accounting.epsilon_claimed):
        assert accounting.epsilon_claimed == pytest.approx(2.0)


@pytest.mark.parametrize("name", ALL)
def test_has_a_description_and_documented_guarantee(name):
    cls = mechanisms.get(name)
    assert cls.description and cls.__doc__


def test_every_registered_mechanism_is_covered():
    # The contract tests above are parametrised over mechanisms.names() at import time; this guards
    # against a mechanism registered in a module that the package does not import.
    import ldpbench.mechanisms.fedsel  # noqa: F401
    import ldpbench.mechanisms.scalar  # noqa: F401

    assert set(ALL) == set(mechanisms.names())
    assert {"np", "pm", "ps-pm"} <= set(ALL)
