"""Keyed per-client random streams: exact SplitMix64 arithmetic, chunk invariance, uniformity."""

import math

import numpy as np
import pytest
import torch

from ldpbench.rng import ClientStreams, box_muller, derive_seed, mix64, open_unit, standard_gumbel, standard_laplace

from stats import compiled_and_plain, frequencies_match, mean_matches

MASK = (1 << 64) - 1


def reference_mix64(z: int) -> int:
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_mix64_matches_the_reference_with_wrapping_multiplication():
    values = [0, 1, 2**63 - 1, 2**63, MASK, 0x0123456789ABCDEF, *range(3, 3000, 997)]
    signed = torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values], dtype=torch.int64)
    assert [int(x) & MASK for x in mix64(signed)] == [reference_mix64(v) for v in values]


def test_draw_is_a_pure_function_of_key_client_call_and_index():
    golden = 0x9E3779B97F4A7C15
    streams = ClientStreams(("k", 3), torch.tensor([5, 9]))
    first = streams.rand((2, 3), torch.float64)
    second = streams.rand((2, 3), torch.float64)
    for call, drawn in ((1, first), (2, second)):
        for row, client in enumerate((5, 9)):
            state = reference_mix64(derive_seed("k", 3) + (client + 1) * golden)
            base = reference_mix64(state ^ ((call * golden) & MASK))
            expected = [(reference_mix64(base + (k + 1) * golden) >> 11) * 2.0**-53 for k in range(3)]
            assert drawn[row].tolist() == expected


@pytest.mark.parametrize("method", ["rand", "randn", "randint"])
def test_a_chunk_sees_the_numbers_it_sees_inside_the_cohort(method):
    ids = torch.arange(40, 90)

    def draws(rows):
        streams = ClientStreams(("chunk", 1), ids[rows])
        count = len(ids[rows])
        if method == "randint":
            return torch.cat([streams.randint(7, (count, 3)), streams.randint(1000, (count, 2))], 1)
        draw = getattr(streams, method)
        return torch.cat([draw((count, 4)), draw((count,)).unsqueeze(1)], 1)

    whole = draws(slice(None))
    for size in (1, 7):
        assert torch.equal(torch.cat([draws(r) for r in torch.arange(len(ids)).split(size)]), whole)
    if method == "rand":
        subset = ClientStreams(("chunk", 1), ids).subset(slice(10, 20))
        assert torch.equal(subset.rand((10, 4)), whole[10:20, :4])


@pytest.mark.parametrize("method", ["rand", "randn", "randint"])
def test_joined_streams_draw_what_each_part_draws_alone(method):
    """Runs trained together: streams of several keys joined draw each part's own numbers, stacked,
    compiled or not, call after call (power: joining the parts in the other order fails)."""
    keys_and_ids = [((3, 7, "mechanism"), torch.arange(40, 90)), ((4, 7, "mechanism"), torch.arange(5, 12)),
                    ((3, 8, "mechanism"), torch.arange(40, 43))]

    def draws(streams):
        count = streams.count
        if method == "randint":
            return torch.cat([streams.randint(7, (count, 3)), streams.randint(1000, (count, 2))], 1)
        draw = getattr(streams, method)
        return torch.cat([draw((count, 4)), draw((count,)).unsqueeze(1), draw((count, 70_000))], 1)

    alone = torch.cat([draws(ClientStreams(key, ids)) for key, ids in keys_and_ids])
    joined = ClientStreams.joined([ClientStreams(key, ids) for key, ids in keys_and_ids])
    assert torch.equal(draws(joined), alone)
    swapped = ClientStreams.joined([ClientStreams(key, ids) for key, ids in keys_and_ids[1::-1] + keys_and_ids[2:]])
    assert not torch.equal(draws(swapped), alone)


def test_only_plain_streams_at_the_same_call_are_joined():
    first, second = ClientStreams(("a",), 3), ClientStreams(("b",), 2)
    assert ClientStreams.joined([first]) is first
    second.rand((2, 1))
    with pytest.raises(ValueError, match="same call"):
        ClientStreams.joined([first, second])

    class Halves(ClientStreams):
        pass

    with pytest.raises(ValueError, match="plain ClientStreams"):
        ClientStreams.joined([first, Halves(("c",), 2)])


def test_draw_shape_must_start_with_the_client_count():
    with pytest.raises(ValueError, match="number of clients"):
        ClientStreams(("x",), 3).rand((4, 2))


def test_uniform_and_integer_laws():
    """False-alarm rate ≤ 1e-6 per check (stats helpers); the power check feeds a skewed law."""
    streams = ClientStreams(("law",), 200_000)
    uniform = streams.rand((200_000,), torch.float64).numpy()
    assert mean_matches(uniform, 0.5, 1 / 12)
    counts = np.bincount(streams.randint(10, (200_000,)).numpy(), minlength=10)
    assert frequencies_match(counts, np.full(10, 0.1))
    assert not frequencies_match(counts, np.r_[0.11, np.full(9, 0.89 / 9)])
    normal = streams.randn((200_000,), torch.float64).numpy()
    assert mean_matches(normal, 0.0, 1.0) and mean_matches(normal**2, 1.0, 2.0)
    # Neighbouring clients and successive calls are uncorrelated.
    pairs = ClientStreams(("law",), 100_000).rand((100_000, 2), torch.float64).numpy()
    assert mean_matches((pairs[:, 0] - 0.5) * (pairs[:, 1] - 0.5), 0.0, 1 / 144)
    assert mean_matches((uniform[1:] - 0.5) * (uniform[:-1] - 0.5), 0.0, 1 / 144)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocked_draws_equal_one_block_and_the_reference(monkeypatch, dtype):
    """CPU draws are mixed in cache-sized blocks; the block size changes no value."""
    import ldpbench.rng as rng

    def draw():
        streams = ClientStreams(("blocks", 2), torch.tensor([3, 4, 11]))
        return streams.rand((3, 5, 9_000), dtype)  # 45,000 values per client: several blocks

    blocked = draw()
    monkeypatch.setattr(rng, "_BLOCK", 1 << 30)
    assert torch.equal(blocked, draw())
    monkeypatch.setattr(rng, "_BLOCK", 7)  # 2 columns per block: a ragged last block
    assert torch.equal(blocked, draw())
    golden, shift = 0x9E3779B97F4A7C15, 11 if dtype == torch.float64 else 40
    state = reference_mix64(derive_seed("blocks", 2) + (11 + 1) * golden)
    base = reference_mix64(state ^ golden)
    for k in (0, 21_845, 44_999):  # first, across a block boundary, last
        expected = (reference_mix64(base + (k + 1) * golden) >> shift) * 2.0 ** (shift - 64)
        assert blocked[2].reshape(-1)[k].item() == pytest.approx(expected, rel=0, abs=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [None, 7])  # the default block, and blocks of 1 or 2 columns (several)
def test_rand_many_gives_the_draws_of_as_many_rand_calls(monkeypatch, dtype, block):
    """rand_many mixes several calls at once; the values and the calls after it are those of rand()."""
    import ldpbench.rng as rng

    if block is not None:
        monkeypatch.setattr(rng, "_BLOCK", block)
    ids = torch.tensor([3, 0, 2**40])

    def one_by_one(streams):
        return torch.stack([streams.rand((3, 2, 5), dtype) for _ in range(3)]), streams.rand((3, 4), dtype)

    def together(streams):
        return streams.rand_many(3, (3, 2, 5), dtype), streams.rand((3, 4), dtype)

    for expected, got in zip(one_by_one(ClientStreams(("many",), ids)), together(ClientStreams(("many",), ids))):
        assert got.dtype == dtype and got.shape == expected.shape and torch.equal(got, expected)
    subset = ClientStreams(("many",), ids).subset(torch.tensor([2, 0]))
    alone = ClientStreams(("many",), ids[[2, 0]])
    assert torch.equal(subset.rand_many(2, (2, 3), dtype), alone.rand_many(2, (2, 3), dtype))


def test_rand_many_draws_through_a_subclass_rand_and_the_compiled_kernel(monkeypatch):
    class Halves(ClientStreams):
        def rand(self, shape, dtype=torch.float32):
            return torch.full(tuple(shape), 0.5, dtype=dtype)

    assert torch.equal(Halves(("many",), 2).rand_many(2, (2, 3)), torch.full((2, 2, 3), 0.5))
    compiled, plain = compiled_and_plain(monkeypatch, lambda: ClientStreams(("many",), 4).rand_many(3, (4, 9)))
    assert torch.equal(compiled, plain)


# ---------------------------------------------------------------- edges of the unit interval
def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """0 and 1, their nearest neighbours inside [0, 1] in `dtype` (the smallest subnormal, the largest
    float below 1), the smallest nonzero draw of ClientStreams.rand, and 1/2 (Laplace's sign change)."""
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # the smallest subnormal
    grid_step = torch.finfo(dtype).eps / 2  # 2^-24 (float32), 2^-53 (float64)
    return torch.tensor([0.0, tiny, grid_step, 0.5, 1.0 - grid_step, 1.0], dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inverse_cdf_transforms_are_finite_at_the_edges(dtype):
    u = edge_values(dtype)
    assert u[1] > 0 and u[-2] < 1 and torch.nextafter(u[-1], u[0]) == u[-2]  # true neighbours
    opened = open_unit(u)
    assert ((opened > 0) & (opened < 1)).all()
    for values in (standard_laplace(u), standard_gumbel(u), box_muller(u, u)):
        assert torch.isfinite(values).all(), values
    # The edges give the extreme values of a float grid, not infinities: |Laplace| ≤ ln 2^(bits+1).
    bits = 24 if dtype == torch.float32 else 53
    assert standard_laplace(u).abs().max() <= (bits + 1) * math.log(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_laplace_transform_in_place_has_the_bits_of_the_textbook_chain_and_leaves_its_input(dtype):
    """standard_laplace works in place on one new tensor; its values are, bit for bit, those of
    −sign(c)·log1p(−2|c|), c = open_unit(u) − 1/2, written with a fresh tensor per operation, at the
    edges, at 1/2 (a zero) and on keyed draws; the uniforms it is given are not changed."""
    drawn = ClientStreams(("laplace bits",), 200).rand((200, 500), dtype).reshape(-1)
    u = torch.cat([edge_values(dtype), torch.tensor([0.5, 0.25, 0.75], dtype=dtype), drawn])
    given = u.clone()
    centred = open_unit(u) - 0.5
    textbook = -torch.sign(centred) * torch.log1p(-2.0 * centred.abs())
    integers = torch.int32 if dtype == torch.float32 else torch.int64
    assert torch.equal(standard_laplace(u).view(integers), textbook.view(integers))
    assert torch.equal(u, given)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_open_unit_changes_only_the_edges(dtype):
    steps = 2**24 if dtype == torch.float32 else 2**53
    k = torch.cat([torch.arange(1, 5000), torch.arange(steps - 5000, steps)]).to(torch.float64)
    grid = (k / steps).to(dtype)  # the smallest and largest nonzero draws of ClientStreams.rand
    assert torch.equal(open_unit(grid), grid)
    drawn = ClientStreams(("open", 1), 50).rand((50, 4000), dtype)
    assert torch.equal(open_unit(drawn)[drawn > 0], drawn[drawn > 0])


def test_laplace_gumbel_and_normal_draws_are_the_transforms_of_the_keyed_uniforms():
    """The stream methods are the transforms applied to the same keyed uniforms (deterministic)."""
    ids = torch.arange(7, 12)
    uniforms = ClientStreams(("transforms",), ids)
    u1, u2 = uniforms.rand((5, 300), torch.float64), uniforms.rand((5, 300), torch.float64)
    assert torch.equal(ClientStreams(("transforms",), ids).laplace((5, 300), torch.float64), standard_laplace(u1))
    assert torch.equal(ClientStreams(("transforms",), ids).gumbel((5, 300)), standard_gumbel(u1))
    assert torch.equal(ClientStreams(("transforms",), ids).randn((5, 300), torch.float64), box_muller(u1, u2))


# ---------------------------------------------------------------- the compiled draw (ldpbench.numba_draws)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_draw_gives_the_bits_of_the_torch_path(monkeypatch, dtype):
    def make_draws():
        streams = ClientStreams(("kernel", 7), torch.tensor([0, 5, 2**40, 9]))
        draws = [streams.rand((4, 3, 1001), dtype), streams.rand((4,), dtype)]  # two calls: the counter moves on
        part = streams.subset(torch.tensor([2, 0]))
        draws += [part.rand((2, 77), dtype), part.laplace((2, 5), dtype), part.randn((2, 5), dtype),
                  part.randint(13, (2, 9)), streams.laplace((4, 3, 2001), dtype)]
        return draws

    compiled, plain = compiled_and_plain(monkeypatch, make_draws)
    for a, b in zip(compiled, plain):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_laplace_steps_give_the_transforms_bits_at_the_edges(dtype):
    """numba_draws.laplace_argument, the compiled Laplace draw's steps before its log1p, at the edges of
    the uniforms (0, 1, their neighbours, the smallest draw, 1/2 where the sign changes and c is 0):
    with torch's log1p and the sign after it, standard_laplace's value bit for bit."""
    from ldpbench.rng import NUMBA_DRAWS, compiled_module

    numba_draws = compiled_module(NUMBA_DRAWS)
    if numba_draws is None:
        pytest.skip("numba is not importable")
    real = np.float32 if dtype == torch.float32 else np.float64
    eps = torch.finfo(dtype).eps
    u = torch.cat([edge_values(dtype), torch.tensor([0.25, 0.75, 0.5 - eps, 0.5 + eps], dtype=dtype)])
    arguments, signs = zip(*(numba_draws.laplace_argument(real(value), real(eps / 4), real(1.0 - eps / 2),
                                                          real(0.5), real(-2.0), real(0.0), real(1.0))
                             for value in u.tolist()))
    compiled = torch.tensor(arguments, dtype=dtype).log1p_().mul_(torch.tensor(signs, dtype=dtype))
    integers = torch.int32 if dtype == torch.float32 else torch.int64
    assert torch.equal(compiled.view(integers), standard_laplace(u).view(integers))


def test_only_large_cpu_draws_use_the_compiled_kernel(monkeypatch):
    import ldpbench.rng as rng

    calls = []
    monkeypatch.setattr(rng, "speed", rng.DrawSpeed())  # a process that has not trained many rounds nor loaded them
    monkeypatch.setattr(rng, "_KERNELS", {torch.float32: lambda base, out: calls.append(out.shape) or out.fill(0.5)})
    streams = ClientStreams(("kernel",), 2)
    least = rng.speed.min_values
    assert streams.rand((2, least // 2), torch.float32).eq(0.5).all()
    assert not streams.rand((2, least // 2 - 1), torch.float32).eq(0.5).all()
    assert not streams.rand((2, least), torch.float64).eq(0.5).all()  # no float64 kernel here
    assert calls == [(2, least // 2)]


def test_without_numba_draws_stay_in_torch_with_the_same_values(monkeypatch):
    import sys

    import ldpbench.rng as rng

    def draw():
        return ClientStreams(("no numba",), 3).rand((3, rng.speed.min_values))

    with_kernel = draw()
    monkeypatch.setitem(sys.modules, "ldpbench.numba_draws", None)  # its import now raises ImportError
    monkeypatch.setattr(rng, "_KERNELS", None)
    monkeypatch.setattr(rng, "_COMPILED_MODULES", {})
    assert torch.equal(draw(), with_kernel) and rng._KERNELS == {}


def test_a_process_that_trains_many_rounds_compiles_its_small_draws_to_the_same_values(monkeypatch):
    import ldpbench.rng as rng

    monkeypatch.setattr(rng, "speed", rng.DrawSpeed())

    def small_draws():
        streams = ClientStreams(("small", 3), torch.tensor([2, 9, 4]))
        return [streams.rand((3, 5)), streams.rand((3, 2), torch.float64), streams.randint(7, (3, 4))]

    before = small_draws()
    assert not rng.speed.compiled_for(15)
    rng.speed.note_rounds(rng.speed.rounds_for_small_draws - 1)
    assert not rng.speed.compiled_for(15)
    rng.speed.note_rounds(1)
    assert rng.speed.compiled_for(15)
    calls = []

    def spy(kernel):
        def call(base, out):
            calls.append(out.shape)
            kernel(base, out)
        return call

    rng._compiled_uniform(torch.float32, torch.device("cpu"), rng.speed.min_values)  # loads the kernels
    monkeypatch.setattr(rng, "_KERNELS", {dtype: spy(kernel) for dtype, kernel in rng._KERNELS.items()})
    after = small_draws()
    assert calls == [(3, 5), (3, 2), (3, 4)]  # all three compiled now
    for a, b in zip(before, after, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)



def test_a_compiled_choice_picks_what_the_argmax_of_the_keys_picks_and_moves_the_streams_as_rand(monkeypatch):
    """ClientStreams.choice drawing and picking in one compiled pass: the plain path's picks (the argmax
    of the float64 keys over the allowed entries, 0 where a row allows none) and the same draws after
    it, for rows that allow none, one (the last), all, or about a third of their entries."""
    from ldpbench import numba_draws

    generator = torch.Generator().manual_seed(5)
    allowed = torch.rand(300, 37, generator=generator) < 0.3
    allowed[:20] = False
    allowed[20:40] = True
    allowed[40:60] = False
    allowed[40:60, 36] = True
    compiled_calls = []

    def counted(base, rows, out):
        compiled_calls.append(rows.shape)
        kernel(base, rows, out)

    kernel = numba_draws.uniform_choice
    monkeypatch.setattr(numba_draws, "uniform_choice", counted)

    def choices():
        streams = ClientStreams(("choice", 2), torch.arange(300) * 7)
        picks = [streams.choice(allowed), streams.choice(allowed[:, :5])]
        part = streams.subset(torch.tensor([3, 299, 0]))
        return [*picks, part.choice(allowed[[3, 299, 0]]), streams.rand((300, 4), torch.float64)]

    compiled, plain = compiled_and_plain(monkeypatch, choices)
    assert compiled_calls == [(300, 37), (300, 5), (3, 37)]  # the compiled pass ran, then the plain path
    for a, b in zip(compiled, plain, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    picks = plain[0]
    assert (picks[:20] == 0).all() and (picks[40:60] == 36).all()
    assert allowed[torch.arange(20, 300), picks[20:]].all()
    assert len(set(picks[20:40].tolist())) > 5  # all allowed: the keys decide
