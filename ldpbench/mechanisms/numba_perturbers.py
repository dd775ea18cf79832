"""PM, Duchi and HM on every value in one compiled pass: the same bits as their torch code, ~5-10× faster;
the top k of short rows that the flat mechanisms sample their coordinates with (top_k); and BitRand's
release of a record's bits (bit_release).

ldpbench.mechanisms.scalar samples a perturber with torch: a keyed draw per uniform it needs, then
about ten elementwise passes, each writing a temporary as large as the input. Here each value's
uniforms are made where they are used (the keyed counters of ldpbench.numba_draws) and the value is
perturbed in registers. Every step is the float32 operation torch performs, in the same order and
with the same float32 constants (torch rounds a Python float to the tensor's dtype before an
elementwise operation; no step is fused into a multiply-add), so a report is bit for bit the one the
torch path gives: tests/mechanisms/test_numba_perturbers.py checks that on millions of values.

`x` and `out` are [clients, n] float32 and may be the same array; x is clamped to [−limit, limit]
first (inf: not at all), as the flat anonymizer clamps its updates before sampling them. The torch
code may have sampled x in column blocks of `width` values, one sample() after the other (the flat
anonymizer does):
`bases[b, j]` holds the per-client base states (ClientStreams.call_bases) of the j-th draw that
block b's sample made, and value k of that block is value k of the draw. One block of width n is one
sample() of the whole of x.

Each loop runs over one block of one row as 1-D slices, indexed by the loop counter itself: numba
then knows no index is negative and LLVM vectorises the loop (AVX-512 here). Indexed as
x[client, start + k], the same loop stays scalar, 4-6× slower (benchmarks/mechanism_throughput.py).
"""

from __future__ import annotations

import numba
import numpy as np

from ldpbench.numba_draws import uniform24 as _uniform
from ldpbench.numba_draws import uniform53 as _uniform53


@numba.njit(cache=True, nogil=True, inline="always")
def _clamp(value, limit):
    """torch's clamp(value, −limit, limit), NaN kept; limit = inf leaves every value as it is."""
    if value < -limit:
        return -limit
    return limit if value > limit else value


@numba.njit(cache=True, nogil=True, inline="always")
def _piecewise(value, u_central, u_position, slope, offset, bound, one, minus_bound, twice_bound, p_centre):
    """CentreTails.sample of pm_law: left = ((c+1)/2)·x − (c−1)/2, right = left + c − 1, bound c."""
    left = value * slope - offset
    left_tail = left + bound
    right = left_tail - one
    width = right - left
    # Both branches computed and one selected: a data-dependent jump would be mispredicted half the time.
    inside = left + width * u_position
    t = u_position * (twice_bound - width)
    outside = t + minus_bound if t < left_tail else right + (t - left_tail)
    return inside if u_central < p_centre else outside


@numba.njit(cache=True, nogil=True, inline="always")
def _duchi(value, u, numerator, denominator, half, one, minus_bound, bound):
    """_sample_discrete of duchi_pmf: −B when u < P(−B) = 1 − (1/2 + x·(e^ε−1)/(2(e^ε+1))), else +B."""
    p_minus = one - (half + (value * numerator) / denominator)
    return minus_bound if u < p_minus else bound


@numba.njit(cache=True, nogil=True, inline="always")
def _block(x, out, client, block, width):
    """Block `block` of row `client`: its values in x and their places in out, as 1-D slices."""
    start = block * width
    stop = min(start + width, x.shape[1])
    return x[client, start:stop], out[client, start:stop]


@numba.njit(cache=True, nogil=True)
def piecewise_float32(x, limit, bases, width, pm, out):
    """PM (pm_law(x, ε).sample): draw 0 chooses the centre, draw 1 the position; `pm` from pm_constants."""
    slope, offset, bound, one, minus_bound, twice_bound, p_centre = pm
    for client in range(x.shape[0]):
        for block in range(bases.shape[0]):
            base_central, base_position = bases[block, 0, client], bases[block, 1, client]
            values, reports = _block(x, out, client, block, width)
            for k in range(values.shape[0]):
                reports[k] = _piecewise(_clamp(values[k], limit), _uniform(base_central, k), _uniform(base_position, k),
                                        slope, offset, bound, one, minus_bound, twice_bound, p_centre)


@numba.njit(cache=True, nogil=True)
def duchi_float32(x, limit, bases, width, duchi, out):
    """Duchi (_duchi): draw 0; `duchi` from duchi_constants."""
    numerator, denominator, half, one, minus_bound, bound = duchi
    for client in range(x.shape[0]):
        for block in range(bases.shape[0]):
            base = bases[block, 0, client]
            values, reports = _block(x, out, client, block, width)
            for k in range(values.shape[0]):
                reports[k] = _duchi(_clamp(values[k], limit), _uniform(base, k), numerator, denominator, half, one,
                                    minus_bound, bound)


@numba.njit(cache=True, nogil=True)
def hybrid_float32(x, limit, bases, width, pm_weight, pm, duchi, out):
    """HM (_hybrid): draw 0 picks PM (u < pm_weight), draws 1-2 are PM's, draw 3 Duchi's.

    Both outcomes are computed and one selected, as in torch (cheaper than a mispredicted jump).
    """
    slope, offset, bound, one, minus_bound, twice_bound, p_centre = pm
    numerator, denominator, half, d_one, d_minus_bound, d_bound = duchi
    for client in range(x.shape[0]):
        for block in range(bases.shape[0]):
            base_choice, base_central = bases[block, 0, client], bases[block, 1, client]
            base_position, base_duchi = bases[block, 2, client], bases[block, 3, client]
            values, reports = _block(x, out, client, block, width)
            for k in range(values.shape[0]):
                value = _clamp(values[k], limit)
                from_pm = _piecewise(value, _uniform(base_central, k), _uniform(base_position, k), slope, offset,
                                     bound, one, minus_bound, twice_bound, p_centre)
                from_duchi = _duchi(value, _uniform(base_duchi, k), numerator, denominator, half, d_one,
                                    d_minus_bound, d_bound)
                reports[k] = from_pm if _uniform(base_choice, k) < pm_weight else from_duchi


@numba.njit(cache=True, nogil=True)
def top_k(values, k, out, tied):
    """out[c] = the indices of the k largest of values[c] (no NaN), largest first: torch's topk where they
    are distinct. tied[c] = whether two of row c's k + 1 largest are equal: there the set or the order
    is topk's own to decide, and the caller asks topk (ldpbench.mechanisms.scalar.top_k_indices).

    One pass a row, keeping its k + 1 largest in order (k is a handful of coordinates): torch's topk
    sorts a row's (value, index) pairs, several times slower on a round's keys (d in the hundreds).
    """
    kept = min(k + 1, values.shape[1])
    best = np.empty(kept, dtype=values.dtype)
    at = np.empty(kept, dtype=np.int64)
    for row in range(values.shape[0]):
        filled = 0
        for j in range(values.shape[1]):
            value = values[row, j]
            if filled < kept:
                position = filled
                filled += 1
            elif value > best[kept - 1]:
                position = kept - 1
            else:
                continue
            while position > 0 and value > best[position - 1]:
                best[position] = best[position - 1]
                at[position] = at[position - 1]
                position -= 1
            best[position] = value
            at[position] = j
        tie = False
        for i in range(kept - 1):
            tie = tie or best[i] == best[i + 1]
        tied[row] = tie
        for i in range(k):
            out[row, i] = at[i]


@numba.njit(cache=True, nogil=True)
def bit_release(values, bases, cap, scale, top_unit, probabilities, weights, out):
    """BitRand's release of every value (ldpbench.mechanisms.bitrand.BitRelease) in one pass over the
    clients: encode, randomise each bit, decode, without the [clients, r, bits] bits, uniforms and
    probabilities the torch code writes out.

    values [clients, r] (finite) and out [clients, r] of the features' dtype. Value j of a client is
    encoded into bits k = j·bits … j·bits + bits − 1: the sign (1 unless the IEEE sign bit is set),
    then the magnitude's units of the least significant weight, min(rint(min(|value|, cap)·scale),
    top_unit), most significant first. Bit k is released as 1 where the client's uniform53 k (rand()
    of [clients, r, bits] in float64, whose base states `bases` holds) is below
    probabilities[2k + bit] (P(1 | 0) and P(1 | 1), float64 [2·r·bits]); value j out is ± the sum over
    its magnitude bits i of weights[2(i − 1) + released bit] (0, or the bit's weight 2^(m − i)).
    `cap` and `scale` are of the values' dtype (torch clamps and scales in it), and the weights sum
    exactly in the output's dtype: any order of the sum gives torch's value.

    A client's bits are held in a row, read through those tables rather than branched on: the bits are
    random, and a branch on each would mispredict about half the time.
    """
    clients, width = values.shape
    bits = probabilities.shape[0] // (2 * width)
    encoded = np.empty(width * bits, dtype=np.int64)
    released = np.empty(width * bits, dtype=np.int64)
    for client in range(clients):
        row = values[client]
        for j in range(width):
            units = min(np.int64(np.rint(min(abs(row[j]), cap) * scale)), top_unit)
            encoded[j * bits] = 0 if np.signbit(row[j]) else 1
            for i in range(1, bits):
                encoded[j * bits + i] = (units >> (bits - 1 - i)) & 1
        base = bases[client]
        for k in range(width * bits):
            released[k] = 1 if _uniform53(base, k) < probabilities[2 * k + encoded[k]] else 0
        decoded = out[client]
        for j in range(width):
            magnitude = weights[0]  # a released 0's weight: zero, in the output's dtype
            for i in range(1, bits):
                magnitude += weights[2 * (i - 1) + released[j * bits + i]]
            decoded[j] = magnitude if released[j * bits] else -magnitude
