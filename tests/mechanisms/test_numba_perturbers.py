"""The compiled PM, Duchi and HM, the flat top k and BitRand's bit release (ldpbench.mechanisms.numba_perturbers)
against their torch code.

The kernels must give the torch path's reports bit for bit (so every law, ratio and golden test of
the torch code holds for them); one law check per perturber runs the compiled path itself, with the
false-alarm rate of tests/stats.py (1e-6) and a power check.
"""

import sys

import numpy as np
import pytest
import torch

import ldpbench.rng as rng
from ldpbench import mechanisms
from ldpbench.mechanisms import bitrand, numba_perturbers, scalar
from ldpbench.rng import ClientStreams

from stats import EdgeStreams, compiled_and_plain, mean_matches, variance_matches

COMPILED = ("pm", "duchi", "hm")
EPSILONS = (0.05, 0.6, 0.61, 1.0, 2.0, 5.0, 12.0)  # HM is Duchi alone up to ε* ≈ 0.61


def inputs(clients: int, columns: int, seed: int = 0) -> torch.Tensor:
    """Values in [-1.3, 1.3] (the anonymizer clamps) with the edges ±1, 0, −0 and a tiny value."""
    x = torch.rand(clients, columns, generator=torch.Generator().manual_seed(seed)) * 2.6 - 1.3
    x[:, :6] = torch.tensor([-1.0, 1.0, 0.0, -0.0, 1e-30, -1e-30])
    return x


@pytest.mark.parametrize("name", COMPILED)
def test_the_compiled_perturber_gives_the_bits_of_the_torch_code(monkeypatch, name):
    perturber = scalar.SCALAR_PERTURBERS[name]
    x = inputs(7, 3001).clamp(-1, 1)

    def make():
        out = []
        for epsilon in EPSILONS:
            streams = ClientStreams(("kernel", name, epsilon), 7)
            # A second call, on a 3-D input, then a plain draw: the call counter moves on alike.
            out += [perturber.sample(x, epsilon, streams),
                    perturber.sample(x[:, :2000].reshape(7, 40, 50), epsilon, streams),
                    streams.rand((7, 5))]
        return out

    compiled, plain = compiled_and_plain(monkeypatch, make)
    for a, b in zip(compiled, plain, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("name", COMPILED)
def test_the_compiled_anonymizer_gives_the_bits_of_its_torch_column_blocks(monkeypatch, name):
    """Clamping and every fixed-width block (the last one ragged) in one pass, for a chunk of clients."""
    updates = inputs(5, 2 * scalar.ANONYMIZER_BLOCK_COLUMNS + 123, seed=1)
    updates[0, 7] = float("nan")  # propagated as torch's clamp does, into the same report
    mechanism = mechanisms.create(name, 1.5, updates.shape[1], {"anonymizer": True})

    def make():
        streams = ClientStreams(("anonymizer", name), 40).subset(torch.tensor([3, 17, 0, 39, 8]))
        return mechanism.privatize(updates, streams).reports

    compiled, plain = compiled_and_plain(monkeypatch, make)
    assert torch.equal(compiled.isnan(), plain.isnan())  # NaN perturbed alike: ±B (Duchi), NaN (PM)
    assert torch.equal(compiled.nan_to_num(9.0), plain.nan_to_num(9.0))


def test_the_compiled_path_is_taken_for_large_float32_cpu_inputs_only(monkeypatch):
    """Else the bit-for-bit tests above would compare the torch code with itself."""
    calls = []
    real = rng.compiled_module

    def spy(name):
        calls.append(name)
        return real(name)

    monkeypatch.setattr(rng, "compiled_module", spy)
    monkeypatch.setattr(rng, "speed", rng.DrawSpeed())  # a process that has not trained many rounds nor loaded them
    large = torch.zeros(2, rng.speed.min_values // 2)
    scalar.piecewise(large, 1.0, ClientStreams(("spy",), 2))
    assert calls.count("ldpbench.mechanisms.numba_perturbers") == 1
    scalar.piecewise(large[:, :-1], 1.0, ClientStreams(("spy",), 2))  # one value too few
    scalar.piecewise(large.double(), 1.0, ClientStreams(("spy",), 2))
    scalar.piecewise(large, 1.0, EdgeStreams("low", 2))  # streams with their own rand keep it
    assert calls.count("ldpbench.mechanisms.numba_perturbers") == 1


def test_a_process_that_loaded_the_kernels_draws_small_rounds_compiled_to_the_same_values(monkeypatch):
    """The warm worker's last preload step: afterwards (and in every job it forks) a round's small
    draws and perturbers take the kernels, with the values they had before."""
    monkeypatch.setattr(rng, "speed", rng.DrawSpeed())
    x = inputs(3, 8, seed=4).clamp(-1, 1)

    def small_round():
        streams = ClientStreams(("loaded", 1), torch.tensor([4, 0, 9]))
        return [streams.rand((3, 5)), streams.rand((3, 2), torch.float64), streams.randint(7, (3, 4)),
                *(scalar.SCALAR_PERTURBERS[name].sample(x, 2.0, streams) for name in COMPILED)]

    before = small_round()
    assert not rng.speed.compiled_for(x.numel())
    assert scalar.load_compiled_kernels()
    assert rng.speed.compiled_for(1)
    modules, draws = [], []
    real = rng.compiled_module
    monkeypatch.setattr(rng, "compiled_module", lambda name: modules.append(name) or real(name))

    def spy(kernel):
        return lambda base, out: draws.append(out.shape) or kernel(base, out)

    monkeypatch.setattr(rng, "_KERNELS", {dtype: spy(kernel) for dtype, kernel in rng._KERNELS.items()})
    after = small_round()
    assert draws == [(3, 5), (3, 2), (3, 4)]
    assert modules.count("ldpbench.mechanisms.numba_perturbers") == len(COMPILED)
    for a, b in zip(before, after):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_without_numba_the_kernels_are_not_loaded_and_nothing_changes(monkeypatch):
    monkeypatch.setattr(rng, "speed", rng.DrawSpeed())
    monkeypatch.setitem(sys.modules, "ldpbench.numba_draws", None)  # its import now fails
    monkeypatch.setattr(rng, "_COMPILED_MODULES", {})
    assert not scalar.load_compiled_kernels()
    assert rng.speed == rng.DrawSpeed()


def test_without_numba_the_perturbers_stay_in_torch_with_the_same_values(monkeypatch):
    x = inputs(2, rng.speed.min_values, seed=2).clamp(-1, 1)

    def draw():
        return scalar.SCALAR_PERTURBERS["hm"].sample(x, 2.0, ClientStreams(("no numba",), 2))

    compiled = draw()
    monkeypatch.setitem(sys.modules, "ldpbench.mechanisms.numba_perturbers", None)  # its import now fails
    monkeypatch.setattr(rng, "_COMPILED_MODULES", {})
    assert torch.equal(draw(), compiled)
    assert rng._COMPILED_MODULES["ldpbench.mechanisms.numba_perturbers"] is None


@pytest.mark.parametrize("name", COMPILED)
@pytest.mark.parametrize("x", [-0.9, 0.0, 0.6])
def test_the_compiled_perturber_is_unbiased_with_the_exact_variance(name, x):
    """2^20 reports of x through the kernel: mean x and the perturber's exact variance (each α = 1e-6)."""
    perturber, epsilon, n = scalar.SCALAR_PERTURBERS[name], 2.0, 1 << 20
    values = torch.full((16, n // 16), x)
    assert perturber.fused.sample(values, epsilon, ClientStreams(("law", name, x), 16)) is not None
    reports = perturber.sample(values, epsilon, ClientStreams(("law", name, x), 16)).double().numpy().ravel()
    variance = perturber.variance(x, epsilon)
    assert mean_matches(reports, x, variance)
    assert variance_matches(reports, variance, x, resolution=1e-6)  # float32 reports (Duchi's ±B is rounded)
    # Power: the reports of a perturber run at 1.5 ε have too small a variance for ε.
    louder = perturber.sample(values, 1.5 * epsilon, ClientStreams(("law", name, x), 16)).double().numpy().ravel()
    assert not variance_matches(louder, variance, x, resolution=1e-6)


def test_call_bases_are_the_bases_of_the_draws_they_stand_for():
    clients = torch.tensor([4, 0, 9])
    streams, twin = ClientStreams(("bases",), clients), ClientStreams(("bases",), clients)
    streams.rand((3, 2))
    twin.rand((3, 2))
    bases = streams.call_bases((3, 10), 2)
    assert bases.shape == (2, 3) and bases.dtype == np.uint64
    for base, expected in zip(bases, (twin._next_call((3, 1))[2], twin._next_call((3, 1))[2]), strict=True):
        assert np.array_equal(base, expected.numpy().view(np.uint64))
    assert torch.equal(streams.rand((3, 4)), twin.rand((3, 4)))  # the counters agree afterwards
    with pytest.raises(ValueError, match="number of clients"):
        streams.call_bases((2, 10), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_top_k_gives_topk_s_indices_ties_included(monkeypatch, dtype):
    """scalar.top_k_indices (the flat mechanisms' k of d coordinates, from their keys): topk's indices,
    largest first, for rows with and without ties among their k + 1 largest (values on a coarse grid,
    where ties are common: those rows take topk itself), k from 2 to all of a row."""
    from ldpbench.mechanisms import numba_perturbers

    generator = torch.Generator().manual_seed(11)
    tables = [(torch.rand(500, dims, generator=generator, dtype=dtype) * levels).floor() / levels
              for dims in (2, 4, 7, 123) for levels in (8, 2**24)]
    tied_rows = []

    def counted(values, k, out, tied):
        kernel(values, k, out, tied)
        tied_rows.append(int(tied.sum()))

    kernel = numba_perturbers.top_k
    monkeypatch.setattr(numba_perturbers, "top_k", counted)

    def indices():
        return [scalar.top_k_indices(table, k) for table in tables for k in range(2, table.shape[1] + 1, 2)]

    compiled, plain = compiled_and_plain(monkeypatch, indices)
    assert len(tied_rows) == len(plain)  # the compiled pass ran for every table
    assert sum(tied_rows) > 1000 and min(tied_rows) == 0  # with ties and without
    for a, b in zip(compiled, plain, strict=True):
        assert torch.equal(a, b)


def test_sample_coordinates_compiled_draws_what_topk_of_the_keys_draws(monkeypatch):
    def draws():
        streams = ClientStreams(("coordinates",), 3000)
        return [scalar.sample_coordinates(3000, dims, k, streams) for dims, k in ((4, 3), (123, 3), (10, 10))]

    compiled, plain = compiled_and_plain(monkeypatch, draws)
    for a, b in zip(compiled, plain, strict=True):
        assert torch.equal(a, b)


def release_inputs(records: int, dims: int, l: int, m: int, dtype: torch.dtype) -> torch.Tensor:
    """Features across BitRand's encodable range and beyond it, with its edges: ±0, the cap and values
    above it, a tiny value, and values half way between two units (rint rounds those to even)."""
    unit = 2.0 ** (m - l + 1)
    x = (torch.rand(records, dims, generator=torch.Generator().manual_seed(l * 100 + m), dtype=torch.float64)
         * 2.4 - 1.2) * 2.0 ** m
    edges = [0.0, -0.0, bitrand.largest_encodable(l, m), -2.0 ** (m + 3), 1e-30, 0.5 * unit, -1.5 * unit,
             2.5 * unit, 7.5 * unit]
    x[:, :len(edges)] = torch.tensor(edges, dtype=torch.float64)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("name", "params"), [("bitrand", {}), ("bitrand", {"l": 25, "m": 3}),
                                               ("latent", {"l": 6, "m": 1}), ("ome", {"l": 8, "m": 2})])
def test_the_compiled_bit_release_gives_the_values_of_the_torch_code(monkeypatch, dtype, name, params):
    """Every value, sign of zero included, and the streams' next draw, for BitRand and the corrected
    LATENT and OME (their own bit probabilities), as the torch code releases them; the compiled pass
    ran (else this would compare the torch code with itself)."""
    dims = 9
    mechanism = mechanisms.create(name, 2.0, dims, params, classes=4)
    features = release_inputs(301, dims, mechanism.l, mechanism.m, dtype)
    calls = []
    kernel = numba_perturbers.bit_release
    monkeypatch.setattr(numba_perturbers, "bit_release", lambda *args: calls.append(1) or kernel(*args))

    def release():
        streams = ClientStreams(("release", name), torch.arange(5, 5 + len(features)))
        return mechanism.release_features(features, streams), streams.rand((len(features), 3))

    (compiled, after_compiled), (plain, after_plain) = compiled_and_plain(monkeypatch, release)
    assert calls == [1]
    assert compiled.dtype == plain.dtype == dtype
    assert torch.equal(compiled, plain) and torch.equal(compiled.signbit(), plain.signbit())
    assert torch.equal(after_compiled, after_plain)


def test_bit_releases_the_compiled_pass_cannot_give_exactly_stay_in_torch(monkeypatch):
    """Non-finite features, float32 features of more magnitude bits than float32 sums exactly, and
    streams that draw their own way take the torch code."""
    monkeypatch.setattr(rng, "speed", rng.DrawSpeed(min_values=0))
    monkeypatch.setattr(numba_perturbers, "bit_release", lambda *args: pytest.fail("compiled"))
    wide = mechanisms.create("bitrand", 2.0, 9, {"l": 26, "m": 3}, classes=2)
    nan = release_inputs(4, 9, 10, 5, torch.float32)
    nan[1, 2] = float("nan")
    for mechanism, features, streams in (
            (mechanisms.create("bitrand", 2.0, 9, {}, classes=2), nan, ClientStreams(("nan",), 4)),
            (wide, release_inputs(4, 9, 26, 3, torch.float32), ClientStreams(("wide",), 4)),
            (mechanisms.create("bitrand", 2.0, 9, {}, classes=2), release_inputs(4, 9, 10, 5, torch.float32),
             EdgeStreams("low", 4))):
        mechanism.release_features(features, streams)
    # Power: the same call with finite float32 features of 10 bits takes the compiled pass.
    with pytest.raises(pytest.fail.Exception, match="compiled"):
        mechanisms.create("bitrand", 2.0, 9, {}, classes=2).release_features(
            release_inputs(4, 9, 10, 5, torch.float32), ClientStreams(("finite",), 4))
