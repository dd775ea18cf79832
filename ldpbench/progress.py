"""What a running campaign says about itself, for `ldpbench status` and the console.

Three kinds of record under <campaign>/progress/ (ldpbench.layout), each written aside and renamed:

* starting-<pid>.json: a Snakemake process is reading the campaign and building its job graph
  (written when the workflow is parsed; a dry run leaves one whose process is gone, which counts
  for nothing and is removed by the next workflow);
* workflow.json: the last workflow that ran (from Snakemake's onstart): its process, its cells (the
  campaign as that workflow runs it) and how it ended (onsuccess, onerror);
* jobs/<host>-<pid>-<start>.json: one per ldpbench command a job of the workflow runs (found through
  $LDPBENCH_PROGRESS): its step, its log, its progress and ETA where it reports one, how it ended.

A record names its process by host, pid and start time (ldpbench.launch.processes.identity), so a reader tells
a live process from a dead one or a reused pid. Nothing here imports more than the standard library.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ldpbench.atomic import write_json
from ldpbench.durations import duration
from ldpbench.launch import processes

PROGRESS_ENV = "LDPBENCH_PROGRESS"  # the campaign's progress directory, set by the workflow for its jobs
WORKFLOW_FILE = "workflow.json"
JOBS_DIR = "jobs"
STARTING_PREFIX = "starting-"
RUNNING, COMPLETE, FAILED = "running", "complete", "failed"
OK, STOPPED = "ok", "stopped"  # how a job ended besides failing: done, or stopped by a signal (Ctrl-C, kill)
# A job's record is rewritten at most this often, and its console line printed at most this often.
RECORD_SECONDS = 2.0
CONSOLE_SECONDS = 10.0


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def read_record(path: Path) -> dict[str, Any] | None:
    """A record, or None where it is missing or not a record (half a file cannot be: they are renamed)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


# ---------------------------------------------------------------------------------------- the workflow
class Starting:
    """The record that this process (Snakemake, parsing the workflow) is building a campaign's job graph."""

    def __init__(self, directory: str | Path):
        """Write it (removing the records of such processes that are gone)."""
        directory = Path(directory)
        # The directories this record makes: an invalid campaign file leaves none of them (withdraw).
        self.made = [parent for parent in (directory, *directory.parents) if not parent.exists()]
        for stale in directory.glob(f"{STARTING_PREFIX}*.json"):
            record = read_record(stale)
            if record is None or processes.recorded_alive(record) is False:
                stale.unlink(missing_ok=True)
        self.path = directory / f"{STARTING_PREFIX}{os.getpid()}.json"
        write_json(self.path, {**processes.identity(), "started_at": now()})

    def withdraw(self) -> None:
        """Remove the record, and the directories it made where they are still empty (the campaign file
        was refused: nothing of it is left behind)."""
        self.path.unlink(missing_ok=True)
        for made in self.made:  # the deepest first
            with contextlib.suppress(OSError):
                made.rmdir()


def workflow_begins(directory: str | Path, cells: list, log: str | None) -> None:
    """The workflow starts its jobs (Snakemake's onstart): its cells (ldpbench.campaign.Cell: their ids,
    phases, datasets, mechanisms and numbers of runs) are the campaign `ldpbench status` reports; the
    job records of earlier workflows go."""
    directory = Path(directory)
    jobs = directory / JOBS_DIR
    for old in jobs.glob("*.json"):
        old.unlink(missing_ok=True)
    recorded = {cell.cell_id: {"phase": cell.phase, "dataset": cell.dataset, "mechanism": cell.mechanism,
                               "runs": cell.run_count} for cell in cells}
    write_json(directory / WORKFLOW_FILE, {**processes.identity(), "state": RUNNING, "started_at": now(),
                                           "ended_at": None, "log": log, "cells": recorded})
    (directory / f"{STARTING_PREFIX}{os.getpid()}.json").unlink(missing_ok=True)


def workflow_ends(directory: str | Path, ok: bool, log: str | None) -> None:
    """The workflow has ended (Snakemake's onsuccess or onerror)."""
    path = Path(directory) / WORKFLOW_FILE
    record = read_record(path) or processes.identity()
    write_json(path, {**record, "state": COMPLETE if ok else FAILED, "ended_at": now(), "log": log})


# ---------------------------------------------------------------------------------------- its jobs
class Job:
    """One ldpbench command: its record when a workflow runs it (`directory`: the campaign's progress
    directory), and its progress reports.

    `report(done, total)` updates the record (at most every RECORD_SECONDS) and prints a line with the
    ETA to standard output (at most every CONSOLE_SECONDS), which Snakemake shows on its console:
    a long step is never silent, inside a workflow or not.
    """

    def __init__(self, directory: str | Path | None, step: str, what: str = "", out=None):
        identity = processes.identity()
        self.path = None if directory is None else Path(directory) / JOBS_DIR / (
            f"{identity['host']}-{identity['pid']}-{identity['pid_started']}.json")
        self.name = f"ldpbench {step}" + (f" {what}" if what else "")
        self.out = out or sys.stdout
        self.task: tuple[str, float] | None = None  # what is being counted (unit, total), and since when:
        self.task_started = time.monotonic()  # a job may count several things one after the other
        self.record: dict[str, Any] = {**identity, "step": step, "what": what, "state": RUNNING,
                                       "started_at": now(), "updated_at": now(), "ended_at": None,
                                       "log": _stderr_path(), "progress": None}
        self._written = self._printed = -float("inf")
        self._write()

    def _write(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):  # progress is a courtesy: it never fails a job
                write_json(self.path, self.record)
        self._written = time.monotonic()

    def report(self, done: float, total: float, unit: str = "") -> None:
        clock = time.monotonic()
        if self.task != (unit, total):
            self.task, self.task_started, self._printed = (unit, total), clock, -float("inf")
        elapsed = clock - self.task_started
        left = elapsed * (total - done) / done if 0 < done < total else (0.0 if done >= total else None)
        self.record["progress"] = {"done": done, "total": total, "unit": unit, "seconds_left": left}
        self.record["updated_at"] = now()
        final = done >= total
        if final or clock - self._written >= RECORD_SECONDS:
            self._write()
        if final or clock - self._printed >= CONSOLE_SECONDS:
            self._printed = clock
            with contextlib.suppress(OSError, ValueError):
                print(f"{self.name}: {format_progress(self.record['progress'])}", file=self.out, flush=True)

    def finish(self, state: str) -> None:
        """Record how the job ended: OK, FAILED or STOPPED."""
        self.record.update(state=state, ended_at=now(), updated_at=now())
        self._write()


def format_progress(progress: dict[str, Any]) -> str:
    """E.g. '24 % (12,000 of 50,000 texts), about 1 min 30 s left'."""
    done, total, unit = progress["done"], progress["total"], progress.get("unit") or ""
    share = 100 * done / total if total else 100.0
    text = f"{share:.0f} % ({done:,.0f} of {total:,.0f}{' ' + unit if unit else ''})"
    left = progress.get("seconds_left")
    return text + (f", about {duration(left)} left" if left is not None and done < total else "")


def _stderr_path() -> str | None:
    """The file this process's standard error goes to (the job's log, where the workflow redirects it)."""
    with contextlib.suppress(OSError):
        target = os.readlink("/proc/self/fd/2")
        if target.startswith("/"):
            return target
    return None


_current: Job | None = None


def job_starts(step: str, what: str = "") -> Job:
    """This command's job: recorded where a workflow runs it ($LDPBENCH_PROGRESS names the campaign's
    progress directory), otherwise only reporting to the console."""
    global _current
    _current = Job(os.environ.get(PROGRESS_ENV) or None, step, what)
    return _current


def report(done: float, total: float, unit: str = "") -> None:
    """Report the progress of this command's job (a long step calls this as it goes)."""
    if _current is not None:
        _current.report(done, total, unit)
