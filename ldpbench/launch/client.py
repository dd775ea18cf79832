"""The client side of the fork server: `python -m ldpbench <command>` (ldpbench/__main__.py) hands its
command to the campaign's fork server (ldpbench.launch.fork_server) and waits for it as for a process.

It sends its command line, working directory, environment and standard streams (as file descriptors)
over the server's Unix socket; the server forks a child that runs the command exactly as a fresh
process would. The client waits for the child's exit status, forwards SIGTERM, SIGINT and SIGHUP to
it and exits with that status: to Snakemake the job is an ordinary process.

A client runs its command itself whenever the server cannot serve it: no server named, a SLURM job
(its work belongs inside its allocation), not a job of the workflow (no $LDPBENCH_JOB=1, which each
of the workflow's rules sets on its command), no OMP_NUM_THREADS (the job's thread count, which
Snakemake sets for each job and the child applies as a fresh process would read it), another
interpreter or ldpbench installation (e.g. --use-conda), a server that is not there, or one that
declines (it forks only while it runs a single thread). It hands
nothing to a socket that is not this user's (in a directory that others may enter, or with another
user's process at the other end: $LDPBENCH_WORKER may be inherited from anywhere), and the workflow
names to its jobs only the server it started itself.

This module imports only the standard library, and of it little: every job of a campaign pays for its
imports. (Its messages are marshalled, not JSON: `json` imports `re`, the largest of a job client's
imports.)
"""

from __future__ import annotations

import marshal
import os
import signal
import socket
import stat
import struct
import sys

from ldpbench.launch.parent_death import set_parent_death_signal

SOCKET_ENV = "LDPBENCH_WORKER"  # the server's socket, named to the jobs by the workflow
JOB_ENV = "LDPBENCH_JOB"  # "1" on each command of the workflow's rules: a job the server may run
MAX_MESSAGE = 1 << 20  # a request is the command line and the environment: a few KiB
STREAMS = (0, 1, 2)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What a message that is not one of this interpreter's marshalled dicts raises in `decode`.
UNDECODABLE = (ValueError, EOFError, TypeError)


def encode(message: dict) -> bytes:
    """A message between client and server: both run one interpreter (`installation`), so its own
    marshal format carries the strings, numbers and lists they exchange."""
    return marshal.dumps(message)


def decode(data: bytes) -> dict:
    """The message `encode` made; one of UNDECODABLE for anything else (e.g. another Python's client)."""
    message = marshal.loads(data)
    if not isinstance(message, dict):
        raise TypeError(f"a message is a dict, not {type(message).__name__}")
    return message


def installation() -> dict[str, str]:
    """Which interpreter and which ldpbench: a server serves only clients of its own installation."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return {"executable": os.path.realpath(sys.executable), "package": package}


def delegate(argv: list[str]) -> int | None:
    """Run `ldpbench argv` in the fork server named by $LDPBENCH_WORKER and return its exit status, or
    None when this process must run the command itself (see the module's docstring)."""
    path = os.environ.get(SOCKET_ENV)
    parent = os.getppid()
    job = os.environ.get(JOB_ENV) == "1" and "OMP_NUM_THREADS" in os.environ
    if not path or not job or "SLURM_JOB_ID" in os.environ:
        return None
    try:
        for stream in STREAMS:
            os.fstat(stream)
    except OSError:
        return None  # a closed standard stream cannot be handed over
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "client": os.getpid(), **installation()}
    # The server forks the command before this process hears its pid: a signal in that moment is held, then
    # passed on (or, where the command runs here after all, delivered to this process as it was sent).
    child, held = None, []

    def forward(signum, frame):
        if child is None:
            held.append(signum)
        else:
            send_signal(child, signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    sent = send_request(path, request, list(STREAMS))
    if sent is None:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: one not set from Python
        for signum in held:
            os.kill(os.getpid(), signum)
        return None  # no server there, not this user's, refused (another installation) or declined: run here
    connection, child = sent
    for signum in held:
        send_signal(child, signum)
    # As a fresh process's parent watch does: when the job's shell wrapper dies, this client gets
    # SIGTERM and passes it on (the child itself watches Snakemake).
    set_parent_death_signal()
    if os.getppid() != parent:  # it died before the signal was asked for
        forward(signal.SIGTERM, None)
    try:
        outcome = _receive(connection)
    except OSError:
        outcome = None
    finally:
        connection.close()
    if outcome is None or "exit" not in outcome:
        print(f"ldpbench: the fork server ({path}) ended before the command did", file=sys.stderr)
        return 1
    return int(outcome["exit"])


def send_request(path: str, request: dict, fds: list[int]) -> tuple[socket.socket, int] | None:
    """Hand `request` with the file descriptors `fds` to the server listening at `path`: the open
    connection (on which the exit status of the child comes) and the child's pid; None where it forked
    none: no server there, one that is not this user's (said on stderr), refused or declined."""
    try:
        private = private_directory(os.path.dirname(path))
    except FileNotFoundError:
        return None
    except OSError:  # e.g. a parent directory this user may not search
        private = False
    if not private:
        _untrusted(path, "its directory is not this user's alone (owner and mode 0700)")
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(path)
        if _peer_uid(connection) != os.getuid():
            connection.close()
            _untrusted(path, "another user's process listens on it")
            return None
        socket.send_fds(connection, [encode(request)], fds)
        reply = _receive(connection)
    except OSError:
        connection.close()
        return None
    if reply is None or "pid" not in reply:
        connection.close()
        return None
    return connection, reply["pid"]


def private_directory(directory: str | os.PathLike) -> bool:
    """Whether `directory` is this user's alone (not a link, owned by this user, no access for others):
    only this user's processes can then listen there. FileNotFoundError where there is none."""
    info = os.lstat(directory)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def send_signal(pid: int, signum: int) -> None:
    """Signal process `pid`, which may have ended already."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _peer_uid(connection: socket.socket) -> int:
    """The user of the process that listens at the other end of a connected Unix socket."""
    if not hasattr(socket, "SO_PEERCRED"):
        raise OSError("no SO_PEERCRED here: the peer's user cannot be told")
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", credentials)
    return uid


def _untrusted(path: str, reason: str) -> None:
    """Say why the socket at `path` is not sent the command, its environment and its streams."""
    print(f"ldpbench: not handing the command to {path} ({SOCKET_ENV}): {reason}; running it here",
          file=sys.stderr)


def _receive(connection: socket.socket) -> dict | None:
    message = connection.recv(MAX_MESSAGE)
    try:
        return decode(message) if message else None
    except UNDECODABLE:
        return None
