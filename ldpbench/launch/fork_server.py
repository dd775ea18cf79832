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
import gc
import hashlib
import importlib
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ldpbench.launch import parent_watch, processes
from ldpbench.launch.client import MAX_MESSAGE, SOCKET_ENV, STREAMS, installation, private_directory, send_signal

if TYPE_CHECKING:
    from ldpbench.data.prepared import HeldCopy

log = logging.getLogger("ldpbench")

FORKED = "forked"  # the worker's log line for each command it runs
SINGLE_THREAD = "1 thread"  # in each FORKED line: the OS threads the worker ran as it forked (why_not_forkable)
DECLINED = "declined"  # its log line for each command it left to its client (not a single thread)
READY = "ready"  # its log line once every preload step is done
# What the workflow's jobs import (run-cell, audit, select, aggregate, compare, report, then
# tracking-init and track: MLflow and its SQL store, seconds of imports), in the order they are needed.
# "module:function": import, then call: numba's compiled draw and perturbers, loaded right after what the
# cells import, so that the cells forked after it draw their small rounds compiled without each paying
# numba's import and loading (most of a second).
PRELOAD = (
    "ldpbench.runner",
    "ldpbench.audit",
    "ldpbench.mechanisms.scalar:load_compiled_kernels",
    "ldpbench.tuning",
    "ldpbench.results.tables",
    "ldpbench.results.compare",
    "ldpbench.results.report",
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "ldpbench.results.tracking",
)
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
POLL_SECONDS = 0.5
GRACE_SECONDS = 10.0  # after SIGTERM, before SIGKILL, for a child whose client went away
Command = Callable[[list[str]], int]  # runs a command line (the arguments after `ldpbench`), returns its exit status


# ----------------------------------------------------------------------------------------------------
# Worker: `ldpbench worker --socket PATH --owner PID`


@dataclass
class _Job:
    connection: socket.socket
    kill_at: float | None = None  # set when its client went away: SIGKILL after the grace period


@dataclass
class _Worker:
    listener: socket.socket
    owner: processes.Process | None  # None: it had ended before the worker started
    socket_path: Path
    wake: tuple[int, int]  # the SIGCHLD wake-up pipe (read end, write end)
    run: Command  # runs a job's command line in a forked child (ldpbench.cli.main)
    jobs: dict[int, _Job] = field(default_factory=dict)
    served: int = 0
    datasets: list[Path] = field(default_factory=list)  # prepared directories to hold or check (warm_dataset)
    held: set[Path] = field(default_factory=set)  # those held after their last check

    def owner_alive(self) -> bool:
        return self.owner is not None and processes.is_alive(self.owner)

    def accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except BlockingIOError:
                return
            try:
                message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, len(STREAMS))
                request = json.loads(message)
            except (OSError, ValueError):
                connection.close()
                continue
            if len(fds) != len(STREAMS) or {k: request.get(k) for k in installation()} != installation():
                for fd in fds:
                    os.close(fd)
                connection.send(json.dumps({"refused": "another installation or no streams"}).encode())
                connection.close()
                continue
            unforkable = why_not_forkable()
            if unforkable is not None:
                for fd in fds:
                    os.close(fd)
                log.warning("%s for process %d, which runs it itself: ldpbench %s (%s)", DECLINED,
                            request["client"], " ".join(request["argv"]), unforkable)
                with contextlib.suppress(OSError):
                    connection.send(json.dumps({"declined": unforkable}).encode())
                connection.close()
                continue
            pid = os.fork()
            if pid == 0:
                self._run_child(request, fds, connection)  # never returns
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
                connection.send(json.dumps({"pid": pid}).encode())
            except OSError:  # the client is gone already
                self._abandon(pid)

    def _detach(self) -> None:
        """In a forked child: the signal handling, listener, wake-up pipe and job connections stay
        the worker's alone."""
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.listener.close()
        for fd in self.wake:
            os.close(fd)
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

    def _run_child(self, request: dict, fds: list[int], connection: socket.socket) -> None:
        code = 1
        try:
            self._detach()
            connection.close()
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
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
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
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            try:
                job.connection.send(json.dumps({"exit": code if code >= 0 else 128 - code}).encode())
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
    nothing of the CLI) in a forked child; import `preload` while no request waits. Returns the number
    of commands served."""
    socket_path = Path(socket_path)
    os.environ.pop(SOCKET_ENV, None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(socket_path))
    listener.listen(128)
    listener.setblocking(False)
    inode = socket_path.stat().st_ino
    wake, wake_write = os.pipe()
    os.set_blocking(wake, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler, so that the wake-up fd is written
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    worker = _Worker(listener, processes.process(owner), socket_path, (wake, wake_write), run)
    # The directory that start() made for this owner goes with the worker, whichever way its owner ends
    # (even before the worker saw it: its name has the owner's pid).
    named = _directory_owner(socket_path.parent)
    own_directory = named is not None and named.pid == owner
    pending = list(preload)
    compiling: dict[str, int | None] = {}  # a COMPILED_IN_A_CHILD_FIRST step: its child's pid, None once ended
    try:
        while not stopping and worker.owner_alive() and _same_socket(socket_path, inode):
            waiting = {job.connection.fileno(): pid for pid, job in worker.jobs.items() if job.kill_at is None}
            step_ready = bool(pending) and _child_ended(compiling, pending[0])
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
            if pending and pending[0] in COMPILED_IN_A_CHILD_FIRST and pending[0] not in compiling and not stopping:
                compiled = compiled_before(pending[0])  # then the worker loads its cache itself
                compiling[pending[0]] = None if compiled else worker.prepare_in_a_child(pending[0])
            elif step_ready and not readable and not stopping:
                step = pending.pop(0)
                forkable = why_not_forkable() is None
                try:
                    _preload(step)
                except Exception:  # the jobs do that work themselves, and report its failure
                    log.exception("preload step %s failed", step)
                unforkable = why_not_forkable()
                if forkable and unforkable is not None:
                    log.warning("after preload step %s the worker forks nothing (%s): its jobs start as fresh "
                                "processes", step, unforkable)
                if not pending:
                    threads = _threads()
                    log.info("%s: %d preload steps done, %s thread(s)", READY, len(preload),
                             "unknown" if threads is None else len(threads))
            elif worker.datasets and not readable and not stopping:
                worker.warm_dataset(worker.datasets.pop(0))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for step in compiling:
            if not _child_ended(compiling, step):  # compiled code left unwritten is compiled again later
                send_signal(compiling[step], signal.SIGKILL)
        worker.stop_children()
        listener.close()
        if _same_socket(socket_path, inode):
            socket_path.unlink()
        if own_directory:
            shutil.rmtree(socket_path.parent, ignore_errors=True)
    return worker.served


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


def worker_environment() -> dict[str, str]:
    """The environment to start a worker in: single-threaded numerical libraries, no worker named."""
    environment = {key: value for key, value in os.environ.items() if key != SOCKET_ENV}
    environment.update({variable: "1" for variable in THREAD_VARIABLES})
    jemalloc = environment.get(JEMALLOC_CONFIG_VARIABLE)
    environment[JEMALLOC_CONFIG_VARIABLE] = f"{jemalloc},{JEMALLOC_CONFIG}" if jemalloc else JEMALLOC_CONFIG
    return environment



def start(owner: int, log_path: str | Path, tracking: bool = True) -> tuple[subprocess.Popen, Path] | None:
    """Start a worker for the process `owner` (Snakemake), with a socket in a new private directory;
    return it and its socket path once it listens, or None (with the reason in its log) if it did not.
    First, remove the directories of ended campaigns' workers (_remove_ended_directories). Without
    `tracking` it does not preload what only the tracking steps import."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    owner_process = processes.process(owner)
    if owner_process is None:
        with open(log_path, "a") as log:
            print(f"no worker started: its owner, process {owner}, has ended (or has no /proc entry)", file=log)
        return None
    root = Path(tempfile.gettempdir())
    _remove_ended_directories(root)
    # Mode 0700 (this user only), named for its owner: DIRECTORY_PREFIX, pid, start time.
    directory = tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{owner_process.pid}-{owner_process.started}-", dir=root)
    socket_path = Path(directory) / SOCKET_NAME
    with open(log_path, "ab") as log:
        # -P: not the working directory first on the path, where a folder named ldpbench would be imported.
        command = [sys.executable, "-P", "-m", "ldpbench", "worker", "--socket", str(socket_path),
                   "--owner", str(owner), *([] if tracking else ["--without-tracking"])]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   env=worker_environment(), start_new_session=True)
    deadline = time.monotonic() + 30
    while not socket_path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process, socket_path)
            return None
        time.sleep(0.01)
    return process, socket_path


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


def stop(process: subprocess.Popen, socket_path: Path) -> None:
    """Stop a worker (its running children get SIGTERM) and remove its private directory."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(GRACE_SECONDS + 5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    shutil.rmtree(socket_path.parent, ignore_errors=True)
