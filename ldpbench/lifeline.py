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

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ldpbench")

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
POLL_SECONDS = 0.5
# After SIGTERM, how long the main thread has to remove its attempt before the process exits hard.
GRACE_SECONDS = 10.0
# Python options that take a separate value, so that `python -X dev -m snakemake` is recognised.
_PYTHON_OPTIONS_WITH_VALUE = {"-X", "-W", "-Q"}


@dataclass(frozen=True)
class Process:
    pid: int
    started: int  # start time in clock ticks after boot: tells a reused pid apart


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, from /proc; None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[1]), int(fields[19])


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_snakemake(argv: list[str]) -> bool:
    """Whether a command line runs Snakemake: `snakemake ...`, `python -m snakemake ...` or
    `python .../bin/snakemake ...`."""
    if not argv:
        return False
    if Path(argv[0]).name == "snakemake":
        return True
    rest = iter(argv[1:])
    for arg in rest:
        if arg == "-m":
            return next(rest, None) == "snakemake"
        if arg in _PYTHON_OPTIONS_WITH_VALUE:
            next(rest, None)
        elif not arg.startswith("-"):
            return Path(arg).name == "snakemake"
    return False


def snakemake_ancestor(pid: int | None = None) -> Process | None:
    """The nearest process that runs Snakemake among `pid` (default: this process's parent) and its
    ancestors, or None."""
    pid = os.getppid() if pid is None else pid
    while pid > 1:
        stat = _stat(pid)
        if stat is None:
            return None
        if is_snakemake(_argv(pid)):
            return Process(pid, stat[2])
        pid = stat[1]
    return None


def process(pid: int) -> Process | None:
    """Process `pid` while it lives (a zombie does not), with the start time that tells a reused pid
    apart; None otherwise."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in "ZXx" else Process(pid, stat[2])


def is_alive(process: Process) -> bool:
    stat = _stat(process.pid)
    # A killed process stays a zombie (state Z) until its own parent reaps it: that is dead too.
    return stat is not None and stat[0] not in "ZXx" and stat[2] == process.started


def identity(pid: int | None = None) -> dict[str, object]:
    """Who a process is, for a record another process reads (`recorded_alive`): its host, pid and start
    time (which tells a reused pid apart)."""
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid)
    return {"host": socket.gethostname(), "pid": pid, "pid_started": None if stat is None else stat[2]}


def recorded_alive(record: dict) -> bool | None:
    """Whether the process an `identity` record names is alive: None when it ran on another host (it
    cannot be seen from here) or the record is not one."""
    try:
        host, pid, started = record["host"], int(record["pid"]), record["pid_started"]
    except (KeyError, TypeError, ValueError):
        return None
    if host != socket.gethostname():
        return None
    return started is not None and is_alive(Process(pid, int(started)))


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


def set_parent_death_signal() -> None:
    """SIGTERM to this process when its parent ends (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError) as error:  # not Linux: the polling thread still watches
        log.debug("no parent-death signal here: %s", error)


_adopted: int | None = None


def adopt(pid: int) -> None:
    """Watch process `pid` as this process's parent: a command that ldpbench.worker forked for the
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
    parent_stat = _stat(parent_pid)
    ancestor = snakemake_ancestor(parent_pid)
    if ancestor is None or parent_stat is None:
        return None
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    set_parent_death_signal()  # (an adopted command's real parent is the worker, which ends with Snakemake)
    parent = Process(parent_pid, parent_stat[2])
    threading.Thread(target=_watch, args=(parent, ancestor), name="lifeline", daemon=True).start()
    log.info("this run stops when its parent (process %d) or Snakemake (process %d) ends",
             parent_pid, ancestor.pid)
    return ancestor
