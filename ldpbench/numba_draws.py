"""The keyed uniform draw of ldpbench.rng, compiled with numba: the same values, several times faster.

ClientStreams.rand mixes each counter with SplitMix64's finaliser; in numpy or torch that is about a
dozen passes over uint64 temporaries, here one loop in registers: about ten times faster.
ldpbench.rng calls these for large CPU draws, and for all CPU draws of a process that trains many
rounds (rng.speed: the import and the cached machine code cost a process most of a second once),
and keeps the numpy path, which gives the same bits, everywhere else. The Laplace draw's steps before
its log1p (laplace_arguments_*) are compiled with the uniforms they transform: one pass instead of
seven; the log1p stays torch's (numba's libm rounds some values otherwise).
"""

from __future__ import annotations

import numba
import numpy as np

# SplitMix64's constants (ldpbench.rng holds them as signed int64 for torch).
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


@numba.njit(cache=True, nogil=True)
def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True, inline="always")
def uniform24(base, k):
    """The k-th float32 uniform of the draw whose client base state is `base`: the top 24 bits of
    mix64(base + (k + 1)·golden) · 2^-24 (uint64 arithmetic wraps)."""
    return np.float32(_mix64(base + np.uint64(k + 1) * GOLDEN) >> np.uint64(40)) * np.float32(2.0**-24)


@numba.njit(cache=True, nogil=True, inline="always")
def uniform53(base, k):
    """The k-th float64 uniform of the draw whose client base state is `base`: the top 53 bits of
    mix64(base + (k + 1)·golden) · 2^-53."""
    return np.float64(_mix64(base + np.uint64(k + 1) * GOLDEN) >> np.uint64(11)) * 2.0**-53


@numba.njit(cache=True, nogil=True)
def uniform_float32(base, out):
    """out[c, k] = uniform24(base[c], k)."""
    for client in range(out.shape[0]):
        start = base[client]
        for k in range(out.shape[1]):
            out[client, k] = uniform24(start, k)


@numba.njit(cache=True, nogil=True)
def uniform_float64(base, out):
    """out[c, k] = uniform53(base[c], k)."""
    for client in range(out.shape[0]):
        start = base[client]
        for k in range(out.shape[1]):
            out[client, k] = uniform53(start, k)


@numba.njit(cache=True, nogil=True)
def uniform_choice(base, allowed, out):
    """out[c] = the k allowed in row c whose float64 uniform (uniform_float64's value k of client c) is the
    largest, the lowest k on a tie, and 0 where row c allows none: the argmax of those uniforms with the
    others set to −1, as torch's argmax gives it, without writing the uniforms out."""
    for client in range(allowed.shape[0]):
        start = base[client]
        best, at = -1.0, 0
        for k in range(allowed.shape[1]):
            # Every key drawn and selected, not branched on: which entries are allowed, and which key
            # is the largest so far, would mispredict.
            key = uniform53(start, k)
            key = key if allowed[client, k] else -1.0
            better = key > best
            best = key if better else best
            at = k if better else at
        out[client] = at


@numba.njit(cache=True, nogil=True)
def call_bases(client_state, first_call, calls):
    """bases[j, c] = mix64(client_state[c] ^ (first_call + j)·golden): ClientStreams' base states of
    `calls` draws from call number `first_call` on (uint64 arithmetic wraps)."""
    bases = np.empty((calls, client_state.shape[0]), dtype=np.uint64)
    for j in range(calls):
        salt = np.uint64(first_call + j) * GOLDEN
        for client in range(client_state.shape[0]):
            bases[j, client] = _mix64(client_state[client] ^ salt)
    return bases


@numba.njit(cache=True, nogil=True, inline="always")
def laplace_argument(u, low, high, half, minus_two, zero, one):
    """(−2·|c|, −sign(c)) with c = clamp(u, low, high) − 1/2: standard_laplace's operations before its
    log1p, each the one torch performs in u's float type (the constants given in that type), so that
    log1p(−2·|c|)·(−sign(c)) is its value bit for bit. c is never −0 (u − 1/2 at u = 1/2 is +0), and
    torch's sign(+0) is +0, negated −0."""
    centred = min(max(u, low), high) - half
    negative_sign = -one if centred > zero else (one if centred < zero else -zero)
    return minus_two * abs(centred), negative_sign


@numba.njit(cache=True, nogil=True)
def laplace_arguments_float32(base, low, high, arguments, negative_signs):
    """laplace_argument of uniform24(base[c], k) into arguments[c, k] and negative_signs[c, k] (float32)."""
    half, minus_two, zero, one = np.float32(0.5), np.float32(-2.0), np.float32(0.0), np.float32(1.0)
    for client in range(arguments.shape[0]):
        start, row, signs = base[client], arguments[client], negative_signs[client]
        for k in range(row.shape[0]):
            row[k], signs[k] = laplace_argument(uniform24(start, k), low, high, half, minus_two, zero, one)


@numba.njit(cache=True, nogil=True)
def laplace_arguments_float64(base, low, high, arguments, negative_signs):
    """laplace_argument of uniform53(base[c], k) into arguments[c, k] and negative_signs[c, k] (float64)."""
    for client in range(arguments.shape[0]):
        start, row, signs = base[client], arguments[client], negative_signs[client]
        for k in range(row.shape[0]):
            row[k], signs[k] = laplace_argument(uniform53(start, k), low, high, 0.5, -2.0, 0.0, 1.0)
