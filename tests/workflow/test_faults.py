"""Faults a campaign must survive: a SIGKILLed job, a corrupt result file, failing jobs, hostile
configuration values. The workflow runs through the SLURM profile with the local executor, so the
profile's own retry / rerun-incomplete / show-failed-logs settings are what is tested."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from ldpbench.launch.processes import is_snakemake
from ldpbench.layout import ATTEMPT_MARK, stored_summaries

from workflow_cli import PROFILE, comparable, environment, run_snakemake, small_config, snakemake_command

pytestmark = pytest.mark.integration

# Values with shell metacharacters: if any reached a shell unquoted, a PWNED file would appear.
HOSTILE_RESULTS = "res $(touch PWNED-subst) `touch PWNED-tick`; touch PWNED-semi 'q\""
HOSTILE_EXPERIMENT = "exp $(touch PWNED-exp); 'quoted' \"double\" & echo"
LOCAL = ("--workflow-profile", str(PROFILE), "--executor", "local", "--cores", "2")


def hostile_config(prepared: Path, **kwargs) -> dict:
    config = small_config(prepared_dir=prepared, **kwargs)
    config["results_dir"] = HOSTILE_RESULTS
    config["tracking"] = {"uri": "sqlite:///mlflow.db", "experiment": HOSTILE_EXPERIMENT}
    return config


def tables(workdir: Path, results: str = HOSTILE_RESULTS, campaign: str = "tiny") -> dict[str, pd.DataFrame]:
    directory = workdir / results / campaign / "tables"
    return {name: pd.read_parquet(directory / f"{name}.parquet") for name in ("runs", "summary")}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """One prepared dataset for every workflow run of this module (an absolute path)."""
    return tmp_path_factory.mktemp("prepared")


@pytest.fixture(scope="module")
def completed(tmp_path_factory, prepared) -> Path:
    """The reference: the small campaign run to completion, uninterrupted, hostile names and all."""
    workdir = tmp_path_factory.mktemp("completed")
    result = run_snakemake(workdir, hostile_config(prepared), *LOCAL)
    assert result.returncode == 0, result.stdout[-5000:]
    return workdir


@pytest.mark.slow
def test_shell_metacharacters_in_config_values_never_reach_a_shell(completed):
    assert not list(completed.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    runs = tables(completed)["runs"]
    assert len(runs) == 10 and (runs["status"] == "ok").all()
    # The hostile strings were used literally: as a directory name and as the experiment name.
    marker = json.loads((completed / HOSTILE_RESULTS / "tiny" / "tracking" / "mlflow.json").read_text())
    summary = tables(completed)["summary"]
    # The campaign, its configurations, a curve across ε per dataset, model and private label, its runs.
    curve_runs = summary[summary["epsilon"] != float("inf")].groupby(["dataset", "model", "label"]).ngroups
    assert len(marker["runs"]) == 1 + len(summary) + curve_runs + len(runs)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{completed / 'mlflow.db'}")
    assert client.get_experiment_by_name(HOSTILE_EXPERIMENT) is not None


@pytest.mark.slow
def test_sigkilled_job_resumes_from_its_checkpoint_and_each_run_appears_once(tmp_path, prepared, completed):
    # Longer runs (20 epochs, checkpoint every 100 rounds) so that the kill lands inside a cell,
    # with one run finished and the next one part-way, checkpointed.
    config = hostile_config(prepared, seeds=(0, 1, 2))
    config["training"].update(epochs=20, eval_every=100, checkpoint_every=100)
    campaign = tmp_path / HOSTILE_RESULTS / "tiny"
    runs_root, checkpoints = campaign / "runs", campaign / "checkpoints"

    def finished() -> set[str]:
        summaries = runs_root.glob("summaries/*/*/*/run_id=*/summary.parquet")
        return {p.parent.name.removeprefix("run_id=") for p in summaries}

    def interrupted() -> set[str]:
        return {p.stem for p in checkpoints.glob("*.pt")} - finished()

    process = subprocess.Popen(snakemake_command(tmp_path, config, *LOCAL), env=environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (finished() and interrupted()):
            assert process.poll() is None, "the workflow ended before the kill"
            assert time.monotonic() < deadline, "no run finished and none checkpointed within 300 s"
            time.sleep(0.02)
    finally:
        # The whole process group, as when a node dies: Snakemake and its jobs, no cleanup.
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    finished_before = {p.parent.name.removeprefix("run_id="): (p, p.stat().st_mtime_ns, pd.read_parquet(p))
                       for p in runs_root.glob("summaries/*/*/*/run_id=*/summary.parquet")}
    resumable = interrupted()
    assert finished_before and resumable and len(finished_before) < 5 * 3  # 5 cells x 3 seeds

    # A killed Snakemake leaves its lock: the documented recovery is --unlock, then the same
    # command again (the profile's rerun-incomplete recomputes the interrupted cell).
    assert run_snakemake(tmp_path, config, *LOCAL, "--unlock").returncode == 0
    result = run_snakemake(tmp_path, config, *LOCAL)
    assert result.returncode == 0, result.stdout[-5000:]
    manifest = json.loads((campaign / "manifest.json").read_text())
    runs = tables(tmp_path)["runs"]
    assert len(manifest["runs"]) == 5 * 3
    assert runs["run_id"].is_unique and set(runs["run_id"]) == {r["run_id"] for r in manifest["runs"]}
    assert (runs["status"] == "ok").all() and (runs["rounds"] == runs["rounds_planned"]).all()
    # The runs finished before the kill were kept in the run store (an interrupted cell keeps its
    # finished runs): not trained again, the same files, and the tables hold their numbers.
    for run_id, (path, mtime, before) in finished_before.items():
        assert path.stat().st_mtime_ns == mtime
        assert runs.loc[runs["run_id"] == run_id, "test_accuracy"].item() == before["test_accuracy"].item()
    # The interrupted runs are complete now (the engine resumes them from checkpoints/<run_id>.pt;
    # it does not log that it did, so the resume itself is the engine tests' to check).
    assert resumable <= set(runs["run_id"])
    # The killed attempts' directories were removed when their cells ran again.
    assert not list(runs_root.glob(f".attempts/cell=*{ATTEMPT_MARK}*"))


@pytest.mark.slow
def test_corrupt_result_file_is_reported_with_its_path_and_recomputed(tmp_path, prepared, completed):
    workdir = tmp_path / "campaign"
    shutil.copytree(completed, workdir, symlinks=True)
    reference = tables(workdir)
    victim = sorted((workdir / HOSTILE_RESULTS / "tiny" / "runs").glob("summaries/*/*/*/run_id=*/summary.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:100])  # a torn write: only the first 100 bytes
    config = hostile_config(prepared)
    # Snakemake cannot see a change inside a cell directory; aggregation verifies every run file
    # whenever it runs (any campaign change, or --forcerun aggregate as here).
    failed = run_snakemake(workdir, config, *LOCAL, "--forcerun", "aggregate")
    assert failed.returncode != 0
    assert str(victim.relative_to(workdir)) in failed.stdout and "cannot be read" in failed.stdout
    assert "Run the workflow again to recompute them" in failed.stdout
    # ... and that is how the run ends: aggregation is not retried (the profile retries failed jobs), which
    # would wait for the cell marker it removed and end on a missing-file error instead.
    assert "Trying to restart job" not in failed.stdout and "Missing files after" not in failed.stdout
    assert not victim.exists() and list((workdir / HOSTILE_RESULTS / "tiny" / "quarantine").iterdir())

    rerun = run_snakemake(workdir, config, *LOCAL)
    assert rerun.returncode == 0, rerun.stdout[-5000:]
    assert victim.exists()
    after = tables(workdir)
    assert after["runs"]["run_id"].is_unique and len(after["runs"]) == len(reference["runs"])
    pd.testing.assert_frame_equal(comparable(after["summary"]), comparable(reference["summary"]))


FAULT_HOOK = '''
import os
_fault_dir = os.environ.get("LDPBENCH_TEST_FAULT_DIR")
if _fault_dir:  # in every process that runs ldpbench commands: a job's own, or the worker its job hands it to
    import ldpbench.cli as _cli
    from ldpbench.errors import LdpbenchError
    _run = _cli._run

    def _faulty(args):
        if args.command == "run-cell":
            with open(os.path.join(_fault_dir, "attempts"), "a") as attempts:
                attempts.write("attempt\\n")
            with open(os.path.join(_fault_dir, "attempts")) as attempts:
                attempt = len(attempts.read().splitlines())
            mode = open(os.path.join(_fault_dir, "mode")).read().strip()
            if mode == "always" or (mode == "once" and attempt == 1):
                def fail(_args):
                    raise LdpbenchError(f"INJECTED FAILURE (test fault hook), attempt {attempt}")
                args.func = fail
        return _run(args)

    _cli._run = _faulty
'''


def _fault_env(tmp_path: Path, mode: str) -> tuple[dict, Path]:
    """`ldpbench run-cell` fails (once or always), once it has started (its job recorded), through a
    sitecustomize hook, so the production code carries no test hook."""
    hook_dir, fault_dir = tmp_path / "hook", tmp_path / "fault"
    hook_dir.mkdir()
    fault_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(FAULT_HOOK)
    (fault_dir / "mode").write_text(mode)
    return environment(hook_dir, LDPBENCH_TEST_FAULT_DIR=str(fault_dir)), fault_dir / "attempts"


@pytest.mark.slow
def test_failing_job_is_retried_with_more_memory(tmp_path, prepared):
    env, attempts = _fault_env(tmp_path, "once")
    config = small_config(prepared_dir=prepared, seeds=(0,), mechanisms=("pm",), epsilons=(1,))
    config["tracking"]["enabled"] = False
    result = run_snakemake(tmp_path / "work", config, *LOCAL, env=env)
    assert result.returncode == 0, result.stdout[-5000:]
    assert attempts.read_text().count("attempt") == 2
    assert "INJECTED FAILURE" in result.stdout and "Trying to restart job" in result.stdout
    # The profile grows memory per attempt: 2000 MB at attempt 1, 4000 MB at attempt 2.
    assert "mem_mb=2000" in result.stdout and "mem_mb=4000" in result.stdout
    assert len(pd.read_parquet(tmp_path / "work" / "results" / "tiny" / "tables" / "runs.parquet")) == 1


def test_deterministic_failure_stops_with_the_job_log_shown(tmp_path, prepared):
    env, attempts = _fault_env(tmp_path, "always")
    config = small_config(prepared_dir=prepared, seeds=(0,), mechanisms=("pm",), epsilons=(1,))
    config["tracking"]["enabled"] = False
    result = run_snakemake(tmp_path / "work", config, *LOCAL, env=env)
    assert result.returncode != 0
    assert attempts.read_text().count("attempt") == 3  # retries: 2 in the profile
    # show-failed-logs: the job's log (its stderr) is printed in Snakemake's output.
    assert "INJECTED FAILURE (test fault hook), attempt 3" in result.stdout
    assert "logs/tiny/runs/" in result.stdout
    assert not (tmp_path / "work" / "results" / "tiny" / "tables").exists()
    # ldpbench status: failed, naming the failing job and its log, and Snakemake's own log.
    status = subprocess.run([sys.executable, "-m", "ldpbench", "status", str(tmp_path / "work" / "results" / "tiny")],
                            capture_output=True, text=True, env=environment())
    assert status.returncode == 0, status.stderr
    assert ": failed" in status.stdout and "Snakemake's log: " in status.stdout
    # The three attempts of the job (retries: 2) failed the same way, with one log: one line.
    [failed] = [line for line in status.stdout.splitlines() if line.lstrip().startswith("failed:") and
                "run-cell" in line]
    log = failed.split("(log: ")[1].rstrip(")")
    assert "/logs/tiny/runs/" in log and "INJECTED FAILURE (test fault hook), attempt 3" in Path(log).read_text()


@pytest.mark.slow
def test_a_cell_of_300_seeds_runs(tmp_path, prepared):
    # 300 plans are ~300 KB of JSON, above Linux's 128 KiB limit on one command-line argument:
    # the job reads them from the cell's plan file instead.
    config = small_config(prepared_dir=prepared, seeds=range(300), mechanisms=("pm",), epsilons=(1,),
                          rounds=1)
    config["tracking"]["enabled"] = False
    result = run_snakemake(tmp_path, config, "--cores", "1", "--until", "run_cell")
    assert result.returncode == 0, result.stdout[-5000:]
    summaries = stored_summaries(tmp_path / "results" / "tiny" / "runs")
    seeds = sorted(pd.read_parquet(path)["seed"].item() for path in summaries)
    assert seeds == list(range(300))


def _live_processes(session: int) -> dict[int, tuple[int, list[str]]]:
    """{pid: (parent pid, argv)} of the live (not zombie) processes of a session, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = [part.decode() for part in (entry / "cmdline").read_bytes().split(b"\0") if part]
        except OSError:
            continue
        state, parent, _, sid = stat[stat.rindex(")") + 2:].split()[:4]
        if int(sid) == session and state not in "ZXx":
            found[int(entry.name)] = (int(parent), argv)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the processes through /proc")
@pytest.mark.parametrize("victim", ["the job's shell wrapper", "Snakemake"])
def test_a_run_ends_when_its_workflow_is_killed_and_leaves_no_cell_behind(tmp_path, prepared, victim):
    config = small_config(prepared_dir=prepared, seeds=(0,), mechanisms=("pm",), epsilons=(1,))
    config["training"].update(epochs=200, eval_every=1000, checkpoint_every=20)  # minutes of work
    config["tracking"]["enabled"] = False
    campaign = tmp_path / "results" / "tiny"
    process = subprocess.Popen(snakemake_command(tmp_path, config, "--cores", "1"), env=environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list(campaign.glob("checkpoints/*.pt")):  # the run is well into training
            assert process.poll() is None, "the workflow ended before the kill"
            assert time.monotonic() < deadline, "the run wrote no checkpoint within 300 s"
            time.sleep(0.05)
        processes = _live_processes(process.pid)
        [run] = [pid for pid, (_, argv) in processes.items() if argv[1:5] == ["-P", "-m", "ldpbench", "run-cell"]]
        wrapper = processes[run][0]
        assert processes[wrapper][1][0].endswith("bash") and processes[wrapper][0] == process.pid
        os.kill(wrapper if victim == "the job's shell wrapper" else process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while run in _live_processes(process.pid):
            assert time.monotonic() < deadline, f"the run went on for 30 s after {victim} was killed"
            time.sleep(0.05)
        process.wait(timeout=120)
        # Neither a run, nor a cell's marker, nor the attempt's own directory is left to be picked up.
        assert not stored_summaries(campaign / "runs") and not list(campaign.glob("runs/.attempts/*"))
        assert not list(campaign.glob("cells/*/*/*.json"))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_snakemake_is_recognised_on_the_command_lines_that_start_it():
    assert is_snakemake(["/venv/bin/python", "-m", "snakemake", "-s", "Snakefile"])
    assert is_snakemake(["python3", "-X", "dev", "-u", "-m", "snakemake", "--target-jobs", "run:cell_id=ab"])
    assert is_snakemake(["/usr/bin/python3", "/venv/bin/snakemake", "--cores", "2"])
    assert is_snakemake(["/venv/bin/snakemake"])
    assert not is_snakemake(["/usr/bin/bash", "-c", "python -m snakemake"])
    assert not is_snakemake(["python", "-m", "pytest", "-m", "snakemake"])
    assert not is_snakemake(["python", "-m", "ldpbench", "run-cell", "--out", "snakemake"])
    assert not is_snakemake([])
