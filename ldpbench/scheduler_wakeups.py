"""At most one pending timed wake-up of Snakemake's scheduler, instead of one more chain per job.

Snakemake 9's scheduler (`snakemake.scheduling.job_scheduler.JobScheduler`) ends every scheduling
pass by starting a `threading.Timer` that wakes it again one rate-limit timespan later
(`--max-jobs-per-timespan`, 100 jobs a second by default), so that jobs the limit held back are
looked at again. The passes those timers wake start timers of their own, so every pass that
something else woke (the start, a job that finished or failed) starts a chain of wake-ups that
lasts until Snakemake exits. After J jobs, the scheduler makes about J passes a second, each over
every ready job, with nothing to do while the cores are busy. In a 10,000-run campaign (hundreds of
jobs on two cores) Snakemake's own process took about a quarter of a core, starting hundreds of
threads a second by the end; with one pending wake-up, a small fraction of that
(upstream: snakemake/snakemake#3744, open as of 9.27.1).

One pending wake-up is enough: the pass it wakes starts the next one, and any other pass in the
meantime sees that a wake-up is already due and gets that one, which may come before its own
timespan is up. If the limit still holds then, the next wake-up follows a timespan later: a job
the limit held back is looked at again within two timespans instead of one. The timer is a daemon
thread, so Snakemake no longer waits for the last one (up to a timespan) when it exits.

Nothing else changes: which jobs run and when is still Snakemake's choice, with the same limits.
"""

from __future__ import annotations

import threading

from snakemake.logging import logger

# Snakemake's spelling; its absence (a renamed method) leaves the scheduler as it is, with a warning.
METHOD = "_schedule_reevalutation"
SHIPPED = "_ldpbench_shipped_wakeup"  # the method it replaced, on a class whose method is replaced


def shipped_wakeup(scheduler_class: type):
    """The class's own timed wake-up, as Snakemake ships it, whether or not it was replaced."""
    return getattr(scheduler_class, SHIPPED, None) or getattr(scheduler_class, METHOD)


def coalesce_wakeups(scheduler_class: type | None = None) -> bool:
    """Replace the scheduler class's timed wake-up (Snakemake's JobScheduler unless another is given)
    by one that keeps at most one pending per scheduler.

    Returns whether the scheduler now coalesces its wake-ups (again: a second call changes nothing).
    """
    if scheduler_class is None:
        try:
            from snakemake.scheduling.job_scheduler import JobScheduler as scheduler_class
        except ImportError:
            scheduler_class = None
    if getattr(scheduler_class, SHIPPED, None) is not None:
        return True
    if not callable(getattr(scheduler_class, METHOD, None)):
        logger.warning(f"NOTICE: Snakemake's scheduler has no {METHOD}; its timed wake-ups are not coalesced, "
                       "which costs CPU in campaigns of many jobs (ldpbench/scheduler_wakeups.py).")
        return False
    lock = threading.Lock()

    def schedule_one_wakeup(self, delay: float) -> None:
        with lock:
            if getattr(self, "_ldpbench_wakeup_due", False):
                return
            self._ldpbench_wakeup_due = True

        def wake() -> None:
            # Cleared before the release, so that the pass this wakes can ask for the next one.
            with lock:
                self._ldpbench_wakeup_due = False
            self._open_jobs.release()

        timer = threading.Timer(delay, wake)
        timer.daemon = True
        timer.start()

    setattr(scheduler_class, SHIPPED, getattr(scheduler_class, METHOD))
    setattr(scheduler_class, METHOD, schedule_one_wakeup)
    logger.debug(f"{scheduler_class.__name__}: at most one timed wake-up pending (ldpbench/scheduler_wakeups.py)")
    return True
