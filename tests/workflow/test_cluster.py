"""Cluster execution: the SLURM profile, sharding invariance, and a real one-node SLURM cluster.

The SLURM test starts munged + slurmctld + slurmd on localhost (tests/slurm_cluster.py), runs a
small campaign through profiles/slurm and compares its tables with a local run of the
same campaign. Where SLURM cannot start (not installed, not root, a real site's slurm.conf), it is
skipped with the reason; `pytest -ra` prints it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ldpbench.layout import stored_summaries

from slurm_cluster import LocalSlurm, SlurmUnavailable
from workflow_cli import PROFILE, comparable, environment, run_snakemake, small_config

pytestmark = pytest.mark.integration

# What a cluster without accounting (the CI one) needs on top of the site-neutral profile; see
# ../shared/reference/environment.md. A real site with sacct keeps the plugin's defaults.
CI_SITE = {
    "slurm-status-command": "squeue",      # sacct fails without accounting, and the run would hang
    "slurm-no-account": True,
    "slurm-init-seconds-before-status-checks": 1,
    "seconds-between-status-checks": 1,
    "slurm-keep-successful-logs": True,    # the test reads the job logs
}


def tables(workdir: Path) -> dict[str, pd.DataFrame]:
    directory = workdir / "results" / "tiny" / "tables"
    return {name: pd.read_parquet(directory / f"{name}.parquet") for name in ("runs", "summary")}


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory) -> Path:
    """The campaign run locally (one Snakemake job per cell): the numbers every schedule must match."""
    workdir = tmp_path_factory.mktemp("local")
    result = run_snakemake(workdir, small_config(), "--cores", "2")
    assert result.returncode == 0, result.stdout[-5000:]
    return workdir


def test_profile_entries_are_commented_and_the_dag_builds_with_it(tmp_path):
    lines = (PROFILE / "profile.yaml").read_text().splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^[a-z][a-z-]*:", line):  # a top-level entry: a comment must precede it
            above = [l for l in lines[:index] if l.strip()][-1]
            assert above.lstrip().startswith("#"), f"profile entry without a comment: {line}"
    settings = yaml.safe_load((PROFILE / "profile.yaml").read_text())
    assert settings["executor"] == "slurm" and settings["retries"] >= 1
    assert settings["groups"] == {"run_cell": "runs"} and settings["group-components"]["runs"] > 1
    assert {"run_cell", "prepare_dataset", "features"} <= set(settings["set-resources"])
    # SLURM's logs with the campaign's, failed jobs' logs kept, an efficiency report, requeue on node failure.
    assert settings["slurm-logdir"] == "logs/slurm" and settings["slurm-keep-successful-logs"] is False
    assert settings["slurm-efficiency-report"] is True and settings["slurm-requeue"] is True
    # The profile parses (attempt expressions included) and the DAG builds through it.
    result = run_snakemake(tmp_path, small_config(), "--workflow-profile", str(PROFILE), "--dry-run")
    assert result.returncode == 0, result.stdout[-5000:]
    assert "mem_mb=2000" in result.stdout  # set-resources for rule run_cell, attempt 1


@pytest.mark.parametrize("profile", [None, PROFILE])
def test_local_run_jobs_run_in_threads_not_in_spawned_snakemakes(tmp_path, profile):
    """The plan jobs (`run:` rules) of a run without a profile option (profiles/default) and of the
    SLURM profile run in Snakemake's own process: a spawned Snakemake per job parses the workflow
    again for every job, which was most of the default campaign's wall time."""
    options = ["--workflow-profile", str(profile), "--executor", "local"] if profile else []
    result = run_snakemake(tmp_path, small_config(), *options, "--cores", "1", "--until", "plan", "--verbose")
    assert result.returncode == 0, result.stdout[-5000:]
    assert (tmp_path / "results" / "tiny" / "plans").is_dir()
    assert "spawned job" not in result.stdout, "a run: job was spawned into its own Snakemake"


@pytest.mark.slow
def test_one_shard_gives_the_numbers_of_many(local_reference, tmp_path):
    """All runs of the campaign in one `ldpbench run-cell` process equal the per-cell jobs' runs."""
    manifest = json.loads((local_reference / "results" / "tiny" / "manifest.json").read_text())
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"cell_id": "shard", "phase": "final", "runs": manifest["runs"]}))
    prepared = local_reference / "prepared" / "syn-S-0.1-0.9"
    shard = tmp_path / "runs"
    subprocess.run([sys.executable, "-m", "ldpbench", "run-cell", "--cell", str(plans), "--prepared",
                    str(prepared), "--runs-root", str(shard), "--marker", str(tmp_path / "marker.json")],
                   env=environment(), check=True, capture_output=True, timeout=300)
    one_shard = pd.concat([pd.read_parquet(p) for p in stored_summaries(shard)])
    reference = tables(local_reference)["runs"]
    assert len(one_shard) == len(reference) == len(manifest["runs"])
    pd.testing.assert_frame_equal(comparable(one_shard),
                                  comparable(reference[[c for c in one_shard.columns]]))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    slurm = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        slurm.start()
    except SlurmUnavailable as error:
        pytest.skip(f"SLURM cannot start here: {error}")
    yield slurm
    slurm.stop()


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("software", [
    "venv", pytest.param("conda", marks=pytest.mark.skipif(shutil.which("conda") is None, reason=(
        "no conda on this machine: the conda-environment variant of the SLURM run needs it")))])
def test_campaign_through_slurm_matches_local_run(cluster, local_reference, tmp_path, software):
    """The recipe of docs/cluster.md: the jobs run ldpbench from the venv Snakemake runs in, or (where
    conda is installed) from the rules' conda environment (workflow/envs/ldpbench.yaml)."""
    deployment = []
    if software == "conda":
        deployment = ["--software-deployment-method", "conda", "--conda-prefix", str(tmp_path / "conda")]
    settings = yaml.safe_load((PROFILE / "profile.yaml").read_text())
    settings.update(CI_SITE)
    settings["cores"] = 2                          # the test node has 2 CPUs
    settings["group-components"] = {"runs": 2}     # 5 cells -> 3 group jobs: many shards
    workdir = tmp_path / "work"
    # The profile's logs/slurm is relative to where Snakemake starts (here the repository), not to -d.
    settings["slurm-logdir"] = str(workdir / "logs" / "slurm")
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "profile.yaml").write_text(yaml.safe_dump(settings))

    started = time.perf_counter()
    # Creating the conda environment (Python from conda-forge, ldpbench's dependencies from PyPI) takes minutes.
    result = run_snakemake(workdir, small_config(), "--workflow-profile", str(profile), *deployment,
                           timeout=3600 if deployment else 600)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-8000:]

    submitted = re.findall(r"submitted with SLURM jobid (\d+) \(log: ([^)]+)\)", result.stdout)
    logs = {Path(log) for _, log in submitted}
    assert all(workdir / "logs" / "slurm" in log.parents for log in logs)  # the profile's slurm-logdir
    group_logs = [log for log in logs if log.parent.name.startswith("group_runs")]
    print(f"\nSLURM campaign: {len(submitted)} SLURM jobs ({len(group_logs)} run groups), wall {wall:.1f} s")
    # 3 groups + prepare_dataset (the final cells audit what they ran inside their group jobs)
    assert len(group_logs) == 3 and len(submitted) == 4
    # Every cell ran inside a SLURM job: its `ldpbench run-cell` appears in a group job's log.
    manifest = json.loads((workdir / "results" / "tiny" / "manifest.json").read_text())
    job_text = "\n".join(log.read_text() for log in group_logs)
    for cell in {run["cell_id"] for run in manifest["runs"]}:
        assert f"plans/{cell}.json" in job_text, f"cell {cell} did not run through sbatch"
    if deployment:  # each job ran in the rules' environment, not in the venv
        assert "Activating conda environment" in job_text, job_text[-5000:]
    # Aggregation, report and tracking are localrules: never submitted.
    assert not any(re.search(r"rule_(aggregate|report|track|manifest|audit_table)", str(log)) for log in logs)

    slurm_tables, local_tables = tables(workdir), tables(local_reference)
    assert slurm_tables["runs"]["run_id"].is_unique and len(slurm_tables["runs"]) == 10
    pd.testing.assert_frame_equal(comparable(slurm_tables["summary"]), comparable(local_tables["summary"]))
    pd.testing.assert_frame_equal(comparable(slurm_tables["runs"].drop(columns=["cell_id"])),
                                  comparable(local_tables["runs"].drop(columns=["cell_id"])))
