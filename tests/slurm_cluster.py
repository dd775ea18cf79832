"""A one-node SLURM cluster on localhost for tests: munged, slurmctld and slurmd from Debian's packages.

Everything lives in a temporary directory except slurm.conf, which must be at the default path
/etc/slurm/slurm.conf: Snakemake's job step strips SLURM_* variables, so a SLURM_CONF pointing
elsewhere breaks the inner srun (see ../shared/reference/environment.md). We only ever write that
file when it is absent or carries our marker, and remove it again on stop, so a real site's
configuration is never touched. Daemons are stopped by the PIDs in their pid files.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SLURM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = "# ldpbench-test-cluster: written by tests/slurm_cluster.py, removed when the test stops"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "srun")


class SlurmUnavailable(Exception):
    """The cluster cannot start here; the message says why (the test is skipped with it)."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.pid_files: dict[str, Path] = {}
        self.wrote_conf = False

    # ------------------------------------------------------------------ preconditions
    def check(self) -> None:
        missing = [b for b in BINARIES if shutil.which(b) is None]
        if missing:
            raise SlurmUnavailable(f"SLURM/munge binaries not installed: {missing} "
                                   "(apt-get install slurm-wlm munge)")
        if os.geteuid() != 0:
            raise SlurmUnavailable("needs root: slurmd runs jobs as their user and slurm.conf must be "
                                   f"written to {SLURM_CONF}")
        if SLURM_CONF.exists() and MARKER not in SLURM_CONF.read_text(errors="replace"):
            raise SlurmUnavailable(f"{SLURM_CONF} exists and was not written by this test; "
                                   "refusing to overwrite a real site's configuration")
        try:
            pwd.getpwnam("munge")
        except KeyError:
            raise SlurmUnavailable("no 'munge' user (the munge package creates it)") from None
        if not Path("/etc/munge/munge.key").exists():
            raise SlurmUnavailable("/etc/munge/munge.key is missing (the munge package creates it)")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", 6817)) == 0:
                raise SlurmUnavailable("a slurmctld is already listening on port 6817")

    # ------------------------------------------------------------------ start / stop
    def start(self) -> None:
        self.check()
        for sub in ("munge", "state", "spool", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # munged refuses a socket whose path is not searchable by everyone (pytest makes 0700 dirs).
        for directory in [self.root, *self.root.parents]:
            if directory == Path("/"):
                break
            os.chmod(directory, os.stat(directory).st_mode | 0o055)
        munge_dir = self.root / "munge"
        munge = pwd.getpwnam("munge")
        os.chown(munge_dir, munge.pw_uid, munge.pw_gid)
        os.chmod(munge_dir, 0o755)
        socket = munge_dir / "munge.socket.2"
        self.pid_files["munged"] = munge_dir / "munged.pid"
        self._spawn(["runuser", "-u", "munge", "--", "munged", f"--socket={socket}",
                     f"--pid-file={self.pid_files['munged']}", f"--log-file={munge_dir / 'munged.log'}",
                     f"--seed-file={munge_dir / 'munged.seed'}"], "munged")
        self._wait_for(socket.exists, 10, "munged did not create its socket",
                       munge_dir / "munged.log")

        cpus = os.cpu_count() or 1
        memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        self.pid_files["slurmctld"] = self.root / "run" / "slurmctld.pid"
        self.pid_files["slurmd"] = self.root / "run" / "slurmd.pid"
        conf = f"""{MARKER}
ClusterName=ldpbench-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
StateSaveLocation={self.root / 'state'}
SlurmdSpoolDir={self.root / 'spool'}
SlurmctldPidFile={self.pid_files['slurmctld']}
SlurmdPidFile={self.pid_files['slurmd']}
SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}
SlurmdLogFile={self.root / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
MinJobAge=300
SchedulerType=sched/backfill
NodeName=localhost CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(conf)
        self.wrote_conf = True
        self._spawn(["slurmctld", "-c"], "slurmctld")
        self._spawn(["slurmd", "-N", "localhost"], "slurmd")
        self._wait_for(self._node_idle, 30, "the node did not become idle",
                       self.root / "log" / "slurmctld.log", self.root / "log" / "slurmd.log")

    def _spawn(self, command: list[str], name: str) -> None:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            self.stop()
            raise SlurmUnavailable(f"{name} did not start (exit {result.returncode}): "
                                   f"{result.stderr.strip() or result.stdout.strip()}")

    def _node_idle(self) -> bool:
        result = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
        return result.returncode == 0 and "idle" in result.stdout

    def _wait_for(self, condition, seconds: float, what: str, *logs: Path) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.3)
        details = "\n".join(f"--- {log}:\n{_tail(log)}" for log in logs)
        self.stop()
        raise SlurmUnavailable(f"{what} within {seconds:g} s\n{details}")

    def stop(self) -> None:
        """Stop the daemons by the PIDs in their pid files (slurmd, slurmctld, then munged)."""
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.pid_files.get(name)
            if pid_file is None or not pid_file.exists():
                continue
            try:
                pid = int(pid_file.read_text().strip())
            except ValueError:
                continue
            _terminate(pid)
        if self.wrote_conf and SLURM_CONF.exists() and MARKER in SLURM_CONF.read_text(errors="replace"):
            SLURM_CONF.unlink()
        self.wrote_conf = False


def _terminate(pid: int, grace: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
