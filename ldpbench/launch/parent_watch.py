"""A run started by Snakemake ends when Snakemake or the job's shell wrapper ends.

`ldpbench run-cell` is started by Snakemake through a bash wrapper. When the wrapper dies, or Snakemake
is killed with -9 (the wrapper then lives on), the run would go on as an orphan, writing results
nobody waits for beside the attempt Snakemake starts next. Linux's parent-death signal covers the
direct parent; a daemon thread polls the nearest Snakemake ancestor (the local Snakemake, or under
SLURM the job step's inner one). Both end in SIGTERM, which `ldpbench run-cell` turns into SystemExit so
that the attempt removes its own files on the way out. A run with no Snakemake ancestor (started by
hand, or by a test) watches nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from ldpbench.launch.parent_death import set_parent_death_signal
from ldpbench.launch.processes import Process, any_state, is_alive, snakemake_ancestor

log = logging.getLogger("ldpbench")

POLL_SECONDS = 0.5
# After SIGTERM, how long the main thread has to remove its attempt before the process exits hard.
GRACE_SECONDS = 10.0


def _stop(reason: str) -> None:
    log.warning("stopping this run: %s", reason)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(128 + signal.SIGTERM)


def _watch(parent: Process, ancestor: Process) -> None:
    while True:
        if not is_alive(parent):
            _stop(f"its parent process {parent.pid} ended")
            return
        if not is_alive(ancestor):
            _stop(f"Snakemake (process {ancestor.pid}) ended")
            return
        time.sleep(POLL_SECONDS)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


_adopted: int | None = None


def adopt(pid: int) -> None:
    """Watch process `pid` as this process's parent: a command that ldpbench.launch.fork_server forked for the
    job process `pid` ends with that job, not with the worker."""
    global _adopted
    _adopted = pid


def stop_with_workflow() -> Process | None:
    """When started under Snakemake: end this process (SIGTERM, then SystemExit in the main thread)
    as soon as its parent or its nearest Snakemake ancestor ends. Returns the ancestor watched.

    Call from the main thread (it installs the SIGTERM handler).
    """
    if not sys.platform.startswith("linux"):
        return None  # the ancestor lookup reads /proc
    parent_pid = os.getppid() if _adopted is None else _adopted
    parent = any_state(parent_pid)  # a zombie too: the watch then sees it ended
    ancestor = snakemake_ancestor(parent_pid)
    if ancestor is None or parent is None:
        return None
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # (An adopted command's real parent is the worker, which ends with Snakemake.)
    if (unavailable := set_parent_death_signal()) is not None:  # not Linux: the polling thread still watches
        log.debug("no parent-death signal here: %s", unavailable)
    threading.Thread(target=_watch, args=(parent, ancestor), name="parent-watch", daemon=True).start()
    log.info("this run stops when its parent (process %d) or Snakemake (process %d) ends",
             parent_pid, ancestor.pid)
    return ancestor
