"""Snakemake's scheduler keeps at most one timed wake-up pending (ldpbench/scheduler_wakeups.py).

Each test patches a subclass of the installed Snakemake's JobScheduler with Snakemake's own method
put back (a workflow parsed in this process, by the tests that use Snakemake's API, patched the
class itself). The timers wait 0.2 s; the tests wait for the first wake-up (up to 10 s) and then
count the others, so a slow machine only makes them slower.
"""

from __future__ import annotations

import threading
import time

import pytest
from snakemake.scheduling.job_scheduler import JobScheduler

from ldpbench.scheduler_wakeups import METHOD, SHIPPED, coalesce_wakeups, shipped_wakeup

from workflow_cli import run_snakemake, small_config

DELAY = 0.2


def shipped_class() -> type:
    """A subclass of Snakemake's scheduler with the wake-up Snakemake ships, not yet patched."""

    class Shipped(JobScheduler):
        pass

    setattr(Shipped, METHOD, shipped_wakeup(JobScheduler))
    setattr(Shipped, SHIPPED, None)
    return Shipped


def bare_scheduler(scheduler_class: type) -> JobScheduler:
    """A scheduler with only what a wake-up touches: the semaphore its scheduling loop waits on."""
    scheduler = object.__new__(scheduler_class)
    scheduler._open_jobs = threading.Semaphore(0)
    return scheduler


def wakeups_after(scheduler: JobScheduler, passes: int) -> int:
    """How many times the scheduler is woken after `passes` scheduling passes ask for a wake-up."""
    for _ in range(passes):
        getattr(scheduler, METHOD)(DELAY)
    assert scheduler._open_jobs.acquire(timeout=10), "no wake-up came"
    time.sleep(3 * DELAY)  # the other timers, started at the same time, have fired by now
    woken = 1
    while scheduler._open_jobs.acquire(blocking=False):
        woken += 1
    return woken


def test_passes_that_ask_for_a_wakeup_while_one_is_due_get_that_one():
    Coalesced = shipped_class()
    assert coalesce_wakeups(Coalesced)
    scheduler = bare_scheduler(Coalesced)
    assert wakeups_after(scheduler, 50) == 1
    # The pass that wake-up starts asks for the next one, and gets it: the chain goes on.
    assert wakeups_after(scheduler, 1) == 1
    # Another scheduler has its own wake-up.
    assert wakeups_after(bare_scheduler(Coalesced), 3) == 1


def test_snakemakes_own_method_wakes_once_per_pass():
    """The power check: the method the patch replaces wakes the scheduler once per pass, as the
    module's docstring says (if Snakemake fixes this, the patch and this test can go)."""

    assert wakeups_after(bare_scheduler(shipped_class()), 50) == 50


def test_the_wakeup_timer_does_not_hold_up_the_exit():
    Coalesced = shipped_class()
    coalesce_wakeups(Coalesced)
    before = set(threading.enumerate())
    getattr(bare_scheduler(Coalesced), METHOD)(60)
    (timer,) = set(threading.enumerate()) - before
    assert timer.daemon
    timer.cancel()


def test_without_a_class_it_patches_snakemakes_scheduler(monkeypatch):
    """What the workflow calls (common.smk); monkeypatch puts Snakemake's class back afterwards."""
    shipped = shipped_wakeup(JobScheduler)
    monkeypatch.setattr(JobScheduler, METHOD, shipped)
    monkeypatch.setattr(JobScheduler, SHIPPED, None, raising=False)
    assert coalesce_wakeups()
    assert getattr(JobScheduler, METHOD) is not shipped and shipped_wakeup(JobScheduler) is shipped


def test_patching_twice_changes_nothing_and_a_missing_method_is_left_alone():
    Coalesced = shipped_class()
    assert coalesce_wakeups(Coalesced)
    patched = getattr(Coalesced, METHOD)
    assert coalesce_wakeups(Coalesced) and getattr(Coalesced, METHOD) is patched

    class Renamed:
        pass

    assert not coalesce_wakeups(Renamed)
    assert not hasattr(Renamed, METHOD)


@pytest.mark.integration
def test_the_workflow_coalesces_the_wakeups_of_its_scheduler(tmp_path):
    """common.smk applies it when the workflow is parsed (its debug line shows with --verbose)."""
    result = run_snakemake(tmp_path, small_config(), "--cores", "1", "--dry-run", "--verbose")
    assert result.returncode == 0, result.stdout[-5000:]
    assert "JobScheduler: at most one timed wake-up pending" in result.stdout
