"""Keyed random streams.

Every random draw in ldpbench comes from a generator derived from a key such as
(run seed, round, purpose). Nothing reads global random state, so a run gives the same numbers
whatever else ran before it in the process, and however a campaign is scheduled or sharded.
"""

from __future__ import annotations

import hashlib
import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ldpbench.deferred_import import deferred

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())

_SEED_MASK = (1 << 63) - 1


def derive_seed(*key: object) -> int:
    """A 63-bit seed from an ordered key; distinct keys give independent-looking seeds."""
    text = "\x1f".join(repr(part) for part in key)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & _SEED_MASK


def generator(*key: object, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh torch generator for `key`, e.g. generator(seed, round_index, "mechanism")."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(*key))
    return gen


# ---------------------------------------------------------------------------- uniforms and transforms
def open_unit(u: torch.Tensor) -> torch.Tensor:
    """Uniforms on [0, 1] moved into the open interval (0, 1); every other value is unchanged.

    Inverse-CDF transforms such as log(u) or log1p(-2|u - 1/2|) diverge at an edge, and
    ClientStreams.rand returns exactly 0 with probability 2^-24 (float32) or 2^-53 (float64). The
    edge 0 becomes half the grid step of the draws (2^-25, 2^-54) and 1 the largest float below 1
    (1 − 2^-24, 1 − 2^-53); no grid value lies strictly between them and an edge, so an ordinary
    draw is bit-identical before and after.
    """
    low, high = open_unit_edges(u.dtype)
    return u.clamp(min=low, max=high)


def open_unit_edges(dtype: torch.dtype) -> tuple[float, float]:
    """(what open_unit makes of 0, of 1) in `dtype`: half the grid step of the draws, and 1 − the step."""
    eps = torch.finfo(dtype).eps  # 2^-23 (float32), 2^-52 (float64): twice the grid step below 1
    return eps / 4, 1.0 - eps / 2


def standard_laplace(u: torch.Tensor) -> torch.Tensor:
    """Laplace(0, 1) by the inverse CDF of uniforms `u` on [0, 1]; finite for every u (open_unit).

    −sign(c)·log1p(−2|c|) with c = open_unit(u) − 1/2, computed in place on one new tensor: the same
    operations on the same values, without a fresh array for each (each is a pass over fresh memory)."""
    centred = open_unit(u).sub_(0.5)
    negative_sign = torch.sign(centred).neg_()
    return centred.abs_().mul_(-2.0).log1p_().mul_(negative_sign)


def standard_gumbel(u: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) by the inverse CDF −log(−log u) of uniforms on [0, 1]; finite for every u."""
    return -torch.log(-torch.log(open_unit(u)))


def box_muller(u_radius: torch.Tensor, u_angle: torch.Tensor) -> torch.Tensor:
    """A standard normal from two uniforms on [0, 1]: sqrt(−2·ln(1 − u1))·cos(2π·u2); finite for every u."""
    radius = torch.sqrt(-2.0 * torch.log1p(-open_unit(u_radius)))
    return radius * torch.cos((2.0 * math.pi) * u_angle)


# ---------------------------------------------------------------------------- per-client streams
def _signed(value: int) -> int:
    """A 64-bit constant as the int64 torch stores."""
    return value - (1 << 64) if value >= (1 << 63) else value


_MASK64 = (1 << 64) - 1
_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
_BLOCK = 1 << 16  # values mixed at a time on CPU (int64: 512 KiB, in cache)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic on signed integers)."""
    return (z >> bits).bitwise_and_((1 << (64 - bits)) - 1)


_NUMPY_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_NUMPY_MIX = (np.uint64(30), np.uint64(0xBF58476D1CE4E5B9), np.uint64(27), np.uint64(0x94D049BB133111EB),
              np.uint64(31))


def _mix64_numpy(u: np.ndarray) -> np.ndarray:
    """mix64 on a uint64 array, into a fresh one."""
    shift1, mix1, shift2, mix2, shift3 = _NUMPY_MIX
    u = u ^ (u >> shift1)
    u *= mix1
    u ^= u >> shift2
    u *= mix2
    u ^= u >> shift3
    return u


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser on int64 tensors (multiplications wrap modulo 2^64).

    Works in place on one fresh copy: a draw for a whole cohort of large models is a tensor of
    hundreds of MB, and every temporary of that size costs a full pass (and page faults). On CPU the
    same operations run in numpy on uint64 (logical shifts, no masks), which costs a third of
    torch's per-operation overhead on the small tensors of a round's draws.
    """
    if z.device.type == "cpu":
        return torch.from_numpy(_mix64_numpy(z.numpy().view(np.uint64)).view(np.int64))
    z = z ^ _shift_right(z, 30)
    z.mul_(_MIX1)
    z.bitwise_xor_(_shift_right(z, 27))
    z.mul_(_MIX2)
    return z.bitwise_xor_(_shift_right(z, 31))


@dataclass
class DrawSpeed:
    """When this process's CPU draws go through the compiled kernels (ldpbench.numba_draws, and the
    fused perturbers of ldpbench.mechanisms.numba_perturbers) where numba is importable: its one set
    of speed switches, `rng.speed`. They choose only how a draw is computed, never its values.

    Draws of at least `min_values` values always do: the same values, several times faster. Smaller
    ones stay in numpy and torch, so that a process making only small draws never pays numba's
    import and first call (most of a second): the default campaign's cells train a few hundred
    rounds of 384 × 100 and 488 × 105 values. A process that has noted `rounds_for_small_draws`
    rounds (the engine notes every run's, note_rounds) compiles its small draws as well: a fraction
    of a millisecond saved per round of a linear model (three draws) repays numba's load well
    before. `every_draw` is set in a process that has loaded the kernels already
    (ldpbench.mechanisms.scalar.load_compiled_kernels, the warm worker's last preload step): they
    cost it, and the processes it forks, nothing more.

    Tests and benchmarks that change a switch replace or copy the object (`rng.speed = DrawSpeed()`
    is a process that has trained nothing and loaded nothing), so one assignment restores them all.
    """

    min_values: int = 1 << 16
    rounds_for_small_draws: int = 5_000
    rounds_noted: int = 0
    every_draw: bool = False

    def note_rounds(self, rounds: int) -> None:
        """This process is about to train `rounds` more rounds (the engine says so before each run)."""
        self.rounds_noted += rounds

    def compiled_for(self, values: int) -> bool:
        """Whether a CPU draw of `values` values should use a compiled kernel (if numba is importable)."""
        return self.every_draw or values >= self.min_values or self.rounds_noted >= self.rounds_for_small_draws


speed = DrawSpeed()


NUMBA_DRAWS = "ldpbench.numba_draws"  # loaded on demand (compiled_module)
_KERNELS: dict | None = None
_COMPILED_MODULES: dict[str, object] = {}


def compiled_module(name: str):
    """ldpbench's numba module `name`, imported once per process, or None where numba is missing or broken."""
    if name not in _COMPILED_MODULES:
        try:
            _COMPILED_MODULES[name] = importlib.import_module(name)
        except ImportError:  # the numpy and torch code, which gives the same values
            _COMPILED_MODULES[name] = None
    return _COMPILED_MODULES[name]


def _compiled_uniform(dtype: torch.dtype, device: torch.device, values: int):
    """The compiled uniform draw for `dtype`, or None where the torch path is used."""
    global _KERNELS
    if device.type != "cpu" or not speed.compiled_for(values) or dtype not in (torch.float32, torch.float64):
        return None
    if _KERNELS is None:
        numba_draws = compiled_module(NUMBA_DRAWS)
        _KERNELS = {} if numba_draws is None else {torch.float32: numba_draws.uniform_float32,
                                                   torch.float64: numba_draws.uniform_float64}
    return _KERNELS.get(dtype)


class ClientStreams:
    """Counter-based random streams, one per client, for a cohort (or any chunk of it).

    The k-th draw of the j-th call for client c is a pure function of (key, c, j, k):
    mix64(base_{c,j} + (k+1)·golden) with base_{c,j} = mix64(mix64(seed(key) + (c+1)·golden) ^ j·golden),
    i.e. SplitMix64 started at a per-(client, call) state. A chunk of clients therefore sees
    exactly the numbers it would see inside the whole cohort, on any device, whatever the chunk
    size or shard — provided the sequence of calls does not depend on the data, which every
    mechanism respects (no data-dependent rejection loops).

    Each method takes the full output shape, whose first dimension must be the number of clients,
    mirroring torch.rand(shape, generator=...), so mechanisms read like ordinary torch code.
    """

    def __init__(self, key: tuple, clients: torch.Tensor | int, device: str | torch.device | None = None):
        if isinstance(clients, int):
            clients = torch.arange(clients, dtype=torch.int64, device=device)
        elif device is not None:
            clients = clients.to(device)
        self.key = tuple(key)
        self.clients = clients.to(torch.int64)
        seed = derive_seed(*self.key)
        if self.clients.device.type == "cpu":  # numpy: a few calls instead of a dozen torch ones
            ids = self.clients.numpy().view(np.uint64)
            state = _mix64_numpy(np.uint64(seed) + (ids + np.uint64(1)) * _NUMPY_GOLDEN)
            self._client_state = torch.from_numpy(state.view(np.int64))
        else:
            self._client_state = mix64(seed + (self.clients + 1) * _GOLDEN)
        self._calls = 0

    @property
    def count(self) -> int:
        return int(self.clients.numel())

    @property
    def device(self) -> torch.device:
        return self.clients.device

    def subset(self, rows: torch.Tensor | slice) -> ClientStreams:
        """The streams of some of the clients; draws continue from the same call counter."""
        child = ClientStreams.__new__(ClientStreams)
        child.key, child.clients = self.key, self.clients[rows]
        child._client_state, child._calls = self._client_state[rows], self._calls
        return child

    @classmethod
    def joined(cls, parts: Sequence[ClientStreams]) -> ClientStreams:
        """The streams of `parts` one after the other, each row keeping its own key: draws from the
        joined streams are the parts' draws, stacked (runs trained together, ldpbench.fl.engine).

        The parts must be fresh or have made the same calls, so that one call counter serves all.
        """
        calls = {part._calls for part in parts}
        if len(calls) != 1 or any(type(part) is not cls for part in parts):
            raise ValueError(f"streams joined must be plain {cls.__name__} at the same call, "
                             f"got {[type(part).__name__ for part in parts]} at calls {sorted(calls)}")
        if len(parts) == 1:
            return parts[0]
        joined = cls.__new__(cls)
        joined.key = ("joined", *(part.key for part in parts))
        joined.clients = torch.cat([part.clients for part in parts])
        joined._client_state, joined._calls = torch.cat([part._client_state for part in parts]), calls.pop()
        return joined

    def _check_shape(self, shape) -> tuple[int, ...]:
        shape = tuple(int(s) for s in shape)
        if not shape or shape[0] != self.count:
            raise ValueError(f"draw shape {shape} must start with the number of clients ({self.count})")
        return shape

    def _next_call(self, shape) -> tuple[tuple[int, ...], int, torch.Tensor]:
        """Start the next call: (shape, values per client, its per-client base states [clients])."""
        shape = self._check_shape(shape)
        self._calls += 1
        return shape, math.prod(shape[1:]), self._call_base(self._calls)

    def _call_base(self, call: int) -> torch.Tensor:
        """The per-client base states of call number `call`: mix64(state ^ call·golden)."""
        if self.device.type == "cpu":
            return torch.from_numpy(self._call_bases_numpy(call, 1)[0].view(np.int64))
        return mix64(self._client_state ^ _signed((call * int(_NUMPY_GOLDEN)) & _MASK64))

    def _call_bases_numpy(self, first_call: int, calls: int) -> np.ndarray:
        """_call_base of calls first_call, first_call + 1, … on CPU, in numpy: uint64 [calls, clients]."""
        salts = np.arange(first_call, first_call + calls, dtype=np.uint64) * _NUMPY_GOLDEN
        return _mix64_numpy(self._client_state.numpy().view(np.uint64) ^ salts[:, np.newaxis])

    def call_bases(self, shape, calls: int) -> np.ndarray:
        """Start the next `calls` draws of `shape` and return their per-client base states.

        For a compiled kernel that makes those draws itself (ldpbench.mechanisms.numba_perturbers):
        uint64 [calls, clients]; value k of draw j for client c is then mix64(bases[j, c] + (k+1)·golden),
        as rand() would have made it, and the streams' later draws are the ones they would have been.
        """
        self._check_shape(shape)
        first_call, self._calls = self._calls + 1, self._calls + calls
        if self.device.type != "cpu":
            bases = [self._call_base(call) for call in range(first_call, first_call + calls)]
            return torch.stack(bases).cpu().numpy().view(np.uint64)
        numba_draws = compiled_module(NUMBA_DRAWS)
        if numba_draws is None:
            return self._call_bases_numpy(first_call, calls)
        return numba_draws.call_bases(self._client_state.numpy().view(np.uint64), first_call, calls)

    def _draw(self, shape, convert, dtype: torch.dtype) -> torch.Tensor:
        """The next call's 64-bit draws of `shape` on an accelerator, passed through `convert` to `dtype`."""
        shape, per_client, base = self._next_call(shape)
        counters = torch.arange(1, per_client + 1, dtype=torch.int64, device=self.device).mul_(_GOLDEN)
        return convert(mix64(base.unsqueeze(1) + counters.unsqueeze(0))).reshape(shape)

    def _draw_numpy(self, shape, dtype: torch.dtype, calls: int = 1) -> np.ndarray:
        """The next `calls` calls' uniforms of `shape` on CPU, in numpy (uint64 wraps and shifts
        logically): [calls, clients, values per client].

        The calls' base states and values are mixed together, so a round's small draws cost a few
        numpy calls whatever their number; large ones are made in blocks of about _BLOCK values,
        so that the mixing stays in cache (for a cohort of large models, 20 clients × 2.8M
        parameters, ~30× faster than mixing one array of hundreds of MB). Neither changes a value.
        """
        shape = self._check_shape(shape)
        per_client, first_call = math.prod(shape[1:]), self._calls + 1
        self._calls += calls
        bases = self._call_bases_numpy(first_call, calls)[:, :, np.newaxis]
        shift, scale = (np.uint64(40), np.float32(2.0**-24)) if dtype == torch.float32 else (np.uint64(11), 2.0**-53)
        out = np.empty((calls, self.count, per_client), dtype=np.float32 if dtype == torch.float32 else np.float64)
        columns = max(1, _BLOCK // max(calls * self.count, 1))
        for start in range(0, per_client, columns):
            stop = min(per_client, start + columns)
            bits = _mix64_numpy(bases + np.arange(start + 1, stop + 1, dtype=np.uint64) * _NUMPY_GOLDEN)
            block = out[:, :, start:stop]
            np.multiply((bits >> shift).astype(block.dtype), scale, out=block)
        return out

    def rand(self, shape, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Uniform on [0, 1) with the full mantissa of `dtype` (53 or 24 random bits; default float32)."""
        dtype = torch.float32 if dtype is None else dtype
        kernel = _compiled_uniform(dtype, self.device, math.prod(int(s) for s in shape))
        if kernel is not None:
            shape = self._check_shape(shape)
            # numpy's allocation (it advises huge pages for large arrays) halves the page faults of
            # a fresh output, which cost more than the kernel's own work at 10⁷ values.
            out = np.empty((self.count, math.prod(shape[1:])),
                           dtype=np.float32 if dtype == torch.float32 else np.float64)
            kernel(self.call_bases(shape, 1)[0], out)  # base states compiled too: numpy's were most of a small draw
            return torch.from_numpy(out).reshape(shape)
        if self.device.type == "cpu":
            return torch.from_numpy(self._draw_numpy(shape, dtype)).reshape(shape)
        if dtype == torch.float64:
            return self._draw(shape, lambda bits: _shift_right(bits, 11).to(torch.float64).mul_(2.0**-53), dtype)
        return self._draw(shape, lambda bits: _shift_right(bits, 40).to(torch.float32).mul_(2.0**-24), dtype)

    def _compiled_draws(self, dtype: torch.dtype, values: int):
        """ldpbench.numba_draws where rand would draw `values` uniforms of `dtype` compiled, for a method
        that draws and transforms them in one compiled pass (the same values); else None. Streams that
        draw otherwise (a subclass's rand) go through rand."""
        if type(self).rand is not ClientStreams.rand or _compiled_uniform(dtype, self.device, values) is None:
            return None
        return compiled_module(NUMBA_DRAWS)

    def choice(self, allowed: torch.Tensor) -> torch.Tensor:
        """Each row's uniform pick among its allowed entries (`allowed`: bool [clients, n]), int64
        [clients]: the argmax of this call's float64 keys rand(allowed.shape, torch.float64) over them,
        the keys of the others set to −1 (a row that allows none picks 0). Where rand would draw
        compiled, one compiled pass draws the keys and picks, without writing them out: the same picks."""
        numba_draws = self._compiled_draws(torch.float64, allowed.numel())
        if numba_draws is None:
            return self.rand(allowed.shape, torch.float64).masked_fill_(~allowed, -1.0).argmax(dim=1)
        chosen = np.empty(allowed.shape[0], dtype=np.int64)
        numba_draws.uniform_choice(self.call_bases(allowed.shape, 1)[0], allowed.contiguous().numpy(), chosen)
        return torch.from_numpy(chosen)

    def rand_many(self, calls: int, shape, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The next `calls` rand(shape, dtype) draws, stacked: [calls, *shape], the same values.

        For a sampler that needs several uniforms per value: on CPU, small draws are made together
        (two in about the time of one). Streams that draw otherwise (a subclass's rand) are called
        `calls` times.
        """
        dtype = torch.float32 if dtype is None else dtype
        if (type(self).rand is ClientStreams.rand and self.device.type == "cpu"
                and _compiled_uniform(dtype, self.device, math.prod(int(s) for s in shape)) is None):
            return torch.from_numpy(self._draw_numpy(shape, dtype, calls)).reshape(calls, *shape)
        return torch.stack([self.rand(shape, dtype) for _ in range(calls)])

    def randint(self, high: int, shape) -> torch.Tensor:
        """Uniform integers in [0, high); floor(u·high) with 53-bit u, so the bias is below high·2^-53."""
        if high < 1:
            raise ValueError(f"randint needs high >= 1, got {high}")
        scaled = (self.rand(shape, torch.float64) * high).to(torch.int64)
        return scaled.clamp_(max=high - 1)

    def randn(self, shape, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Standard normal by Box–Muller (two uniform draws); default float32."""
        u_radius, u_angle = self.rand_many(2, shape, torch.float64)
        return box_muller(u_radius, u_angle).to(torch.float32 if dtype is None else dtype)

    def laplace(self, shape, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Standard Laplace(0, 1), one uniform per value, always finite (standard_laplace); default float32.

        Where rand would draw compiled, the uniforms and standard_laplace's steps before its log1p are
        one compiled pass (numba_draws.laplace_arguments_*), then torch's log1p and sign: the same bits."""
        dtype = torch.float32 if dtype is None else dtype
        numba_draws = self._compiled_draws(dtype, math.prod(int(s) for s in shape))
        if numba_draws is None:
            return standard_laplace(self.rand(shape, dtype))
        shape = self._check_shape(shape)
        real = np.float32 if dtype == torch.float32 else np.float64
        arguments = np.empty((self.count, math.prod(shape[1:])), dtype=real)
        negative_signs = np.empty_like(arguments)
        fill = (numba_draws.laplace_arguments_float32 if dtype == torch.float32
                else numba_draws.laplace_arguments_float64)
        low, high = open_unit_edges(dtype)
        fill(self.call_bases(shape, 1)[0], real(low), real(high), arguments, negative_signs)
        return torch.from_numpy(arguments).log1p_().mul_(torch.from_numpy(negative_signs)).reshape(shape)

    def gumbel(self, shape, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Standard Gumbel(0, 1), one uniform per value, always finite (standard_gumbel); default float64."""
        return standard_gumbel(self.rand(shape, torch.float64 if dtype is None else dtype))
