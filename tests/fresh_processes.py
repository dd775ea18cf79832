"""Fresh processes forked from multiprocessing's fork server rather than from pytest's process, which runs
threads, and rather than spawned, where each would import MLflow or Snakemake again (seconds of a core
each): the server imports them once. For the tests that start several MLflow writers at once, and for
the workflow tests' Snakemake runs (`snakemake` below)."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

# One list for every test: the server is started once per process, with the preload of its first user.
# Beside MLflow's client and Snakemake's command line: what each Snakemake would import again after its
# fork, the modules of ldpbench that the workflow's parse imports (workflow/rules/common.smk) and the
# report plugin Snakemake's plugin registry loads (half a second of a core per Snakemake without them).
# Only a cache: a name missing here is imported by the Snakemake that needs it.
PRELOAD = ["mlflow.tracking", "ldpbench.results.tracking", "snakemake.cli", "ldpbench.campaign", "ldpbench.audit",
           "ldpbench.tuning", "ldpbench.launch.fork_server", "ldpbench.progress", "ldpbench.results.live",
           "ldpbench.snakemake_compat", "snakemake.report.html_reporter"]


def context() -> multiprocessing.context.BaseContext:
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(PRELOAD)
    return forkserver


class Snakemake:
    """`python -m snakemake ARGUMENTS` run with `environment` in `cwd` (default: this one), its stdout and
    stderr into the file `output`, as a child of the fork server: a Popen's wait and kill. It differs
    from a spawned Snakemake in its command line, the server's: its jobs' parent watch
    (ldpbench.launch.parent_watch), which looks for a Snakemake command line among their ancestors, finds
    none and stays off. The tests of that watch and of killed or interrupted campaigns spawn their
    Snakemake."""

    def __init__(self, arguments: list[str], environment: dict[str, str], output: str | Path,
                 cwd: str | Path | None = None):
        self.arguments = ["snakemake", *arguments]
        self._process = context().Process(target=_snakemake_main, args=(
            list(arguments), dict(environment), str(output), str(cwd or Path.cwd())))
        self._process.start()

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.arguments, timeout)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()  # SIGKILL, and nothing once it has ended


def _snakemake_main(arguments: list[str], environment: dict[str, str], output: str, cwd: str) -> None:
    os.chdir(cwd)
    stream = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(stream, sys.stdout.fileno())
    os.dup2(stream, sys.stderr.fileno())
    os.close(stream)
    os.environ.clear()
    os.environ.update(environment)
    # A spawned interpreter puts PYTHONPATH's entries first (a plugin package a test puts there).
    sys.path[:0] = [entry for entry in environment.get("PYTHONPATH", "").split(os.pathsep)
                    if entry and entry not in sys.path]
    sys.argv = ["snakemake", *arguments]
    from snakemake.cli import main

    try:
        main()
    finally:
        # An interpreter's exit runs them (the SLURM executor cleans its old logs there); multiprocessing
        # ends its children without.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
