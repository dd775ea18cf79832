"""Processes told apart by pid and start time, read from /proc: whether one lives, which runs Snakemake,
and a process's identity for a record that another process reads (ldpbench.progress, ldpbench.status).

Linux only (/proc); elsewhere a process reads as unknown (None).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

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


def any_state(pid: int) -> Process | None:
    """Process `pid` as /proc lists it, a zombie too; None when there is none."""
    stat = _stat(pid)
    return None if stat is None else Process(pid, stat[2])


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
