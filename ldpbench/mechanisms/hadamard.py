"""Fast Walsh–Hadamard transform and the randomised rotation R = H·A/√d of sqSGD §3.4.

H is the Sylvester-ordered Walsh–Hadamard matrix of sqSGD Eq. (11): H(2) = [[1, 1], [1, −1]],
H(2^m) = [[H, H], [H, −H]]; H·Hᵀ = d·I. A is a diagonal of public Rademacher signs. With the
factor 1/√d (the paper prints 1/d, a typo: only 1/√d makes R orthonormal) R is a rotation, so
‖R·x‖₂ = ‖x‖₂ and R⁻¹ = Rᵀ = A·H/√d.

Every transform acts on the last dimension of each row separately, in O(d log d) additions, so a
client's result never depends on which other rows are in the batch.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from ldpbench.deferred_import import deferred
from ldpbench.rng import generator as keyed_generator

if TYPE_CHECKING:
    import torch
else:
    torch = deferred("torch", globals())


def is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh–Hadamard transform H·x of each row (last dimension, a power of two).

    log2(d) butterfly stages; stage h pairs entries i and i + h inside blocks of 2h, which yields
    the Sylvester ordering of Eq. (11).
    """
    d = x.shape[-1]
    if not is_power_of_two(d):
        raise ValueError(f"the Walsh–Hadamard transform needs a power-of-two length, got {d}")
    lead = x.shape[:-1]
    y = x.reshape(-1, d).clone()
    spare = torch.empty_like(y)  # two buffers in turn: no allocation per stage
    h = 1
    while h < d:
        source, target = y.view(-1, d // (2 * h), 2, h), spare.view(-1, d // (2 * h), 2, h)
        torch.add(source[:, :, 0], source[:, :, 1], out=target[:, :, 0])
        torch.sub(source[:, :, 0], source[:, :, 1], out=target[:, :, 1])
        y, spare = spare, y
        h *= 2
    return y.reshape(*lead, d)


def hadamard_matrix(d: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The dense d×d matrix of Eq. (11), by its recursion (for tests and small d only; default float64)."""
    if not is_power_of_two(d):
        raise ValueError(f"a Walsh–Hadamard matrix needs a power-of-two size, got {d}")
    h = torch.ones(1, 1, dtype=torch.float64 if dtype is None else dtype)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


@functools.lru_cache(maxsize=32)
def _signs(seed: int, d: int) -> torch.Tensor:
    gen = keyed_generator("hadamard rotation signs", seed, d)
    return torch.randint(0, 2, (d,), generator=gen, dtype=torch.float64) * 2 - 1


def rotation_signs(seed: int, d: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The public Rademacher diagonal A for (seed, d): the same for every client and round (default float64)."""
    return _signs(seed, d).to(torch.float64 if dtype is None else dtype)


def rotate(x: torch.Tensor, seed: int) -> torch.Tensor:
    """R·x = H·(A·x)/√d for each row of x [..., d]."""
    d = x.shape[-1]
    return fwht(x * rotation_signs(seed, d, x.dtype).to(x.device)) / math.sqrt(d)


def unrotate(y: torch.Tensor, seed: int) -> torch.Tensor:
    """R⁻¹·y = A·(H·y)/√d for each row of y [..., d]."""
    d = y.shape[-1]
    return fwht(y) * rotation_signs(seed, d, y.dtype).to(y.device) / math.sqrt(d)
