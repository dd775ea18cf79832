"""The fork server (ldpbench/launch/fork_server.py): a command forked from it behaves as a fresh process would.

The workflow tests run every campaign through it (the golden test checks its numbers, test_faults its
ends under SIGKILL); these tests check the protocol's paths one by one.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from ldpbench.launch import client, fork_server, processes
from ldpbench.layout import run_file

from plans import run_plan
from workflow_cli import environment, small_config, snakemake

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Unix sockets with descriptor passing")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory):
    """A worker owned by this test process (its process, its socket, its log)."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    started = fork_server.start(os.getpid(), log)
    assert started is not None, log.read_text()
    process, socket_path = started
    yield process, socket_path, log
    fork_server.stop(process, socket_path)
    assert not socket_path.parent.exists()


@pytest.fixture(scope="module")
def warm(warm_server):
    """The module's worker: its socket and its log."""
    _, socket_path, log = warm_server
    return socket_path, log


def client_environment(socket_path, **changes) -> dict[str, str]:
    environment = {**os.environ, client.SOCKET_ENV: str(socket_path), client.JOB_ENV: "1", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": str(REPO)}
    environment.pop("SLURM_JOB_ID", None)
    environment.update(changes)
    return {key: value for key, value in environment.items() if value is not None}


def ldpbench(*argv, env, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ldpbench", *argv], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def run_probe(code: str, timeout: float = 300, **variables: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (this checkout first on its path, `variables` in its environment);
    it must succeed."""
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **variables, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def served(log: Path) -> int:
    """Commands the worker forked so far: one 'forked' line each in its log."""
    return log.read_text().count(fork_server.FORKED)


def test_the_launch_code_imports_only_the_standard_library():
    """Every job of a campaign imports the client (python -m ldpbench) before anything else, and the
    worker module is imported by the workflow when it is parsed: neither may pull in numpy, torch or
    the CLI (the worker is handed the CLI's main)."""
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import ldpbench.launch.client, ldpbench.launch.fork_server, ldpbench.launch.parent_watch\n"
        "added = {name.split('.')[0] for name in set(sys.modules) - before}\n"
        "print(sorted(added - set(sys.stdlib_module_names)), 'ldpbench.cli' in sys.modules)\n"
    )
    done = run_probe(probe, timeout=60)
    assert done.stdout.split() == ["['ldpbench']", "False"]


def test_a_jobs_client_imports_nothing_it_does_not_use():
    """The client runs once per job: what it imports is paid by every job of every campaign. The parent
    watch's logging, threading and dataclasses (most of its import time) are not its to pay, nor `re`
    (which `json` imports) and `pathlib`, which setuptools' editable-install hook imported at every start."""
    probe = (
        "import sys\n"
        "import ldpbench.launch.client\n"
        "print(sorted({'logging', 'threading', 'dataclasses', 'ldpbench.launch.parent_watch', 're', 'json',\n"
        "              'pathlib'} & set(sys.modules)))\n"
    )
    assert run_probe(probe, timeout=60).stdout.split() == ["[]"]


def test_a_command_through_the_worker_prints_and_exits_as_a_fresh_process(warm):
    socket_path, log = warm
    for argv in (["mechanisms"], ["validate", "no-such-campaign.yaml"], ["no-such-command"]):
        before = served(log)
        through = ldpbench(*argv, env=client_environment(socket_path))
        assert served(log) == before + 1, f"{argv} was not run by the worker"
        fresh = ldpbench(*argv, env=client_environment(socket_path, **{client.SOCKET_ENV: None}))
        assert served(log) == before + 1
        assert (through.returncode, through.stdout, through.stderr) == (fresh.returncode, fresh.stdout,
                                                                         fresh.stderr), argv
    assert through.returncode == 2 and "invalid choice: 'no-such-command'" in through.stderr


def ended_lines(log: Path) -> dict[int, str]:
    """The worker's ENDED line of each job it reaped so far, by the job's pid."""
    lines = [line for line in log.read_text().splitlines() if f" {fork_server.ENDED} " in line]
    return {int(line.split(f" {fork_server.ENDED} ")[1].split()[0]): line for line in lines}


def test_the_worker_logs_each_jobs_exit_code_wall_and_cpu_seconds_as_it_reaps_it(warm):
    """Campaign profiles (benchmarks/campaign_profile.py) add up a campaign's core-time by command from
    these lines: one per forked job, joined to its FORKED line by the pid."""
    socket_path, log = warm
    for argv, code in ((["mechanisms"], 0), (["no-such-command"], 2)):
        done = ldpbench(*argv, env=client_environment(socket_path))
        assert done.returncode == code
        pid = int([line for line in log.read_text().splitlines() if f" {fork_server.FORKED} " in line][-1]
                  .split(f" {fork_server.FORKED} ")[1].split()[0])
        line = wait_for_ended(log, pid)
        wall, cpu = (float(value) for value in re.findall(r"([0-9.]+) s (?:wall|CPU)", line))
        assert f" {pid} (exit {code}): " in line and wall > 0 and cpu > 0, line


def wait_for_ended(log: Path, pid: int, timeout: float = 10.0) -> str:
    """The ENDED line of job `pid` (the worker reaps a job just after its client has heard the exit)."""
    deadline = time.monotonic() + timeout
    while pid not in ended_lines(log):
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.01)
    return ended_lines(log)[pid]


REAP_A_SPINNING_CHILD = """
import logging, os, socket, sys, time
from pathlib import Path
from ldpbench.launch import fork_server

logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
pid = os.fork()
if pid == 0:  # the child: spin in plain Python for 0.3 s of CPU
    started = time.process_time()
    while time.process_time() - started < 0.3:
        pass
    os._exit(3)
ours, theirs = socket.socketpair()
worker = fork_server._Worker(None, Path("unused"), (-1, -1), run=lambda argv: 0)
worker.jobs[pid] = fork_server._Job(ours)
deadline = time.monotonic() + 30
while worker.jobs and time.monotonic() < deadline:
    worker.reap()
    time.sleep(0.01)
print("child", pid)
"""


def test_a_reaped_jobs_cpu_seconds_are_its_own_and_not_the_workers():
    """A child that spins for 0.3 s of CPU is logged with at least that, and at most its wall time; the
    worker's own CPU is not counted. In a process of its own: the worker reaps any child that ended,
    which in the test process could be another test's."""
    lines = run_probe(REAP_A_SPINNING_CHILD, timeout=60).stdout.splitlines()
    pid = int(lines[-1].split()[1])
    [line] = [line for line in lines if line.startswith(f"{fork_server.ENDED} {pid} ")]
    wall, cpu = (float(value) for value in re.findall(r"([0-9.]+) s (?:wall|CPU)", line))
    assert line.startswith(f"{fork_server.ENDED} {pid} (exit 3): ") and 0.3 <= cpu <= wall + 0.05, line


@pytest.mark.parametrize("message", [b'{"argv": ["mechanisms"]}', b"\x00 not marshalled",
                                     marshal.dumps(["mechanisms"])])
def test_a_message_that_is_no_request_is_dropped_and_the_worker_serves_on(warm, message):
    """A message the worker cannot read as a request (JSON, bytes, a marshalled list) closes that
    connection alone, forking nothing: the next command is served."""
    socket_path, log = warm
    before = served(log)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.connect(str(socket_path))
        connection.settimeout(30)
        socket.send_fds(connection, [message], list(client.STREAMS))
        assert connection.recv(client.MAX_MESSAGE) == b""  # closed, with no answer
    assert served(log) == before
    assert ldpbench("mechanisms", env=client_environment(socket_path)).returncode == 0
    assert served(log) == before + 1


def test_the_job_runs_in_its_own_directory_and_environment(warm, tmp_path):
    socket_path, log = warm
    campaign = tmp_path / "campaign.yaml"
    campaign.write_text("campaign: [not, a, name]\n")
    env = client_environment(socket_path)
    result = subprocess.run([sys.executable, "-m", "ldpbench", "validate", "campaign.yaml"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "campaign" in result.stderr, result.stderr


@pytest.mark.parametrize("changes", [
    {client.SOCKET_ENV: None},
    {"SLURM_JOB_ID": "17"},  # work of a SLURM job belongs inside its allocation
    {client.JOB_ENV: None},  # not a command of the workflow's rules
    {client.JOB_ENV: "0"},
    {"OMP_NUM_THREADS": None},  # its thread count would be unknown
    {client.SOCKET_ENV: "/nonexistent/fork_server.sock"},
])
def test_a_client_runs_the_command_itself_when_the_worker_must_not_or_cannot(warm, changes):
    socket_path, log = warm
    before = served(log)
    result = ldpbench("datasets", env=client_environment(socket_path, **changes))
    assert result.returncode == 0 and "adult" in result.stdout
    assert served(log) == before
    assert "not handing the command" not in result.stderr  # nothing untrusted here: nothing to say


def test_a_worker_refuses_a_client_of_another_installation(warm, monkeypatch):
    socket_path, log = warm
    before = served(log)
    monkeypatch.setenv(client.SOCKET_ENV, str(socket_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv(client.JOB_ENV, "1")
    monkeypatch.setattr(client, "installation", lambda: {"executable": "/other/python", "package": "/other"})
    assert client.delegate(["datasets"]) is None
    assert served(log) == before


def nested_worker(warm, tmp_path, owner: int) -> tuple[subprocess.Popen, Path]:
    """A client whose command, `ldpbench worker`, runs until it is stopped: a long job to signal."""
    socket_path, log = warm
    inner = tmp_path / "inner.sock"
    before = served(log)
    job = subprocess.Popen([sys.executable, "-m", "ldpbench", "worker", "--socket", str(inner), "--owner",
                               str(owner)], env=client_environment(socket_path), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not inner.exists():
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert served(log) == before + 1
    return job, inner


def wait_gone(path: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while path.exists():
        assert time.monotonic() < deadline, f"{path} still there after {seconds} s"
        time.sleep(0.02)


def test_sigterm_to_the_client_reaches_the_command(warm, tmp_path):
    job, inner = nested_worker(warm, tmp_path, os.getpid())
    job.send_signal(signal.SIGTERM)
    wait_gone(inner)  # the inner worker stopped (it removes its socket on SIGTERM)
    _, stderr = job.communicate(timeout=30)
    assert job.returncode == 0 and "worker stopped after 0 commands" in stderr


def test_a_sigterm_that_reaches_the_client_during_the_handover_reaches_the_command(warm, tmp_path):
    """The server forks the command before the client hears its pid: a SIGTERM to the client in that moment
    is passed on once the pid is known (the client's send_request, patched to signal its own process as it
    returns), and the command takes it however early it comes (held back over the fork, not caught by the
    worker's handler copied into the child). The client exits with the command's status: stopped by the
    signal, as a fresh process signalled at its start, or stopped on it once the inner worker serves."""
    socket_path, _ = warm
    inner = tmp_path / "inner.sock"
    probe = (
        "import os, signal, sys\n"
        "from ldpbench.launch import client\n"
        "send_request = client.send_request\n"
        "def signalled_as_it_returns(*args):\n"
        "    sent = send_request(*args)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return sent\n"
        "client.send_request = signalled_as_it_returns\n"
        f"sys.exit(client.delegate(['worker', '--socket', {str(inner)!r}, '--owner', str(os.getppid())]))\n"
    )
    job = subprocess.run([sys.executable, "-c", probe], env=client_environment(socket_path), cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert job.returncode in (128 + signal.SIGTERM, 0), (job.returncode, job.stderr)
    assert job.returncode or "worker stopped after 0 commands" in job.stderr, job.stderr
    assert not inner.exists()


def test_a_killed_client_takes_its_command_with_it(warm, tmp_path):
    job, inner = nested_worker(warm, tmp_path, os.getpid())
    job.kill()  # no forwarding: the worker sees the connection close
    job.wait()
    wait_gone(inner)


def test_a_worker_ends_with_its_owner(tmp_path):
    owner = subprocess.Popen(["sleep", "60"])
    started = fork_server.start(owner.pid, tmp_path / "worker.log")
    assert started is not None
    process, socket_path = started
    try:
        owner.kill()
        owner.wait()
        process.wait(timeout=30)
        assert not socket_path.exists()
    finally:
        fork_server.stop(process, socket_path)


def test_a_worker_stopped_as_soon_as_it_listens_ends_through_its_own_cleanup(tmp_path):
    """start() returns once the socket exists, so a campaign that ends at once stops the worker then: the
    SIGTERM must be heard from there on, not kill it by default (exit -15, its socket left behind)."""
    steps = """
        serve_loop = fork_server._serve
        def slow_to_start(*args, **kwargs):  # a loaded machine's moment between the socket and the loop
            time.sleep(2)
            return serve_loop(*args, **kwargs)
        fork_server._serve = slow_to_start
    """
    with serving(tmp_path, steps, ()) as (socket_path, _, server):
        server.terminate()
        assert server.wait(timeout=60) == 0
        assert not socket_path.exists()


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def a_seed(log: Path, linger: float, jobs_only: tuple[str, ...] = ()) -> subprocess.Popen:
    """A worker started with a linger, its preload done and its campaign ended: the seed of its key."""
    seed, socket_path = fork_server.start(os.getpid(), log, tracking=False, linger=linger, jobs_only=jobs_only)
    wait_for(log, f" {fork_server.READY}: ")
    fork_server.stop(seed, socket_path)
    wait_for(log, f" {fork_server.SEED} ")
    assert seed.poll() is None and not socket_path.parent.exists()
    return seed


def test_a_worker_with_a_linger_stays_as_the_seed_of_the_next_workers_of_its_key(tmp_path, monkeypatch):
    """After its campaign, a worker with a linger stays on as the seed: the next campaign's worker of the
    same key is forked from it, every preload step done, and serves; it exits at its own campaign's end
    (the seed holds the key), and the seed once none has started for the linger. What the workflow sets
    for its jobs alone (a campaign's own directories) is no part of the key; any other variable is:
    another environment, a fresh worker."""
    monkeypatch.setenv("LDPBENCH_SEED_TEST", str(tmp_path))  # a key of this test's own
    jobs_only = ("LDPBENCH_SEED_TEST_CAMPAIGN",)
    monkeypatch.setenv(jobs_only[0], "the first campaign")
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    seed = a_seed(first_log, 8, jobs_only)
    try:
        assert f"{jobs_only[0]}=".encode() not in Path(f"/proc/{seed.pid}/environ").read_bytes()
        assert f"{fork_server.STOPPED} after 0 commands" in first_log.read_text()
        monkeypatch.setenv(jobs_only[0], "the second campaign")
        second, second_socket = fork_server.start(os.getpid(), second_log, tracking=False, linger=8,
                                                  jobs_only=jobs_only)
        assert isinstance(second, fork_server.ForkedWorker) and parent_of(second.pid) == seed.pid
        assert f" {fork_server.READY}: " in second_log.read_text() and "(by the seed" in second_log.read_text()
        done = ldpbench("mechanisms", env=client_environment(second_socket))
        assert done.returncode == 0 and "pm" in done.stdout, done.stderr
        assert served(second_log) == 1
        fork_server.stop(second, second_socket)
        assert second.wait(timeout=30) == 0 and seed.poll() is None
        # Another environment, another key: a fresh worker, not preloaded, which ends with its campaign.
        monkeypatch.setenv("LDPBENCH_SEED_TEST", str(tmp_path / "other"))
        other, other_socket = fork_server.start(os.getpid(), tmp_path / "other.log", tracking=False, linger=5)
        assert isinstance(other, subprocess.Popen)
        fork_server.stop(other, other_socket)
        assert other.wait(timeout=30) == 0
        # The seed ends once none has started for its linger, its socket gone.
        assert seed.wait(timeout=60) == 0
        monkeypatch.setenv("LDPBENCH_SEED_TEST", str(tmp_path))
        key = fork_server.seed_key(fork_server.worker_environment(jobs_only), False)
        assert not (fork_server.seed_directory(key) / fork_server.SOCKET_NAME).exists()
    finally:
        seed.kill()
        seed.wait()
    seed_log = (tmp_path / "first.log").read_text()
    assert "Traceback" not in seed_log + second_log.read_text()


def test_the_tests_campaigns_start_in_the_environment_of_a_users_shell(monkeypatch):
    """What the test process sets in its own environment stays out of its campaigns' (workflow_cli): pytest's
    variables (the running test, the xdist worker), and what importing polars sets (MLflow's import does, in
    every test that reads MLflow). With them, the campaigns after such a test, or on another xdist worker,
    would key a warm seed apart (fork_server.seed_key) and start cold."""
    shell = {name: value for name, value in os.environ.items()
             if not name.startswith("PYTEST_") and name != "_RJEM_MALLOC_CONF"}
    child = subprocess.run([sys.executable, "-c", "import json, os, polars; print(json.dumps(dict(os.environ)))"],
                           env=shell, capture_output=True, text=True, check=True, timeout=120)
    set_by_import = {name: value for name, value in json.loads(child.stdout).items() if name not in shell}
    assert set_by_import, "importing polars set nothing: the premise of this test is gone"
    for name, value in set_by_import.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert "PYTEST_CURRENT_TEST" in os.environ
    assert not ({"PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", *set_by_import} & set(environment()))


def _modules_not_imported(preload: list[str]) -> list[str]:
    return [name for name in preload if name not in sys.modules]


def test_the_tests_snakemakes_are_forked_from_a_server_that_imported_each_name_of_its_preload():
    """multiprocessing's fork server skips a preload name it cannot import without a word: a misspelt or
    moved module in fresh_processes.PRELOAD would leave each forked Snakemake to import it again."""
    import fresh_processes

    with fresh_processes.context().Pool(1) as pool:
        assert pool.apply(_modules_not_imported, (fresh_processes.PRELOAD,)) == []


def test_a_seed_whose_imports_changed_forks_no_worker_and_ends(tmp_path, monkeypatch):
    """A module the seed imported changed (here its sitecustomize; an edit of ldpbench or a plugin, an
    upgraded package): its forks would run what was, so the next campaign gets a fresh worker and the
    seed ends."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO)]))
    seed = a_seed(tmp_path / "first.log", 60)
    try:
        edited = (site / "sitecustomize.py").stat().st_mtime_ns + 10**9
        os.utime(site / "sitecustomize.py", ns=(edited, edited))
        second, second_socket = fork_server.start(os.getpid(), tmp_path / "second.log", tracking=False, linger=60)
        assert isinstance(second, subprocess.Popen)
        assert seed.wait(timeout=30) == 0
        fork_server.stop(second, second_socket)
        second.kill()
        second.wait()
    finally:
        seed.kill()
        seed.wait()


def test_stop_seeds_ends_the_seeds_but_those_kept_and_not_the_campaigns_they_forked(tmp_path, monkeypatch):
    """A seed's children are workers of campaigns that go on: they outlive it, serve, and end with their
    campaign (the first of them then the key's seed again)."""
    monkeypatch.setenv("LDPBENCH_SEED_TEST", str(tmp_path))
    seed = a_seed(tmp_path / "worker.log", 600)
    try:
        others = set(fork_server.living_seeds()) - {seed.pid}  # other tests' (xdist)
        campaign, campaign_socket = fork_server.start(os.getpid(), tmp_path / "campaign.log", tracking=False,
                                                      linger=600)
        assert parent_of(campaign.pid) == seed.pid
        assert fork_server.stop_seeds(keep=others | {seed.pid}) == [] and seed.poll() is None
        assert fork_server.stop_seeds(keep=others) == [seed.pid]
        assert seed.wait(timeout=30) == 0
        done = ldpbench("mechanisms", env=client_environment(campaign_socket))
        assert done.returncode == 0 and served(tmp_path / "campaign.log") == 1, done.stderr
        fork_server.stop(campaign, campaign_socket)
        wait_for(tmp_path / "campaign.log", f" {fork_server.SEED} ")  # the key's seed now
        assert fork_server.stop_seeds(keep=others) == [campaign.pid]
    finally:
        seed.kill()
        seed.wait()


def test_a_seed_that_ended_leaves_its_directory_but_is_no_living_seed_and_the_next_one_there_is(tmp_path,
                                                                                                monkeypatch):
    """What stop_seeds keeps is known by pid: a directory outlives its seed (the test session kept every
    directory it found at its start, so a seed started there later outlived the session)."""
    monkeypatch.setenv("LDPBENCH_SEED_TEST", str(tmp_path))
    seeds = [a_seed(tmp_path / "first.log", 600)]
    try:
        directory = fork_server.seed_directory(fork_server.seed_key(fork_server.worker_environment(), False))
        assert fork_server.living_seeds()[seeds[0].pid] == directory
        seeds[0].terminate()
        assert seeds[0].wait(timeout=30) == 0 and directory.exists()
        before = fork_server.living_seeds()
        assert seeds[0].pid not in before and directory not in before.values()
        seeds.append(a_seed(tmp_path / "second.log", 600))
        assert fork_server.living_seeds()[seeds[1].pid] == directory
        others = set(fork_server.living_seeds()) - {seeds[1].pid}  # other tests' (xdist)
        assert fork_server.stop_seeds(keep=others) == [seeds[1].pid] and seeds[1].wait(timeout=30) == 0
    finally:
        for seed in seeds:
            seed.kill()
            seed.wait()


# A seed that stop_seeds names before its serving loop began: the worker's serve() left SIGTERM ignored,
# and the SIGTERM comes right after the seed wrote its pid into its lock (while it reads its sources).
SEED_STOPPED_AS_IT_STARTS = """
import os, signal, sys
from ldpbench.launch import fork_server

signal.signal(signal.SIGTERM, signal.SIG_IGN)


def sources_meanwhile(known):
    os.kill(os.getpid(), signal.SIGTERM)
    return {}


fork_server._loaded_sources = sources_meanwhile
sys.exit(fork_server.linger_as_seed(sys.argv[1], 600, run=lambda argv: 0))
"""


def test_a_seed_told_to_stop_as_it_starts_stops():
    key = f"test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        ended = subprocess.run([sys.executable, "-c", SEED_STOPPED_AS_IT_STARTS, key], timeout=30)
        assert ended.returncode == 0  # it served nothing and returned, rather than linger 600 s
    finally:
        shutil.rmtree(fork_server.seed_directory(key), ignore_errors=True)


def test_a_worker_without_a_linger_ends_with_its_campaign(tmp_path):
    log = tmp_path / "worker.log"
    process, socket_path = fork_server.start(os.getpid(), log, tracking=False)
    wait_for(log, f" {fork_server.READY}: ")
    fork_server.stop(process, socket_path)
    assert process.wait(timeout=30) == 0 and f" {fork_server.SEED} " not in log.read_text()


def test_a_forked_command_takes_the_jobs_thread_count():
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    threads = torch.get_num_threads()
    with threadpool_limits(limits=None):  # restores the BLAS libraries' counts on the way out
        try:
            fork_server._apply_thread_count("3")
            assert torch.get_num_threads() == 3
            assert all(library["num_threads"] == 3 for library in threadpool_info())
            fork_server._apply_thread_count("1")
            assert torch.get_num_threads() == 1
        finally:
            torch.set_num_threads(threads)


def os_threads(pid: int) -> list[str]:
    """The names of process `pid`'s OS threads, read from outside it (/proc/PID/task)."""
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            names.append(Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
    return names


def wait_for(log: Path, text: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not log.exists() or text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in the worker's log within {seconds} s:\n" + \
            (log.read_text()[-3000:] if log.exists() else "(none)")
        time.sleep(0.1)


def test_the_warm_worker_runs_a_single_thread_after_its_imports(warm_server):
    """A fork copies only the forking thread: the worker's imports (pyarrow's jemalloc, MLflow, numba,
    torch) leave it one OS thread, counted by the worker and, from outside, in /proc."""
    process, socket_path, log = warm_server
    wait_for(log, f" {fork_server.READY}: ")
    [line] = [line for line in log.read_text().splitlines() if f" {fork_server.READY}: " in line]
    assert line.endswith(", 1 thread(s)"), line
    assert len(os_threads(process.pid)) == 1, os_threads(process.pid)



def test_a_dataset_a_job_read_is_held_for_the_next_jobs_with_the_same_numbers(warm_server, syn_s, tmp_path):
    """The worker reads a run-cell job's dataset once (in a throwaway child, as Arrow's thread pools
    stay in the process that reads Parquet: the worker is still a single thread when it forks the
    next job); the jobs after it take that copy and their files equal those of a fresh process."""
    process, socket_path, log = warm_server
    plan = run_plan("syn-S-0.1-0.9", "lr", "pm", {}, 2.0, 0, 0, 0, 0.2,
                    {"epochs": 1, "batch_fraction": 0.05, "learning_rate": 0.1, "eval_every": 5})
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"cell_id": "c", "phase": "final",
                                 "runs": [{"run_id": plan.run_id, "plan": plan.to_dict()}]}))

    def run_cell(name: str, **changes) -> tuple[Path, str]:
        out = tmp_path / name
        done = ldpbench("run-cell", "--cell", str(plans), "--prepared", str(syn_s), "--runs-root", str(out),
                        "--marker", str(out / "marker.json"), env=client_environment(socket_path, **changes))
        assert done.returncode == 0, done.stderr
        return out, done.stderr

    first_out, first = run_cell("first")
    wait_for(log, f"{syn_s.resolve()} held")
    assert len(os_threads(process.pid)) == 1, os_threads(process.pid)
    before = served(log)
    second_out, second = run_cell("second")
    assert served(log) == before + 1
    forked = [line for line in log.read_text().splitlines() if f" {fork_server.FORKED} " in line]
    assert forked and all(f" from {fork_server.SINGLE_THREAD} " in line for line in forked), forked
    fresh_out, fresh = run_cell("fresh", **{client.SOCKET_ENV: None})
    assert "from the warm worker" not in first + fresh and "from the warm worker" in second
    for kind in ("curves", "ledgers"):
        frames = [pd.read_parquet(run_file(out, kind, "syn-S-0.1-0.9", "pm", "final", plan.run_id))
                  for out in (first_out, second_out, fresh_out)]
        pd.testing.assert_frame_equal(frames[1], frames[2])
        pd.testing.assert_frame_equal(frames[0], frames[2])
    timing = ["train_seconds", "wall_seconds", "started_at", "finished_at"]
    summaries = [pd.read_parquet(run_file(out, "summaries", "syn-S-0.1-0.9", "pm", "final", plan.run_id))
                 .drop(columns=timing) for out in (second_out, fresh_out)]
    pd.testing.assert_frame_equal(*summaries)


def test_kernels_compile_in_a_child_while_the_worker_serves_then_the_worker_loads_them(tmp_path, monkeypatch):
    """On a new installation (an empty numba cache) compiling the kernels takes seconds: a child
    does it, the worker serves a job meanwhile, then loads the cache itself. The next
    worker of the same installation loads the cache itself at once: no child."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba-cache"))  # nothing compiled yet
    [step] = fork_server.COMPILED_IN_A_CHILD_FIRST
    assert not fork_server.compiled_before(step)
    log = tmp_path / "worker.log"
    started = fork_server.start(os.getpid(), log)
    assert started is not None, log.read_text()
    process, socket_path = started
    try:
        [step] = fork_server.COMPILED_IN_A_CHILD_FIRST
        deadline = time.monotonic() + 120
        while f" prepares {step} " not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        served_while_compiling = ldpbench("mechanisms", env=client_environment(socket_path))
        assert served_while_compiling.returncode == 0, served_while_compiling.stderr
        while f" {fork_server.READY}: " not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        fork_server.stop(process, socket_path)
    lines = log.read_text().splitlines()
    order = [next(i for i, line in enumerate(lines) if text in line)
             for text in (f" prepares {step} ", f" {fork_server.FORKED} ", f" {fork_server.READY}: ")]
    assert order == sorted(order), lines
    assert "Traceback" not in log.read_text() and any((tmp_path / "numba-cache").rglob("*.nbi"))
    assert fork_server.compiled_before(step)
    # The next worker: the step in the worker itself, from the cache, and the kernels loaded.
    second_log = tmp_path / "second-worker.log"
    process, socket_path = fork_server.start(os.getpid(), second_log)
    try:
        deadline = time.monotonic() + 120
        while f" {fork_server.READY}: " not in second_log.read_text():
            assert time.monotonic() < deadline, second_log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        fork_server.stop(process, socket_path)
    assert " prepares " not in second_log.read_text() and "failed" not in second_log.read_text()
    # Another cache is another installation's: its child first again.
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "another-cache"))
    assert not fork_server.compiled_before(step)


def test_a_preload_step_that_fails_is_logged_and_the_worker_goes_on(tmp_path):
    probe = (  # serve() installs signal handlers: it runs in a process of its own
        "import logging, os, subprocess, sys\n"
        "from ldpbench.launch import fork_server\n"
        "from ldpbench.cli import main\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "fork_server.POLL_SECONDS = 0.05\n"
        "done = []\n"
        "fork_server._preload = lambda step: done.append(step) or (step == 'bad' and 1 / 0)\n"
        "owner = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)'])\n"
        f"fork_server.serve({str(tmp_path / 'socket')!r}, owner.pid, preload=('bad', 'good'), run=main)\n"
        "print(done)\n"
    )
    done = run_probe(probe, timeout=120)
    assert done.stdout.split() == ["['bad',", "'good']"]
    assert "preload step bad failed" in done.stderr and f"{fork_server.READY}: 2 preload steps done" in done.stderr


def test_a_worker_that_runs_more_than_one_thread_forks_nothing_and_its_clients_run_their_commands(tmp_path):
    """A preload step that leaves a thread behind (a package that starts a pool at import, say) makes
    the worker decline every command, naming its threads; each client then runs its own."""
    directory = tmp_path / "private"
    directory.mkdir(mode=0o700)
    socket_path, log = directory / "worker.sock", tmp_path / "worker.log"
    probe = (  # serve() installs signal handlers: it runs in a process of its own
        "import logging, threading, time\n"
        "from ldpbench.launch import fork_server\n"
        "from ldpbench.cli import main\n"
        f"logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s', filename={str(log)!r})\n"
        "fork_server.POLL_SECONDS = 0.05\n"
        "def start_a_thread():\n"
        "    threading.Thread(target=time.sleep, args=(600,), name='pool', daemon=True).start()\n"
        f"fork_server.serve({str(socket_path)!r}, {os.getpid()}, preload=('__main__:start_a_thread',), run=main)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(log, f" {fork_server.READY}: ")
        assert "after preload step __main__:start_a_thread the worker forks nothing (it runs 2 threads" \
            in log.read_text()
        result = ldpbench("datasets", env=client_environment(socket_path))
        assert result.returncode == 0 and "adult" in result.stdout, result.stderr
        assert f" {fork_server.DECLINED} for process " in log.read_text()
        assert served(log) == 0
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_what_a_preload_step_made_is_frozen_for_the_collections_of_the_worker_and_its_jobs():
    """A preload step's objects live as long as the worker: they go to the permanent generation (gc.freeze),
    which neither the worker's collections nor those of the jobs it forks scan."""
    probe = (
        "import gc\n"
        "from ldpbench.launch import fork_server\n"
        "fork_server._preload('ldpbench.tuning')\n"
        "import ldpbench.tuning\n"
        "tracked = [object_ for generation in range(3) for object_ in gc.get_objects(generation)]\n"
        "print(gc.get_freeze_count() > 0, any(object_ is ldpbench.tuning.select_cell for object_ in tracked))\n"
    )
    done = run_probe(probe)
    assert done.stdout.split() == ["True", "False"]


# The start of a probe that serves as a worker with preload steps of its own (serve() installs signal
# handlers: it runs in a process of its own), logging to {log}; its step `wait_for_a_request` ends once
# a request waits on the worker's socket.
SERVING_PROBE = """
import logging, os, select, signal, time
from ldpbench.launch import fork_server
logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s', filename={log!r})
fork_server.POLL_SECONDS = 0.05
listen, listeners = fork_server._listen, []
fork_server._listen = lambda path: listeners.append(listen(path)) or listeners[-1]
def wait_for_a_request():
    select.select(listeners, [], [], 60)
"""


@contextlib.contextmanager
def serving(tmp_path: Path, steps: str, preload: tuple[str, ...], run: str = "main"):
    """(socket, log, process) of a worker whose probe is SERVING_PROBE, then `steps`, serving `preload`
    with `run` (the CLI's main unless `steps` defines another), once its socket exists; stopped on the
    way out."""
    directory = tmp_path / "private"
    directory.mkdir(mode=0o700)
    socket_path, log = directory / "worker.sock", tmp_path / "worker.log"
    probe = (SERVING_PROBE.format(log=str(log)) + "from ldpbench.cli import main\n" + textwrap.dedent(steps)
             + f"fork_server.serve({str(socket_path)!r}, {os.getpid()}, preload={preload!r}, run={run})\n")
    server = subprocess.Popen([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.05)
        yield socket_path, log, server
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_a_job_is_forked_once_the_steps_its_command_needs_are_done_and_the_rest_follow(tmp_path):
    """A request that comes while the worker still has steps to do waits for those its command needs
    (NEEDED_BEFORE_FORK), not for the others: a campaign's first cells are forked with numba's kernels
    loaded instead of each loading them again."""
    steps = """
        fork_server.NEEDED_BEFORE_FORK = {'datasets': '__main__:second'}
        def first():
            wait_for_a_request()
            logging.info('step first done')
        def second():
            logging.info('step second done')
        def third():
            logging.info('step third done')
    """
    with serving(tmp_path, steps, ("__main__:first", "__main__:second", "__main__:third")) as (socket_path, log, _):
        result = ldpbench("datasets", env=client_environment(socket_path))
        assert result.returncode == 0 and "adult" in result.stdout, result.stderr
        wait_for(log, f" {fork_server.READY}: ")
    events = [line for line in log.read_text().splitlines()
              if line.startswith("INFO step ") or f" {fork_server.FORKED} " in line]
    order = ["forked" if f" {fork_server.FORKED} " in event else event.split()[2] for event in events]
    assert order == ["first", "second", "forked", "third"], events


def test_a_client_hears_its_jobs_exit_status_while_the_worker_is_inside_a_preload_step(tmp_path):
    """The worker sends a job's exit status when it reaps the job, between preload steps (importing MLflow
    takes a second): the job sends it itself as it ends. Here the worker's second step lasts until the
    client has returned, which without that it never would."""
    released = tmp_path / "released"
    steps = f"""
        def long_import():  # ends once the client has returned
            while not os.path.exists({str(released)!r}):
                time.sleep(0.05)
    """
    try:
        with serving(tmp_path, steps, ("__main__:wait_for_a_request", "__main__:long_import")) as (
                socket_path, log, _):
            result = ldpbench("datasets", "--no-such-option", env=client_environment(socket_path), timeout=60)
            assert result.returncode == 2 and "--no-such-option" in result.stderr, result.stderr  # argparse's
            released.touch()
            wait_for(log, f" {fork_server.READY}: ")
            assert served(log) == 1
    finally:
        released.touch()


def test_a_job_that_has_sent_its_status_ends_as_it_is_whatever_signal_comes_then(tmp_path):
    """Told the status, the client goes, and the worker stops the child that ran the job (SIGTERM) while it
    may still be exiting: a job's own SIGTERM handler (a run's parent watch raises SystemExit) must not
    run then, or the child would unwind into the worker's code it inherited."""
    steps = """
        def stop(signum, frame):
            raise SystemExit(128 + signum)
        def run(argv):  # a job that, like a run, ends on SIGTERM by raising SystemExit
            signal.signal(signal.SIGTERM, stop)
            return 0
        exit_now = os._exit
        def slow_exit(code):  # a child of a large job takes a while to exit: the SIGTERM comes meanwhile
            time.sleep(2)
            exit_now(code)
        os._exit = slow_exit
    """
    with serving(tmp_path, steps, (), run="run") as (socket_path, log, server):
        result = ldpbench("datasets", env=client_environment(socket_path), timeout=60)
        assert result.returncode == 0, result.stderr
        # The child holds the client's output streams until it has exited: any unwinding would be in them.
        assert "Traceback" not in result.stderr and "SystemExit" not in result.stderr, result.stderr
        assert server.poll() is None
    assert "Traceback" not in log.read_text(), log.read_text()


def test_a_job_waits_for_no_step_that_a_child_still_compiles(monkeypatch):
    """On a new installation the kernels take seconds to compile in a child: a cell requested meanwhile
    is forked at once and draws without them, as before they were compiled."""
    [step] = fork_server.COMPILED_IN_A_CHILD_FIRST
    ran = []
    monkeypatch.setattr(fork_server, "_preload", ran.append)
    monkeypatch.setattr(fork_server, "NEEDED_BEFORE_FORK", {"run-cell": step})
    compiling_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        preloader = fork_server._Preloader(["before", step, "after"])
        preloader.compiling[step] = compiling_child.pid
        preloader.run_through_needed(["run-cell", "--cell", "plan.json"], worker=None)
        assert ran == ["before"] and preloader.pending == [step, "after"]
        preloader.run_through_needed(["datasets"], worker=None)  # a command that needs none of them
        assert ran == ["before"]
    finally:
        compiling_child.kill()
        compiling_child.wait()
    preloader.run_through_needed(["run-cell"], worker=None)  # compiled: the worker loads the cache itself
    assert ran == ["before", step] and preloader.pending == ["after"]


def test_each_command_that_waits_for_preload_steps_is_run_by_the_workflow_and_waits_for_real_steps():
    commands = set(re.findall(r"python -P -m ldpbench ([a-z-]+)",
                              "".join(path.read_text() for path in (REPO / "workflow" / "rules").glob("*.smk"))))
    assert set(fork_server.NEEDED_BEFORE_FORK) <= commands
    assert set(fork_server.NEEDED_BEFORE_FORK.values()) <= set(fork_server.PRELOAD)
    # The steps a prepare job waits for are those before torch, which it does not import.
    assert fork_server.PRELOAD.index(fork_server.NEEDED_BEFORE_FORK["prepare"]) < \
        fork_server.PRELOAD.index("ldpbench.runner")
    assert fork_server.NEEDED_BEFORE_FORK["run-cell"] in fork_server.COMPILED_IN_A_CHILD_FIRST


def test_the_first_preload_step_is_what_preparing_a_dataset_needs_and_not_torch(tmp_path):
    """A campaign's first job prepares its data: the worker forks it once its first steps are done, and
    imports torch (seconds) while the job runs. So those steps must import what preparing a synthetic
    set imports (pandas, Parquet), and preparing must not need torch."""
    probe = (
        "import sys\n"
        "from ldpbench.launch import fork_server\n"
        "for step in fork_server.PRELOAD[:fork_server.PRELOAD.index('ldpbench.runner')]: fork_server._preload(step)\n"
        "first = set(sys.modules)\n"
        "from ldpbench.data import registry\n"
        f"registry.get('syn-S-0.01-0.9').prepare({str(tmp_path / 'prepared')!r}, {str(tmp_path / 'raw')!r}, None)\n"
        "later = sorted(name for name in set(sys.modules) - first if name.split('.')[0] in "
        "('numpy', 'pandas', 'pyarrow', 'scipy', 'torch'))\n"
        "print('torch' in sys.modules, later)\n"
    )
    assert run_probe(probe).stdout.split("\n")[0] == "False []"


def test_mlflow_is_preloaded_without_the_optional_packages_that_start_threads():
    """MLflow's import pulls in polars where it is installed (a test extra here), whose thread pool a
    fork would break: the worker's preload blocks it, adds no thread, and leaves polars importable."""
    probe = (
        "import os, sys\n"
        "from ldpbench.launch import fork_server\n"
        "for module in fork_server.PRELOAD[:fork_server.PRELOAD.index('mlflow')]: fork_server._preload(module)\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "for module in fork_server.PRELOAD[fork_server.PRELOAD.index('mlflow'):]: fork_server._preload(module)\n"
        "added = len(os.listdir('/proc/self/task')) - before\n"
        "print(added, 'mlflow.tracking' in sys.modules, 'polars' in sys.modules)\n"
        "import polars\n"
    )
    single = {variable: "1" for variable in fork_server.THREAD_VARIABLES}
    done = run_probe(probe, **single)
    assert done.stdout.split() == ["0", "True", "False"]


# ----------------------------------------------------------------------------------------------------
# A job's working directory that holds a folder named `ldpbench`

# ldpbench as `pip install -e .` installs it: found by a finder that Python asks after its path, so that
# a folder named `ldpbench` on the path (the working directory, for `python -m`) is taken instead. It
# goes right after the path finder, ahead of an editable finder of the interpreter's own installation.
EDITABLE_FINDER = f"""\
import importlib.machinery, importlib.util, sys

PACKAGE = {str(REPO / "ldpbench")!r}

class Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "ldpbench":
            return importlib.util.spec_from_file_location(name, PACKAGE + "/__init__.py",
                                                          submodule_search_locations=[PACKAGE])
        return None

sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, Finder)
"""


@pytest.fixture(params=["empty folder", "another copy"])
def shadowed(request, tmp_path) -> tuple[Path, dict[str, str]]:
    """A working directory holding a folder named `ldpbench`, and the environment of a job there: an
    empty folder with ldpbench installed in editable mode (a namespace package found first), or a
    package of that name (another checkout, say) with ldpbench on PYTHONPATH."""
    work = tmp_path / "work"
    (work / "ldpbench").mkdir(parents=True)
    if request.param == "empty folder":
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(EDITABLE_FINDER)
        python_path = str(site)
    else:
        (work / "ldpbench" / "__init__.py").write_text("raise ImportError('not the installed ldpbench')\n")
        python_path = str(REPO)
    return work, {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1"}


def rule_commands() -> set[str]:
    """How the workflow's shell rules start ldpbench (`[VARIABLE=value ...] python ... ldpbench`, up to the
    command)."""
    rules = (REPO / "workflow" / "rules").glob("*.smk")
    return {command for path in rules
            for command in re.findall(r'"((?:[A-Z_]+=\S* )*python [^"]*?ldpbench) ', path.read_text())}


def test_every_command_of_the_rules_carries_the_job_marker():
    """The marker tells a client that its command is a job of the workflow, which the warm worker may
    run (its thread count in OMP_NUM_THREADS, as Snakemake sets it for every job)."""
    commands = rule_commands()
    assert commands and all(command.startswith(f"{client.JOB_ENV}=1 ") for command in commands), commands


def test_the_rules_start_ldpbench_in_a_directory_holding_a_folder_named_ldpbench(shadowed):
    work, env = shadowed
    commands = rule_commands()
    assert commands, "no `python ... ldpbench` command found in workflow/rules"
    env = {**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])}  # common.smk
    env.pop(client.SOCKET_ENV, None)
    for command in commands:
        result = subprocess.run(f"{command} datasets", shell=True, executable="/bin/bash", cwd=work, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "syn-S-0.1-0.9" in result.stdout, (command, result.stderr[-2000:])


def test_a_worker_starts_in_a_directory_holding_a_folder_named_ldpbench(shadowed, monkeypatch):
    """Snakemake starts the worker from the campaign's working directory."""
    work, env = shadowed
    monkeypatch.chdir(work)
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    log = work.parent / "worker.log"
    started = fork_server.start(os.getpid(), log)
    assert started is not None, log.read_text()[-2000:]
    fork_server.stop(*started)


# ----------------------------------------------------------------------------------------------------
# Whom a client trusts


@pytest.fixture
def listener(tmp_path):
    """A socket that records the requests sent to it and answers none (its client then runs the command
    itself), in a directory private to this user; yields its path and the requests received."""
    directory = tmp_path / "worker"
    directory.mkdir(mode=0o700)
    path = directory / "worker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.05)
    requests, stop = [], threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(5)
                message, fds, _, _ = socket.recv_fds(connection, client.MAX_MESSAGE, len(client.STREAMS))
                for fd in fds:
                    os.close(fd)
                if message:
                    requests.append(client.decode(message))

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    yield path, requests
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize("case", ["a worker of this user", "another user's process", "a directory others may enter"])
def test_a_client_hands_its_command_only_to_a_socket_of_its_own_user(listener, case, monkeypatch, capfd):
    """$LDPBENCH_WORKER may be inherited from anywhere: the command, its environment and its streams go
    only to a process of this user, listening in a directory of this user's alone."""
    path, requests = listener
    monkeypatch.setenv(client.SOCKET_ENV, str(path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv(client.JOB_ENV, "1")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    if case == "another user's process":
        monkeypatch.setattr(client, "_peer_uid", lambda connection: os.getuid() + 1, raising=False)
    elif case == "a directory others may enter":
        path.parent.chmod(0o755)
    assert client.delegate(["datasets"]) is None  # the listener answers nothing: the client runs it
    if case == "a worker of this user":
        assert [request["argv"] for request in requests] == [["datasets"]]  # the listener does receive
    else:
        assert requests == []
        assert f"not handing the command to {path}" in capfd.readouterr().err


def test_the_workflow_names_no_worker_to_its_jobs_unless_it_started_one(tmp_path, monkeypatch):
    """An LDPBENCH_WORKER that Snakemake inherited (from a shell, another campaign) is not passed on
    to the jobs: a dry run, like a campaign with the worker disabled or under SLURM, starts none."""
    monkeypatch.setenv(client.SOCKET_ENV, str(tmp_path / "elsewhere" / "worker.sock"))
    snakemake(tmp_path, small_config(), dryrun=True)
    assert client.SOCKET_ENV not in os.environ


# ----------------------------------------------------------------------------------------------------
# The worker's private directory


def start_under_a_parent(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """A process that starts a worker for itself, as Snakemake's onstart does, with the system's
    temporary directory in `tmp_path`: that process, the worker's pid and its directory."""
    probe = (
        "import os, sys, time\n"
        "from ldpbench.launch import fork_server\n"
        f"process, socket_path = fork_server.start(os.getpid(), {str(tmp_path / 'fork_server.log')!r})\n"
        "print(process.pid, socket_path, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)})
    pid, socket_path = parent.stdout.readline().split()
    directory = Path(socket_path).parent
    assert directory.parent == tmp_path and directory.is_dir()
    return parent, int(pid), directory


def wait_ended(pid: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while processes.process(pid) is not None:
        assert time.monotonic() < deadline, f"process {pid} still there after {seconds} s"
        time.sleep(0.05)


@pytest.fixture
def short_tmp():
    """A temporary directory with a short path: a Unix socket's path holds at most 107 bytes, and a probe
    of a socket whose path is longer cannot tell whether anything listens (pytest's own can be long)."""
    directory = Path(tempfile.mkdtemp(prefix="w", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_worker_removes_its_directory_when_snakemake_is_killed(short_tmp):
    tmp_path = short_tmp
    parent, pid, directory = start_under_a_parent(tmp_path)
    parent.kill()  # SIGKILL: no onsuccess, no onerror
    parent.wait()
    try:
        wait_ended(pid)
    except AssertionError:
        client.send_signal(pid, signal.SIGKILL)
        raise
    assert not directory.exists()


def test_a_worker_start_removes_the_directories_of_ended_campaigns_only(short_tmp, monkeypatch):
    """Where Snakemake and its worker were both killed, the next campaign's worker start removes their
    directory; never one whose campaign may live on."""
    tmp_path = short_tmp
    parent, pid, killed = start_under_a_parent(tmp_path)
    try:
        os.kill(pid, signal.SIGKILL)  # the worker first, then its Snakemake: nobody removes the directory
        wait_ended(pid)
    finally:
        parent.kill()
        parent.wait()
    assert killed.exists()
    me = processes.process(os.getpid())
    ended = killed.name.split("-")[1:3]  # the killed campaign's Snakemake
    kept, removed = {}, {"killed": killed}
    for name, owner, mode in [("reused pid", [me.pid, me.started + 1], 0o700),  # this pid, another process
                              ("live", [me.pid, me.started], 0o700),
                              ("listening", ended, 0o700),  # a worker still stopping, or out of sight
                              ("open", ended, 0o755)]:  # not made by a worker start
        directory = tmp_path / "-".join(["ldpbench", *map(str, owner), name.replace(" ", "_")])
        directory.mkdir(mode=mode)
        (removed if name == "reused pid" else kept)[name] = directory
    kept["not a worker's"] = tmp_path / "ldpbench-notes"
    kept["not a worker's"].mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(kept["listening"] / "worker.sock"))
    listener.listen(1)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    try:
        started = fork_server.start(os.getpid(), tmp_path / "worker.log")
        assert started is not None
        fork_server.stop(*started)
    finally:
        listener.close()
    assert {name: directory.exists() for name, directory in {**kept, **removed}.items()} == {
        **{name: True for name in kept}, **{name: False for name in removed}}
