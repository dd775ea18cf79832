"""The fork server: a warm process for a local campaign, ldpbench's imports done once and each job's
command forked from it.

A run job spends a few seconds importing torch, pandas and pyarrow and a fraction of a second
training (as the default campaign's runs do). Under a local Snakemake, the workflow starts one fork
server (`ldpbench worker`, from the Snakefile's onstart, by `start`) that imports those modules once
and listens on a Unix socket in a private directory; `python -m ldpbench <command>` hands it its
command line, working directory, environment and standard streams (ldpbench.launch.client), and the
server forks a child that runs the command exactly as a fresh process would, with the job's streams,
directory and environment. The private directory, in the system's temporary directory, is named for
that Snakemake (its pid and start time): the server removes it when Snakemake ends, however it ends,
and a server start removes those of ended campaigns that no server removed (one killed itself).

The server also holds each dataset a run-cell job loaded, read and verified once, for the jobs
forked after it (ldpbench.data.prepared.warm): each job gets its own copy-on-write view, taken only
while the dataset's files are unchanged, and saves reading and verifying it again in every cell.

It forks only while it runs a single OS thread (why_not_forkable, from /proc/self/task, checked before
every fork): a fork copies only the calling thread, and a lock another thread held stays locked in
the child. So it starts none and keeps none that its imports would start: numerical libraries are
single-threaded (THREAD_VARIABLES), pyarrow's jemalloc runs no background thread (JEMALLOC_CONFIG),
MLflow's import leaves out the optional packages that start pools (BLOCKED_WHILE_PRELOADING), and a
dataset is read in a throwaway child (reading Parquet starts Arrow's I/O and CPU pools, which stay),
which hands the arrays back through a memory file. Where a thread is there all the same (a preload
step that started one: the log names the step and the threads), the server forks nothing more and
declines each command, which its client then runs itself.

It also loads numba's compiled draw and perturbers, so that its jobs draw even a linear model's small
rounds compiled (ldpbench.mechanisms.scalar.load_compiled_kernels), right after what the cells import;
on a new installation a child compiles and caches them first, while the server serves jobs, and the
server then loads the cache (COMPILED_STEPS_NAME: once per installation).

After its campaign, a worker started with a linger (the workflow's `worker.linger_seconds`) stays on as
the seed of the next campaigns (linger_as_seed): start() first asks the seed of the new worker's key
(seed_key: the interpreter, ldpbench, the environment and whether it tracks) to fork it, so that a
campaign run again after an edit starts with every import done instead of paying seconds of a core for
them. One seed per key (a lock it holds); it ends once no worker has started for the linger, or as soon
as the file of a module it imported changed, which its forks would not run (_Worker.outdated).

The numbers cannot change: the server only imports, reads datasets and loads kernels (its one
throwaway draw of each is keyed apart; it starts no thread pool of its own; the kernels give the
bits of the numpy and torch code), every random stream in ldpbench is keyed by its plan, and the
child applies the job's thread count (OMP_NUM_THREADS, which Snakemake sets for every shell job; a
client sends only commands that carry both it and the workflow's job marker, $LDPBENCH_JOB) to torch
and the BLAS libraries as a fresh process would read it.

The job's command is run by the `run` that `serve` is given (`ldpbench worker` passes the CLI's main):
this module imports nothing of the CLI. It imports only the standard library at import time; the
modules it preloads are imported by `serve`.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib
import json
import logging
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ldpbench.launch import parent_watch, processes
from ldpbench.launch.client import (
    FORWARDED_SIGNALS,
    MAX_MESSAGE,
    SOCKET_ENV,
    STREAMS,
    UNDECODABLE,
    decode,
    encode,
    installation,
    private_directory,
    send_request,
    send_signal,
)

if TYPE_CHECKING:
    from ldpbench.data.prepared import HeldCopy

log = logging.getLogger("ldpbench")

FORKED = "forked"  # the worker's log line for each command it runs
# Its log line when it reaps a command's child: its exit code, wall seconds and CPU seconds (user and
# system, the child's own threads and the processes it waited for), which campaign profiles read.
ENDED = "ended"
SINGLE_THREAD = "1 thread"  # in each FORKED line: the OS threads the worker ran as it forked (why_not_forkable)
DECLINED = "declined"  # its log line for each command it left to its client (not a single thread)
READY = "ready"  # its log line once every preload step is done
STOPPED = "worker stopped"  # its log line once its campaign's children have ended, with the commands it ran
SEED = "lingering as the seed"  # its log line when it stays on for the next campaigns (linger_as_seed)
# What the workflow's jobs import (prepare, run-cell, audit, select, aggregate, compare, report, then
# tracking-init and track: MLflow and its SQL store, seconds of imports), in the order they are needed.
# A campaign's first job prepares its data, which needs pandas and Parquet but not torch: the worker forks
# it after the first steps, and imports torch while it runs, instead of before.
# "module:function": import, then call: numba's compiled draw and perturbers, loaded right after what the
# cells import, so that the cells forked after it draw their small rounds compiled without each paying
# numba's import and loading (most of a second).
PRELOAD = (
    "ldpbench.data.registry",
    "pyarrow.parquet",  # and the two below: what pandas' first to_parquet imports
    "pyarrow.pandas_compat",
    "pyarrow.vendored.version",
    "ldpbench.runner",
    "ldpbench.audit",
    "ldpbench.mechanisms.scalar:load_compiled_kernels",
    # What reading Parquet imports (read_parquet, pq.read_table): a final cell's run files, the tables;
    # after the kernels, so that a campaign's first cells (trials, which read no run file) wait not for it.
    "pyarrow.dataset",
    "ldpbench.tuning",
    "ldpbench.results.tables",
    "ldpbench.results.compare",
    "ldpbench.results.report",
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "ldpbench.results.tracking",
)
# The last preload step each command imports (its module or one after it in PRELOAD): a job is forked
# once the worker has done the steps up to it. Forked earlier, a job imports what is missing itself: the
# first cells of a campaign, forked while the worker still imported torch, each loaded numba's kernels
# or drew their rounds without them, taking twice as long, and the worker then loaded them again.
NEEDED_BEFORE_FORK = {
    "prepare": "pyarrow.vendored.version",
    "features": "ldpbench.runner",
    "run-cell": "ldpbench.mechanisms.scalar:load_compiled_kernels",
    "audit-table": "ldpbench.mechanisms.scalar:load_compiled_kernels",
    "select": "ldpbench.tuning",
    "aggregate": "ldpbench.results.tables",
    "compare": "ldpbench.results.compare",
    "report": "ldpbench.results.report",
    "tracking-init": "ldpbench.results.tracking",
    "track": "ldpbench.results.tracking",
    "track-report": "ldpbench.results.tracking",
}
# What only the tracking steps import: a campaign that does not track leaves them out (MLflow's import
# takes seconds of a core from the jobs of a small campaign).
TRACKING_PRELOAD = ("mlflow", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store", "ldpbench.results.tracking")
# MLflow's import registers its optional dataset types, importing these packages where they are
# installed; each starts threads at import (polars' pool, TensorFlow's), after which the worker could
# fork nothing. The worker imports with them blocked (ldpbench uses none of those dataset types); they
# are importable again after each step, in the worker and in every job it forks. A package missing
# here costs speed, not correctness: the worker then declines to fork (why_not_forkable) and logs why.
BLOCKED_WHILE_PRELOADING = ("polars", "tensorflow", "pyspark")
# Preload steps whose first run on an installation compiles machine code and caches it (numba: seconds,
# several times the load from the cache): a forked child runs such a step first while the worker goes on
# serving jobs, and the worker then runs it itself, from the cache.
COMPILED_IN_A_CHILD_FIRST = ("ldpbench.mechanisms.scalar:load_compiled_kernels",)
# Once such a child has run its step, the step's key goes into this file, beside numba's cache (in
# $NUMBA_CACHE_DIR, or the package's bytecode directory): a later worker with the same key loads the cache
# itself, without a child that would load it first (most of a second of a core, every campaign). The key
# changes with any source file of the package, the interpreter and numba (compiled_step_key).
COMPILED_STEPS_NAME = "ldpbench-compiled-steps.json"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
# The worker's own numerical libraries stay single-threaded (no thread pool to fork); each child
# then takes the job's count.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# pyarrow's bundled jemalloc (linked in whichever memory pool Arrow uses) starts a background thread
# when the library loads, to return freed pages to the system; without it jemalloc does that work in
# its own allocation calls. Read once, when pyarrow loads: the worker's children keep the setting.
JEMALLOC_CONFIG_VARIABLE = "JE_ARROW_MALLOC_CONF"
JEMALLOC_CONFIG = "background_thread:false"
# A worker's private directory, in the system's temporary directory: DIRECTORY_PREFIX, then its owner's
# pid and start time (which tell when its campaign has ended), then mkdtemp's random part.
DIRECTORY_PREFIX = "ldpbench-"
_DIRECTORY_NAME = re.compile(rf"{DIRECTORY_PREFIX}(\d+)-(\d+)-[^/]+")
SOCKET_NAME = "worker.sock"
# A seed's directory (seed_directory), this user's alone, in the system's temporary directory: SEED_PREFIX,
# the user's id, then the key of the workers it forks (seed_key). It holds the seed's socket, the lock
# the seed holds while it lives (one seed per key) and the seed's log.
SEED_PREFIX = "ldpbench-seed-"
SEED_LOCK_NAME = "seed.lock"
SEED_LOG_NAME = "seed.log"
# What a shell changes between two commands: left out of the environment a seed is keyed by.
VOLATILE_VARIABLES = ("PWD", "OLDPWD", "_", "SHLVL")
_DONE_STEPS: set[str] = set()  # the preload steps this process has run (and a process forked from it)
# The file of each module imported by the end of a preload step, as it was then (its modification time and
# size): a seed forks nothing once one changed (_Worker.outdated).
_SOURCES: dict[str, tuple[int, int]] = {}
POLL_SECONDS = 0.5
GRACE_SECONDS = 10.0  # after SIGTERM, before SIGKILL, for a child whose client went away
Command = Callable[[list[str]], int]  # runs a command line (the arguments after `ldpbench`), returns its exit status


# ----------------------------------------------------------------------------------------------------
# Worker: `ldpbench worker --socket PATH --owner PID`


@dataclass
class _Job:
    connection: socket.socket
    kill_at: float | None = None  # set when its client went away: SIGKILL after the grace period
    started: float = field(default_factory=time.monotonic)


@dataclass
class _Worker:
    listener: socket.socket
    socket_path: Path
    wake: tuple[int, int]  # the SIGCHLD wake-up pipe (read end, write end)
    run: Command  # runs a job's command line in a forked child (ldpbench.cli.main)
    jobs: dict[int, _Job] = field(default_factory=dict)
    served: int = 0
    datasets: list[Path] = field(default_factory=list)  # prepared directories to hold or check (warm_dataset)
    held: set[Path] = field(default_factory=set)  # those held after their last check
    lock: int | None = None  # a seed's lock (linger_as_seed): held by the seed alone, not by what it forks
    sources: dict[str, tuple[int, int]] | None = None  # a seed's: what it imported, as it was (_loaded_sources)
    stale: bool = False  # a seed's: one of those files changed since (outdated); it then ends
    # Called with a request's command line before its job is forked (_Preloader.run_through_needed).
    before_fork: Callable[[list[str]], None] = lambda argv: None

    def accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except BlockingIOError:
                return
            try:
                message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, len(STREAMS))
                request = decode(message)
            except (OSError, *UNDECODABLE):
                connection.close()
                continue
            if len(fds) != len(STREAMS) or {k: request.get(k) for k in installation()} != installation():
                for fd in fds:
                    os.close(fd)
                connection.send(encode({"refused": "another installation or no streams"}))
                connection.close()
                continue
            self.before_fork(request["argv"])
            unforkable = why_not_forkable() or self.outdated()
            if unforkable is not None:
                for fd in fds:
                    os.close(fd)
                log.warning("%s for process %d, which runs it itself: ldpbench %s (%s)", DECLINED,
                            request["client"], " ".join(request["argv"]), unforkable)
                with contextlib.suppress(OSError):
                    connection.send(encode({"declined": unforkable}))
                connection.close()
                continue
            # A signal the client passes on as soon as it knows the pid must find the child's own handling,
            # not the worker's copied into it: held back over the fork, taken by the child after _detach.
            signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
            # Written once the client has the child's pid: the child may then send its exit status itself.
            pid_sent, pid_sent_write = os.pipe()
            try:
                pid = os.fork()
                if pid == 0:
                    os.close(pid_sent_write)
                    self._run_child(request, fds, connection, pid_sent)  # never returns
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
            os.close(pid_sent)
            for fd in fds:
                os.close(fd)
            log.info("%s %d from %s for process %d: ldpbench %s", FORKED, pid, SINGLE_THREAD, request["client"],
                     " ".join(request["argv"]))
            dataset = _prepared_dir(request)
            if dataset is not None and dataset not in self.datasets:
                self.datasets.append(dataset)
            self.jobs[pid] = _Job(connection)
            self.served += 1
            try:
                connection.send(encode({"pid": pid}))
                os.write(pid_sent_write, b"1")
            except OSError:  # the client is gone already
                self._abandon(pid)
            finally:
                os.close(pid_sent_write)

    def outdated(self) -> str | None:
        """Why a seed must fork nothing more: a module it imported changed since (an edit of ldpbench, a
        plugin, a package upgraded), which its forks would not run; None while all are as they were."""
        if self.sources is None:
            return None
        changed = [path for path, stamp in self.sources.items() if _source_stamp(path) != stamp]
        if not changed:
            return None
        self.stale = True
        return f"what it imported changed since: {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}"

    def _detach(self) -> None:
        """In a forked child: the signal handling, listener, wake-up pipe and job connections stay
        the worker's alone."""
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)  # held back over the fork (accept)
        self.listener.close()
        for fd in self.wake:
            os.close(fd)
        if self.lock is not None:
            os.close(self.lock)
        for job in self.jobs.values():
            job.connection.close()

    def prepare_in_a_child(self, step: str) -> int | None:
        """Fork a child that runs the preload step `step` and exits; its pid (None where it could not)."""
        try:
            pid = fork_from_one_thread()
        except OSError as error:
            log.info("could not start a process to prepare %s (%s): the worker runs it itself", step, error)
            return None
        if pid == 0:
            try:
                self._detach()
                _preload(step)
                record_compiled_step(step)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        log.info("process %d prepares %s while the worker serves jobs", pid, step)
        return pid

    def _run_child(self, request: dict, fds: list[int], connection: socket.socket, pid_sent: int) -> None:
        """Run the request's command in this forked child and exit with its status, which the child sends
        its client itself once the worker has sent the pid (a byte on `pid_sent`): the worker, which
        sends it too when it reaps the child, may be inside a preload step for a second or more."""
        code = 1
        try:
            self._detach()
            for stream, fd in zip(STREAMS, fds):
                os.dup2(fd, stream)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            _apply_thread_count(os.environ["OMP_NUM_THREADS"])
            parent_watch.adopt(request["client"])  # its parent watch follows the job's process, not the worker
            sys.argv = ["ldpbench", *request["argv"]]
            code = self.run(request["argv"])
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - a fresh process would print it and exit 1
            traceback.print_exc()
            code = 1
        finally:
            # The command is over, and nothing may unwind from here into the worker's frames that this child
            # inherited: not an error, nor the job's own handler of SIGTERM, which the worker sends as soon as
            # the client, told the status, has gone. Blocked, the signals are never delivered.
            try:
                signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(OSError, ValueError):
                        stream.flush()
                if os.read(pid_sent, 1) == b"1":  # os._exit's byte, as the worker would read it
                    connection.send(encode({"exit": (code if isinstance(code, int) else 1) & 0xFF}))
            except BaseException:  # noqa: BLE001 - the worker sends the status when it reaps this child
                pass
            finally:
                os._exit(code if isinstance(code, int) else 1)

    def warm_dataset(self, prepared_dir: Path) -> None:
        """Hold a dataset that a run-cell job loaded, for the jobs after it (data.prepared.warm), read
        in a throwaway child (_read_in_a_child)."""
        from ldpbench.data.prepared import warm

        started = time.perf_counter()
        held = warm(prepared_dir, self._read_in_a_child)  # a stat of its files when it is held and unchanged
        if held and prepared_dir not in self.held:
            log.info("%s held for the next jobs (%.2f s)", prepared_dir, time.perf_counter() - started)
            self.held.add(prepared_dir)
        elif not held:
            log.info("%s not held (missing, damaged, changing or over the memory limit): its jobs read it",
                     prepared_dir)
            self.held.discard(prepared_dir)

    def _read_in_a_child(self, prepared_dir: Path) -> HeldCopy | None:
        """A dataset's copy read and verified by a child, which passes it back through a memory file and
        exits: reading Parquet starts Arrow's I/O and CPU thread pools, which stay for the life of the
        process that reads; the server's single thread is kept for forking. None where the child could
        not read it (missing, damaged, changing) or none could be forked."""
        from ldpbench.data.prepared import load_copy, read_copy, save_copy

        memory = os.memfd_create("ldpbench-warm-copy", os.MFD_CLOEXEC)
        try:
            pid = fork_from_one_thread()
            if pid == 0:
                code = 1
                try:
                    self._detach()
                    copy = read_copy(prepared_dir)
                    if copy is not None:
                        with open(memory, "wb", closefd=False) as out:
                            save_copy(copy, out)
                        code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                return None
            with open(memory, "rb", closefd=False) as source:
                source.seek(0)  # the child's writes moved the offset it shares with this process
                return load_copy(source)
        except (OSError, ValueError) as error:  # no fork (or not from one thread), or a copy cut short
            log.info("%s not read for the next jobs: %s", prepared_dir, error)
            return None
        finally:
            os.close(memory)

    def client_gone(self, pid: int) -> None:
        job = self.jobs[pid]
        if job.kill_at is None:
            self._abandon(pid)

    def _abandon(self, pid: int) -> None:
        """The client went away (killed): stop its child as Snakemake would stop the job."""
        self.jobs[pid].kill_at = time.monotonic() + GRACE_SECONDS
        send_signal(pid, signal.SIGTERM)

    def reap(self) -> None:
        while self.jobs:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            log.info("%s %d (exit %d): %.3f s wall, %.3f s CPU", ENDED, pid, code, time.monotonic() - job.started,
                     usage.ru_utime + usage.ru_stime)
            try:
                job.connection.send(encode({"exit": code if code >= 0 else 128 - code}))
            except OSError:
                pass
            job.connection.close()

    def kill_overdue(self) -> None:
        now = time.monotonic()
        for pid, job in self.jobs.items():
            if job.kill_at is not None and now >= job.kill_at:
                send_signal(pid, signal.SIGKILL)

    def stop_children(self) -> None:
        for pid in self.jobs:
            send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        while self.jobs and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        for pid in self.jobs:
            send_signal(pid, signal.SIGKILL)
        self.reap()


def _prepared_dir(request: dict) -> Path | None:
    """The dataset directory of a run-cell command (its --prepared), resolved in the job's directory."""
    argv = request.get("argv", [])
    if not argv or argv[0] != "run-cell":
        return None
    for index, argument in enumerate(argv):
        if argument == "--prepared" and index + 1 < len(argv):
            value = argv[index + 1]
        elif argument.startswith("--prepared="):
            value = argument.split("=", 1)[1]
        else:
            continue
        return (Path(request["cwd"]) / value).resolve()
    return None


def _apply_thread_count(value: str) -> None:
    """The job's thread count, as a fresh process would have read it from OMP_NUM_THREADS."""
    try:
        threads = max(1, int(value))
    except ValueError:
        return
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    if threads > 1:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            return
        threadpool_limits(threads)


def serve(socket_path: str | Path, owner: int, preload: tuple[str, ...] = PRELOAD, *, run: Command) -> int:
    """Listen on `socket_path` (in a private directory) until `owner` ends or SIGTERM, running each
    job's command line with `run` (`ldpbench worker` passes ldpbench.cli.main: this module imports
    nothing of the CLI) in a forked child; import `preload` while no request waits (the steps this
    process has not done already: a worker forked by a warm seed has done them all). Returns the number
    of commands served, once its children have ended and its private directory is gone."""
    socket_path = Path(socket_path)
    os.environ.pop(SOCKET_ENV, None)
    # The directory that start() made for this owner goes with the worker, whichever way its owner ends
    # (even before the worker saw it: its name has the owner's pid).
    named = _directory_owner(socket_path.parent)
    own_directory = named is not None and named.pid == owner
    owner_process = processes.process(owner)
    pending = [step for step in preload if step not in _DONE_STEPS]
    if not pending:  # forked by a seed
        threads = _threads()
        log.info("%s: %d preload steps done (by the seed, process %d), %s thread(s)", READY, len(preload),
                 os.getppid(), "unknown" if threads is None else len(threads))
    # Heard from before the socket exists: start() returns once it does, and a stop() right then must end
    # the worker through its own cleanup, not by SIGTERM's default action (which leaves its directory).
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    served = _serve(_listen(socket_path), socket_path, pending, run,
                    lambda worker: owner_process is not None and processes.is_alive(owner_process),
                    stopping=stopping)
    own = resource.getrusage(resource.RUSAGE_SELF)
    log.info("%s after %d commands, %.3f s of its own CPU", STOPPED, served, own.ru_utime + own.ru_stime)
    if own_directory:  # last: stop() returns once it is gone
        shutil.rmtree(socket_path.parent, ignore_errors=True)
    return served


def linger_as_seed(key: str, linger: float, *, run: Command) -> int:
    """After its campaign: stay, warm, as the seed of the next campaigns that start a worker with the
    same key (start(..., linger)), forking each its worker, until none has run for `linger` seconds.
    Only one seed per key (a lock it holds while it lives); this process returns at once (0) where
    another seed holds it. Returns the number of workers forked."""
    directory = seed_directory(key)
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as error:
        log.info("no seed lingers for the next campaigns (%s)", error)
        return 0
    with _seed_lock(directory, create=True) as lock:
        # None: not this user's alone, or another seed serves this key; cleared meanwhile
        # (_remove_seedless_directories): no link left.
        if lock is None or os.fstat(lock).st_nlink == 0:
            return 0
        return _seed(directory, lock, linger, run)


def _seed(directory: Path, lock: int, linger: float, run: Command) -> int:
    """linger_as_seed, holding the seed's lock."""
    # stop_seeds may name this process as soon as its pid is in the lock: a SIGTERM from then on ends it,
    # though the worker's serve() left SIGTERM ignored and this one's _serve has not begun.
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)  # who holds it (stop_seeds)
    socket_path = directory / SOCKET_NAME
    socket_path.unlink(missing_ok=True)  # a socket that a killed seed left
    listener = _listen(socket_path)
    log.info("%s in %s for the next campaigns, until none has started for %g s", SEED, directory, linger)
    # Off the campaign's log and working directory, which the seed outlives.
    with open(directory / SEED_LOG_NAME, "ab") as seed_log:
        for stream in (1, 2):
            os.dup2(seed_log.fileno(), stream)
    os.chdir("/")
    last_active = [time.monotonic()]

    def wanted(worker: _Worker) -> bool:
        if worker.jobs:
            last_active[0] = time.monotonic()
        return not worker.stale and time.monotonic() - last_active[0] < linger

    _SOURCES.update(_loaded_sources(_SOURCES))  # any module imported since its last preload step
    return _serve(listener, socket_path, [], run, wanted, lock, dict(_SOURCES), stopping)


@contextlib.contextmanager
def _seed_lock(directory: Path, create: bool = False) -> Iterator[int | None]:
    """The seed lock of `directory` (this user's alone), taken: its open descriptor, or None where
    another process holds it, or there is none (and not `create`). Released on the way out."""
    lock = None
    try:
        if private_directory(directory):
            lock = os.open(directory / SEED_LOCK_NAME, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        else:
            log.warning("%s is not this user's alone: left as it is", directory)
    except OSError:
        pass
    if lock is not None:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a seed lives
            os.close(lock)
            lock = None
    try:
        yield lock
    finally:
        if lock is not None:
            os.close(lock)


def _listen(socket_path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(socket_path))
    listener.listen(128)
    listener.setblocking(False)
    return listener


def _serve(listener: socket.socket, socket_path: Path, pending: list[str], run: Command,
           wanted: Callable[[_Worker], bool], lock: int | None = None,
           sources: dict[str, tuple[int, int]] | None = None, stopping: list[int] | None = None) -> int:
    """Serve on `listener` (at `socket_path`) while `wanted(worker)` and no SIGTERM came (nor one already
    in `stopping`), preloading `pending` while no request waits; stop the children (a campaign's jobs;
    not a seed's, which are the workers of campaigns that go on without it), close and remove the
    socket. Returns the number of commands served."""
    inode = socket_path.stat().st_ino
    wake, wake_write = os.pipe()
    os.set_blocking(wake, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler, so that the wake-up fd is written
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    stopping = [] if stopping is None else stopping
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    preloader = _Preloader(pending)
    worker = _Worker(listener, socket_path, (wake, wake_write), run, lock=lock, sources=sources,
                     before_fork=lambda argv: preloader.run_through_needed(argv, worker))
    try:
        while not stopping and wanted(worker) and _same_socket(socket_path, inode):
            waiting = {job.connection.fileno(): pid for pid, job in worker.jobs.items() if job.kill_at is None}
            step_ready = preloader.next_ready()
            try:
                readable, _, _ = select.select([listener, wake, *waiting], [], [], 0 if step_ready else POLL_SECONDS)
            except InterruptedError:
                readable = []
            if wake in readable:
                _drain(wake)
            worker.reap()
            for fd in readable:
                if fd in waiting and waiting[fd] in worker.jobs:
                    worker.client_gone(waiting[fd])  # a client sends nothing after its request: EOF
            if listener in readable:
                worker.accept()
            worker.kill_overdue()
            if stopping or preloader.start_compiling(worker):
                continue
            if step_ready and not readable:
                preloader.run_next()
            elif worker.datasets and not readable:
                worker.warm_dataset(worker.datasets.pop(0))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        preloader.stop_compiling()
        if sources is None:
            worker.stop_children()
        listener.close()
        os.close(wake)
        signal.set_wakeup_fd(-1)
        os.close(wake_write)
        if _same_socket(socket_path, inode):
            socket_path.unlink()
    return worker.served


class _Preloader:
    """The worker's preload steps still to do: one at a time while no request waits, and before a job is
    forked those its command needs (NEEDED_BEFORE_FORK)."""

    def __init__(self, pending: list[str]):
        self.pending = pending
        self.steps = len(pending)
        self.compiling: dict[str, int | None] = {}  # a COMPILED_IN_A_CHILD_FIRST step: its child's pid, None once ended

    def start_compiling(self, worker: _Worker) -> bool:
        """Where the next step is one to compile in a child first and none was started: start it (or find its
        cache, which the worker then loads itself). Whether it did."""
        if not self.pending or self.pending[0] not in COMPILED_IN_A_CHILD_FIRST or self.pending[0] in self.compiling:
            return False
        step = self.pending[0]
        self.compiling[step] = None if compiled_before(step) else worker.prepare_in_a_child(step)
        return True

    def next_ready(self) -> bool:
        """Whether the worker may run the next step now."""
        return bool(self.pending) and _child_ended(self.compiling, self.pending[0])

    def run_next(self) -> None:
        step = self.pending.pop(0)
        forkable = why_not_forkable() is None
        try:
            _preload(step)
        except Exception:  # the jobs do that work themselves, and report its failure
            log.exception("preload step %s failed", step)
        unforkable = why_not_forkable()
        if forkable and unforkable is not None:
            log.warning("after preload step %s the worker forks nothing (%s): its jobs start as fresh processes",
                        step, unforkable)
        if not self.pending:
            threads = _threads()
            log.info("%s: %d preload steps done, %s thread(s)", READY, self.steps,
                     "unknown" if threads is None else len(threads))

    def run_through_needed(self, argv: list[str], worker: _Worker) -> None:
        """Run the pending steps up to the one the command `argv` needs, unless one of them is still being
        compiled in a child: its jobs then draw without it, as before it was compiled."""
        needed = NEEDED_BEFORE_FORK.get(argv[0]) if argv else None
        while needed in self.pending:
            self.start_compiling(worker)
            if not self.next_ready():
                return
            self.run_next()

    def stop_compiling(self) -> None:
        for step in self.compiling:
            if not _child_ended(self.compiling, step):  # compiled code left unwritten is compiled again later
                send_signal(self.compiling[step], signal.SIGKILL)


def _loaded_sources(known: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Each imported module's file not in `known`: its modification time and size (_source_stamp)."""
    paths = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    return {path: _source_stamp(path) for path in paths if isinstance(path, str) and path not in known}


def _source_stamp(path: str) -> tuple[int, int]:
    try:
        info = os.stat(path)
    except OSError:
        return (0, -1)
    return (info.st_mtime_ns, info.st_size)


def preloaded(preload: tuple[str, ...]) -> bool:
    """Whether this process has run every step of `preload`."""
    return set(preload) <= _DONE_STEPS


def _preload(step: str) -> None:
    """Import the module of `step` ("module" or "module:function", which is then called) with
    BLOCKED_WHILE_PRELOADING unimportable (those not imported already)."""
    module, _, function = step.partition(":")
    blocked = [name for name in BLOCKED_WHILE_PRELOADING if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # `import name` raises ImportError, which MLflow's registry skips
    try:
        imported = importlib.import_module(module)
        if function:
            getattr(imported, function)()
    finally:
        _unblock()
    _DONE_STEPS.add(step)
    _SOURCES.update(_loaded_sources(_SOURCES))
    # What the step made lives as long as the worker: frozen (the permanent generation), it is scanned by
    # none of the worker's later collections, nor by those of the jobs it forks, whose pages it then
    # does not touch either (copy-on-write).
    gc.freeze()


def compiled_steps_file() -> Path:
    """Where the keys of the steps compiled in a child are: beside numba's cache."""
    cache = os.environ.get("NUMBA_CACHE_DIR")
    return Path(cache) / COMPILED_STEPS_NAME if cache else PACKAGE_DIR / "__pycache__" / COMPILED_STEPS_NAME


def compiled_step_key(step: str) -> str:
    """What a step's compiled cache depends on: the package's sources (their paths, sizes and times), the
    interpreter and numba's version."""
    from importlib.metadata import PackageNotFoundError, version

    sources = [(str(path.relative_to(PACKAGE_DIR)), stat.st_size, stat.st_mtime_ns)
               for path in sorted(PACKAGE_DIR.rglob("*.py")) for stat in (path.stat(),)]
    try:
        numba = version("numba")
    except PackageNotFoundError:
        numba = None
    facts = {"step": step, "python": sys.version, "executable": sys.executable, "numba": numba, "sources": sources}
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()


def _compiled_steps() -> dict[str, str]:
    try:
        recorded = json.loads(compiled_steps_file().read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def compiled_before(step: str) -> bool:
    """Whether a child already ran `step` for these sources, this interpreter and this cache."""
    return _compiled_steps().get(step) == compiled_step_key(step)


def record_compiled_step(step: str) -> None:
    """In the child that ran `step`: record its key (where that directory may be written)."""
    from ldpbench.atomic import write_json

    try:
        write_json(compiled_steps_file(), {**_compiled_steps(), step: compiled_step_key(step)})
    except OSError as error:  # read-only: the next workers prepare the step in a child again
        log.info("%s not written (%s): the next worker prepares %s in a child again", compiled_steps_file(),
                 error, step)


def _child_ended(compiling: dict[str, int | None], step: str) -> bool:
    """Whether `step` may run in the worker now: not one to run in a child first, or its child ended."""
    if step not in COMPILED_IN_A_CHILD_FIRST:
        return True
    if step not in compiling:
        return False
    pid = compiling[step]
    if pid is not None:
        try:
            ended, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped already, with the jobs (Worker.reap)
            ended = pid
        if ended != pid:
            return False
        compiling[step] = None
    return True


def _unblock() -> None:
    for name in BLOCKED_WHILE_PRELOADING:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


def _threads() -> list[str] | None:
    """The names of this process's OS threads (from /proc/self/task: Python's threading module sees
    only the threads Python started); None where they cannot be read."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    names = []
    for task in tasks:
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:  # ended since the listing
            continue
    return names


def why_not_forkable() -> str | None:
    """None while this process runs a single OS thread; otherwise why it must not fork.

    A fork copies only the calling thread: any lock another thread held (in the allocator, Arrow's or
    OpenMP's thread pools, the interpreter) stays locked for ever in the child, and POSIX promises the
    child only async-signal-safe calls. The worker forks only with no other thread, so each child is a
    whole copy of it."""
    names = _threads()
    if names is None:
        return "its thread count cannot be read (no /proc/self/task)"
    if len(names) != 1:
        return f"it runs {len(names)} threads: {', '.join(names)}"
    return None


def fork_from_one_thread() -> int:
    """os.fork(), only while this process runs a single OS thread (why_not_forkable); OSError saying why
    otherwise."""
    unforkable = why_not_forkable()
    if unforkable is not None:
        raise OSError(unforkable)
    return os.fork()


def _same_socket(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except FileNotFoundError:
        return False


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def worker_environment(jobs_only: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment to start a worker in: single-threaded numerical libraries, no worker named, and
    none of `jobs_only` (what the workflow sets for its jobs, whose commands carry it)."""
    environment = {key: value for key, value in os.environ.items() if key != SOCKET_ENV and key not in jobs_only}
    environment.update({variable: "1" for variable in THREAD_VARIABLES})
    jemalloc = environment.get(JEMALLOC_CONFIG_VARIABLE)
    environment[JEMALLOC_CONFIG_VARIABLE] = f"{jemalloc},{JEMALLOC_CONFIG}" if jemalloc else JEMALLOC_CONFIG
    return environment



def start(owner: int, log_path: str | Path, tracking: bool = True, linger: float = 0.0,
          jobs_only: tuple[str, ...] = ()) -> tuple[subprocess.Popen | ForkedWorker, Path] | None:
    """Start a worker for the process `owner` (Snakemake), with a socket in a new private directory;
    return it and its socket path once it listens, or None (with the reason in its log) if it did not.
    First, remove the directories of ended campaigns' workers (_remove_ended_directories). Without
    `tracking` it does not preload what only the tracking steps import. It starts without the variables
    `jobs_only` (worker_environment).

    With a `linger` (seconds), the worker stays on after its campaign as the seed of the next ones
    (linger_as_seed), and the worker is first asked of the seed of its key (seed_key: the same
    interpreter, ldpbench, environment and `tracking`): forked from it, it starts with every preload
    step done. Where there is no such seed, it starts as a fresh process."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    owner_process = processes.process(owner)
    if owner_process is None:
        with open(log_path, "a") as log:
            print(f"no worker started: its owner, process {owner}, has ended (or has no /proc entry)", file=log)
        return None
    root = Path(tempfile.gettempdir())
    _remove_ended_directories(root)
    _remove_seedless_directories()
    # Mode 0700 (this user only), named for its owner: DIRECTORY_PREFIX, pid, start time.
    directory = tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{owner_process.pid}-{owner_process.started}-", dir=root)
    socket_path = Path(directory) / SOCKET_NAME
    environment = worker_environment(jobs_only)
    key = seed_key(environment, tracking)
    arguments = ["worker", "--socket", str(socket_path), "--owner", str(owner),
                 *([] if tracking else ["--without-tracking"]),
                 *(["--linger", f"{linger:g}", "--seed-key", key] if linger > 0 else [])]
    process = _fork_from_seed(key, arguments, environment, log_path) if linger > 0 else None
    if process is None:
        with open(log_path, "ab") as log:
            # -P: not the working directory first on the path, where a folder named ldpbench would be imported.
            process = subprocess.Popen([sys.executable, "-P", "-m", "ldpbench", *arguments], stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, env=environment, start_new_session=True)
    deadline = time.monotonic() + 30
    while not socket_path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process, socket_path)
            return None
        time.sleep(0.01)
    return process, socket_path


def seed_key(environment: dict[str, str], tracking: bool) -> str:
    """What a seed's workers are forked for: this interpreter and ldpbench, the workers' environment
    (VOLATILE_VARIABLES aside: a module may read any other at import) and whether they preload the
    tracking steps."""
    facts = {"installation": installation(), "tracking": tracking,
             "environment": sorted((name, value) for name, value in environment.items()
                                   if name not in VOLATILE_VARIABLES)}
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:32]


def seed_directory(key: str) -> Path:
    return Path(tempfile.gettempdir()) / f"{SEED_PREFIX}{os.getuid()}-{key}"


@dataclass
class ForkedWorker:
    """A worker that a seed forked for this process: what start() and stop() use of subprocess.Popen.
    Its exit status comes on the connection its request went on; the seed stops the worker when that
    connection closes (this process ended). Where the seed ended first, the connection reads as an exit
    (status 1) and stop() ends the worker by removing its directory, which the worker watches."""

    pid: int
    connection: socket.socket
    returncode: int | None = None

    def poll(self) -> int | None:
        return self._exit_status(0)

    def wait(self, timeout: float | None = None) -> int:
        status = self._exit_status(timeout)
        if status is None:
            raise subprocess.TimeoutExpired(["ldpbench", "worker"], timeout or 0)
        return status

    def terminate(self) -> None:
        if self.returncode is None:
            send_signal(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.returncode is None:
            send_signal(self.pid, signal.SIGKILL)

    def _exit_status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self.connection.settimeout(timeout)
            try:
                message = self.connection.recv(MAX_MESSAGE)
            except (BlockingIOError, TimeoutError):
                return None
            except OSError:
                message = b""
            self.returncode = int(decode(message).get("exit", 1)) if message else 1  # nothing: the seed ended
            self.connection.close()
        return self.returncode


def _fork_from_seed(key: str, arguments: list[str], environment: dict[str, str],
                    log_path: str | Path) -> ForkedWorker | None:
    """A worker forked by the seed of `key` (`ldpbench` `arguments`, its output to `log_path`), or None
    where no seed of that key listens or it forked none."""
    path = seed_directory(key) / SOCKET_NAME
    if not path.exists():
        return None
    with open(os.devnull, "rb") as stdin, open(log_path, "ab") as log:
        request = {"argv": arguments, "cwd": os.getcwd(), "env": environment, "client": os.getpid(), **installation()}
        sent = send_request(str(path), request, [stdin.fileno(), log.fileno(), log.fileno()])
    return None if sent is None else ForkedWorker(sent[1], sent[0])


def _directory_owner(directory: Path) -> processes.Process | None:
    """The owner (Snakemake) of a worker directory that start() made, read from its name; None for
    any other directory."""
    match = _DIRECTORY_NAME.fullmatch(directory.name)
    return processes.Process(int(match[1]), int(match[2])) if match else None


def _remove_ended_directories(root: Path) -> None:
    """Remove the worker directories in `root` whose campaign has ended.

    A worker removes its own directory when its owner ends, however that ends; this clears the
    directories of workers that could not (killed themselves, or the machine stopped). A directory
    stays while its owner lives (the same pid and start time), while a process listens on its socket
    (a worker still stopping, or one whose owner is out of this process's sight, in another PID
    namespace), and when it is not this user's alone (not made by start()).
    """
    if processes.process(os.getpid()) is None:
        return  # no /proc: no owner could be told alive
    for directory in root.glob(f"{DIRECTORY_PREFIX}*"):
        owner = _directory_owner(directory)
        if owner is None or processes.is_alive(owner):
            continue
        try:
            if not private_directory(directory) or _listening(directory / SOCKET_NAME):
                continue
        except OSError:
            continue
        shutil.rmtree(directory, ignore_errors=True)


def seed_directories() -> list[Path]:
    """This user's seed directories (a seed lives in each whose lock is held)."""
    return sorted(Path(tempfile.gettempdir()).glob(f"{SEED_PREFIX}{os.getuid()}-*"))


def living_seeds() -> dict[int, Path]:
    """This user's living seeds: each one's pid (in its lock file, which it holds) and directory."""
    seeds = {}
    for directory in seed_directories():
        with _seed_lock(directory) as lock:
            if lock is not None:
                continue  # no seed holds it
        with contextlib.suppress(ValueError, OSError):
            if private_directory(directory):
                seeds[int((directory / SEED_LOCK_NAME).read_text())] = directory
    return seeds


def stop_seeds(keep: Collection[int] = ()) -> list[int]:
    """SIGTERM this user's living seeds but those whose pids are in `keep`; their pids."""
    stopped = [pid for pid in living_seeds() if pid not in keep]
    for pid in stopped:
        send_signal(pid, signal.SIGTERM)
    return stopped


def _remove_seedless_directories() -> None:
    """Remove this user's seed directories where no seed lives (none holds the lock): a seed leaves its
    directory (its log) when it ends; the next start() clears it."""
    for directory in seed_directories():
        with _seed_lock(directory) as lock:
            if lock is not None:  # no seed lives there; holding the lock, none starts there meanwhile
                shutil.rmtree(directory, ignore_errors=True)


def _listening(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket `path` (where that cannot be told: yes)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


def stop(process: subprocess.Popen | ForkedWorker, socket_path: Path) -> None:
    """End a worker's campaign: its running children get SIGTERM, and it removes its private directory
    (which this removes where it did not). Returns once the directory is gone or the worker ended: a
    worker with a linger then stays on as a seed (linger_as_seed), any other exits."""
    if process.poll() is None:
        process.terminate()
        deadline = time.monotonic() + GRACE_SECONDS + 5
        while process.poll() is None and socket_path.parent.exists():
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                break
            time.sleep(0.01)
    shutil.rmtree(socket_path.parent, ignore_errors=True)
