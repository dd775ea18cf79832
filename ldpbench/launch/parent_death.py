"""The parent-death signal (Linux's prctl): SIGTERM to this process when its parent ends.

Its own module, importing only ctypes and signal, because each job's client (ldpbench.launch.client) asks
for it: every job of a campaign pays for the client's imports, and parent_watch's (logging, threading,
dataclasses) cost it more than the rest of its path.
"""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def set_parent_death_signal() -> str | None:
    """SIGTERM to this process when its parent ends; where that cannot be asked for (not Linux), why."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError) as error:
        return str(error)
    return None
