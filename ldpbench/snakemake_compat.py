"""The Snakemake attributes the workflow uses beyond Snakemake's documented API, in one place.

Snakemake documents the Snakefile's directives and globals (`config`, `workflow.source_path()`,
`workflow.cores`) and `snakemake.utils` (`min_version`, `validate`). The workflow needs a few more of
its attributes, listed in NEEDED with what each is for; the Snakefile, the rule files and the package
reach them through this module only (tests/test_snakemake_compat.py scans for any other use). `check`,
the first thing workflow/rules/common.smk does, fails on a Snakemake that lacks one, naming it and the
installed version, before anything else runs: a renamed attribute stops the workflow at once instead
of leaving it to misbehave later. pyproject.toml pins the Snakemake versions these were checked
against.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from pathlib import Path
from typing import Any

from ldpbench.errors import UnsupportedSnakemake

_MISSING = object()

# What the workflow reads or sets on Snakemake's `workflow` object, and why.
WORKFLOW_ATTRIBUTES = {
    "config_settings.overwrite_config": "the campaign as --configfile and --config give it, without "
                                        "config/config.yaml's defaults",
    "overwrite_configfiles": "the files given with --configfile",
    "configfiles": "every config file the campaign was read from, recorded in its campaign file",
    "local_exec": "whether the jobs run on this machine rather than through an executor plugin (SLURM)",
    "basedir": "the Snakefile's directory: the checkout the rules' conda environment installs",
    "scheduler": "Snakemake's job scheduler, built before onstart (its job rate limit, below)",
}
# Set on the scheduler in onstart (switch_off_local_rate_limit); its class is checked when the
# workflow is parsed, before the scheduler exists.
SCHEDULER_ATTRIBUTE = "job_rate_limiter"
# Module-level names of Snakemake the workflow imports (from here); a missing one fails this module's
# import, naming it.
MODULE_NAMES = {
    "snakemake.exceptions.WorkflowError": "the error Snakemake reports without a traceback",
    "snakemake.logging.logger": "Snakemake's log, where the workflow's notices go",
}
NEEDED = {
    **{f"workflow.{name}": why for name, why in WORKFLOW_ATTRIBUTES.items()},
    f"JobScheduler.{SCHEDULER_ATTRIBUTE}": "the job rate limit (--max-jobs-per-timespan), switched off in "
                                           "onstart for local runs",
    **MODULE_NAMES,
}


def snakemake_version() -> str:
    try:
        return metadata.version("snakemake")
    except metadata.PackageNotFoundError:
        return "(not installed as a package)"


def _module_name(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, _MISSING)
    except ImportError:
        return _MISSING


def _attribute(obj: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        obj = getattr(obj, name, _MISSING)
        if obj is _MISSING:
            break
    return obj


def _scheduler_class() -> Any:
    return _module_name("snakemake.scheduling.job_scheduler.JobScheduler")


def _sets_rate_limiter(scheduler_class: Any) -> bool:
    """Whether the scheduler's constructor assigns SCHEDULER_ATTRIBUTE: an instance attribute, so the
    class has no such attribute to look up; the names its code uses show whether it is there."""
    init = getattr(scheduler_class, "__init__", None)
    return SCHEDULER_ATTRIBUTE in getattr(getattr(init, "__code__", None), "co_names", ())


def missing(workflow: Any, scheduler_class: Any = None) -> list[str]:
    """The entries of NEEDED that this Snakemake's `workflow` object and scheduler class (unless another
    is given) lack; MODULE_NAMES are imported below, and a missing one fails that import."""
    lacking = [f"workflow.{name}" for name in WORKFLOW_ATTRIBUTES if _attribute(workflow, name) is _MISSING]
    if not _sets_rate_limiter(_scheduler_class() if scheduler_class is None else scheduler_class):
        lacking.append(f"JobScheduler.{SCHEDULER_ATTRIBUTE}")
    return lacking


def _unsupported(names: list[str]) -> UnsupportedSnakemake:
    lines = "\n".join(f"  {name}: {NEEDED[name]}" for name in names)
    return UnsupportedSnakemake(
        f"Snakemake {snakemake_version()} lacks what ldpbench's workflow uses of it:\n{lines}\n"
        "Install a Snakemake that pyproject.toml admits (pip install -e .), or adapt "
        "ldpbench/snakemake_compat.py to this version."
    )


def check(workflow: Any) -> None:
    """Fail, naming each missing attribute and the Snakemake version, unless this Snakemake has all of
    NEEDED. Called when the workflow is parsed, with Snakemake's `workflow` object."""
    lacking = missing(workflow)
    if lacking:
        raise _unsupported(lacking)


def _required(dotted: str) -> Any:
    value = _module_name(dotted)
    if value is _MISSING:
        raise _unsupported([dotted])
    return value


WorkflowError = _required("snakemake.exceptions.WorkflowError")
logger = _required("snakemake.logging.logger")


def command_line_config(workflow: Any) -> dict:
    """The configuration from --configfile's files and --config alone (config/config.yaml not merged)."""
    return workflow.config_settings.overwrite_config


def config_files_given(workflow: Any) -> list[Path]:
    """The files given with --configfile (none: the Snakefile's own configfile alone)."""
    return list(workflow.overwrite_configfiles)


def config_files(workflow: Any) -> list[Path]:
    """Every config file the configuration was read from, the Snakefile's own included."""
    return list(workflow.configfiles)


def jobs_run_here(workflow: Any) -> bool:
    """Whether the jobs run on this machine (no executor plugin such as SLURM's submits them). Known from
    onstart on: at the parse Snakemake has not set its executor yet, and every run reads as local."""
    return bool(workflow.local_exec)


def workflow_dir(workflow: Any) -> str:
    """The directory of the Snakefile."""
    return str(workflow.basedir)


def switch_off_local_rate_limit(workflow: Any) -> bool:
    """Switch Snakemake's job rate limit (--max-jobs-per-timespan) off when the jobs run on this
    machine; returns whether it did. Call it from onstart.

    Why: with the limit on, Snakemake's scheduler ends every scheduling pass that finds jobs waiting
    by starting a `threading.Timer` that wakes it again a timespan later (a second by default), so
    that jobs the limit held back are looked at again; the pass that timer wakes starts the next one.
    Every pass that something else woke (a job that finished) starts one more such chain, and each
    lasts while jobs wait: after J jobs, J passes a second over every waiting job, with nothing to do
    while the cores are busy (upstream: snakemake/snakemake#3744). In a campaign of thousands of
    cells on a few cores that is a sizeable share of a core spent by Snakemake's own process.

    Without a limiter, the scheduler starts no timer and never consults a limit: a pass runs when a
    job finishes or fails. Locally nothing is lost: --cores and the rules' resources already bound
    what runs at once, and the limit exists to spare a cluster's scheduler a flood of submissions.
    Where an executor plugin submits the jobs (SLURM), it paces the submissions, so it stays, and
    so do the timers.

    Snakemake builds its scheduler before it calls onstart and makes the first pass after it, so the
    limit is off from the first pass (before any job was counted against it).
    """
    if not jobs_run_here(workflow):
        return False
    scheduler = workflow.scheduler
    if scheduler is None or not hasattr(scheduler, SCHEDULER_ATTRIBUTE):
        raise _unsupported([f"JobScheduler.{SCHEDULER_ATTRIBUTE}"])
    if scheduler.job_rate_limiter is not None:
        scheduler.job_rate_limiter = None
        logger.info("Job rate limit (--max-jobs-per-timespan): off, the jobs run on this machine "
                    "within --cores (ldpbench/snakemake_compat.py)")
    return True
