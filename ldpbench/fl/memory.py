"""Freed memory kept for reuse: glibc's malloc told not to hand the heap's free memory back to the kernel.

A training step allocates and frees the same temporaries again and again (a LeNet-5 step of 600
images: its activations and their gradients, tens of MB). glibc serves blocks below its mmap
threshold from its heap, and trims the heap's free top back to the kernel once it exceeds the trim
threshold (by default twice the mmap threshold, which itself follows the sizes freed). When a step
frees its temporaries together, the top is trimmed, and the next step's temporaries come back from
the kernel page by page: one page fault for each 4 KiB written, a cost of the order of writing the
values. With the trim threshold raised the heap keeps its pages. The mmap threshold is set to
glibc's own dynamic maximum (32 MiB), since setting either stops glibc adjusting them; blocks above
it (a round's update rows, which ldpbench.fl.algorithms.UpdateRows reuses) are still mapped and
unmapped.

Nothing computed changes: torch aligns every block to 64 bytes either way. The price is that a
process keeps the heap of its largest step until it exits. The setting is process-wide and cannot be
undone (glibc has no call that restores the dynamic thresholds), so it is made once, by the process
that trains (`keep_freed_memory`, called by the engine). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import platform

# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's largest dynamic mmap threshold on 64-bit machines (DEFAULT_MMAP_THRESHOLD_MAX).
MMAP_THRESHOLD = 32 * 2**20
NEVER = 2**31 - 1


@functools.cache
def keep_freed_memory() -> bool:
    """Tell glibc to keep the heap's freed memory for reuse (once per process); whether it took the
    setting (False elsewhere than glibc)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER))
