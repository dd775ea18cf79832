"""Column means and variances of an audit's reports, compiled: numpy's mean(axis=0) and var(axis=0), the
same bits, several times faster.

numpy reduces an array of two or more columns over its rows (axis 0) one row after the other, in an
inner loop as long as a row: on the audit's first halves, [500,000, 4] reports of each input, that is
a call per row and three passes (the sum, the deviations, their squares' sum). Here each column is
summed in the same order, row after row, in one loop, then the squared deviations from the same
mean, then each divided by the row count as numpy divides: the same additions in the same order, so
the same values (tests/test_audit.py checks them against numpy). A single column numpy sums
pairwise, not in order: ldpbench.audit leaves that to numpy.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def column_moments(rows):
    """(means, variances) of rows [n, width] float64, each [width]: what rows.mean(axis=0) and
    rows.var(axis=0) give for width ≥ 2."""
    count, width = rows.shape
    sums = np.zeros(width)
    for row in range(count):
        for column in range(width):
            sums[column] += rows[row, column]
    means = sums / count
    squares = np.zeros(width)
    for row in range(count):
        for column in range(width):
            deviation = rows[row, column] - means[column]
            squares[column] += deviation * deviation
    return means, squares / count
