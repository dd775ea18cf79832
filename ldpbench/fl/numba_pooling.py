"""ReLU followed by a 2×2 max-pool of stride 2, compiled with numba: one pass over the planes each way.

aten's CPU max_pool2d visits a window per output element with bounds and NaN checks and writes an
int64 index, the largest cost of a LeNet-5 step after its convolutions; ReLU is two more passes
(forward and backward) over the unpooled activations. These kernels give bit for bit what
`max_pool2d(relu(x), 2)` and its backward give (ldpbench.fl.pooling says why and tests/fl check it).

Planes are flat, [planes, height·width] (a batch's images and channels in the first axis, each
plane's rows one after the other), as are the pooled outputs and their indices.
"""

from __future__ import annotations

import numba


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _window(first, right, below, diagonal, width):
    """(the window's pooled value, the offset in its plane of the element aten's max_pool2d picks from
    the relu'd window: 0, 1, width or width + 1) of the window whose elements in raster order these are.

    aten takes the first maximum in raster order and a NaN over anything (it replaces the running
    maximum when `value > maximum or isnan(value)`). Where the window's maximum is positive (or NaN),
    relu changes neither the maximum nor its position. Where it is not, every relu'd value is a zero
    (relu keeps −0.0), no zero beats another, and aten keeps the window's first element, relu'd.
    Selects rather than branches: which element wins is data-dependent and would mispredict.
    """
    wins = (right > first) | (right != right)
    best = right if wins else first
    at = 1 if wins else 0
    wins = (below > best) | (below != below)
    best = below if wins else best
    at = width if wins else at
    wins = (diagonal > best) | (diagonal != diagonal)
    best = diagonal if wins else best
    at = width + 1 if wins else at
    positive = (best > 0) | (best != best)
    return (best if positive else (first if first >= 0 else 0.0)), (at if positive else 0)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def relu_max_pool2_forward(planes, width, out, index, width_out):
    """out[p, i·width_out + j] = max over relu of the window at (2i, 2j) of plane p; index[p, ·] = the
    position h·width + w in the plane of the element aten's max_pool2d would pick from the relu'd window
    (_window says how)."""
    for plane in range(planes.shape[0]):
        source, pooled, chosen = planes[plane], out[plane], index[plane]
        for i in range(out.shape[1] // width_out):
            row = 2 * i * width
            for j in range(width_out):
                at_first = row + 2 * j
                value, offset = _window(source[at_first], source[at_first + 1], source[at_first + width],
                                        source[at_first + width + 1], width)
                pooled[i * width_out + j] = value
                chosen[i * width_out + j] = at_first + offset


@numba.njit(cache=True, nogil=True, error_model="numpy")
def relu_max_pool2_forward_pairs(pairs, width, out, index, width_out):
    """relu_max_pool2_forward of planes of even `width`, given as pairs: the planes viewed as complex
    numbers [planes, height·width/2], whose element j of a row holds its values 2j (real) and 2j + 1
    (imaginary), a window's top or bottom half. Each window is then two contiguous loads, and LLVM
    vectorises the loop over a row's windows (strided, the same loop stays scalar). The same choices
    (_window): the same values and indices bit for bit."""
    half = width // 2
    for plane in range(pairs.shape[0]):
        source, pooled, chosen = pairs[plane], out[plane], index[plane]
        for i in range(out.shape[1] // width_out):
            top, bottom = source[i * width:i * width + width_out], source[i * width + half:(i + 1) * width]
            outputs = slice(i * width_out, (i + 1) * width_out)
            row_pooled, row_chosen = pooled[outputs], chosen[outputs]
            row = 2 * i * width
            for j in range(width_out):
                value, offset = _window(top[j].real, top[j].imag, bottom[j].real, bottom[j].imag, width)
                row_pooled[j] = value
                row_chosen[j] = row + 2 * j + offset


@numba.njit(cache=True, nogil=True, error_model="numpy")
def relu_max_pool2_backward(grad_out, out, index, grad_planes):
    """grad_planes (every element written): each pooled gradient sent back to the position `index` chose,
    where relu lets it through, and zero elsewhere.

    aten's max_pool2d backward adds each gradient to a zeroed plane (0 + g: a −0.0 becomes +0.0) and
    relu's backward then keeps it where the unpooled value is not ≤ 0, that is where `out` is not ≤ 0.
    """
    for plane in range(grad_planes.shape[0]):
        target, gradient, pooled, chosen = grad_planes[plane], grad_out[plane], out[plane], index[plane]
        for position in range(target.shape[0]):
            target[position] = 0
        for k in range(pooled.shape[0]):
            if not pooled[k] <= 0:
                target[chosen[k]] = 0.0 + gradient[k]
