"""Drive the workflow as a user does: `python -m snakemake` in a process of its own, in a work directory.

A process (rather than Snakemake's Python API in pytest's) is what the cluster, fault and tracking tests
need: it runs through the SLURM profile, it sees the environment (fault injection, PYTHONPATH) exactly as a
job would, and several run at once. `run_snakemake` forks it from a server that imported Snakemake once
(fresh_processes.Snakemake); the tests that kill or interrupt a Snakemake spawn one (`snakemake_command`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from fresh_processes import Snakemake

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "slurm"
# Columns that measure time, not results; everything else must be identical across schedules.
TIMING_COLUMNS = {"train_seconds", "wall_seconds", "started_at", "finished_at", "train_seconds_mean"}
# The privacy audit of the test campaigns: every path of it, at a fiftieth of the default's reports.
TEST_AUDIT = {"samples": 20_000}


def small_config(name: str = "tiny", prepared_dir: str | Path = "prepared", seeds=(0, 1),
                 mechanisms=("np", "pm", "ps-pm"), epsilons=(1, 4), **training) -> dict:
    """A campaign of a few cells on the small synthetic set; relative paths unless given."""
    return {
        "campaign": name,
        "results_dir": "results",
        "data": {"raw_dir": "raw", "prepared_dir": str(prepared_dir), "mirror": None},
        "datasets": [{"name": "syn-S-0.1-0.9"}],
        "models": ["lr"],
        "mechanisms": [{"name": m} for m in mechanisms],
        "epsilons": list(epsilons),
        "seeds": list(seeds),
        "training": {"eval_every": 5, **training},
        "tracking": {"uri": "sqlite:///results/mlflow.db"},
        "audit": TEST_AUDIT,
    }


def tiny_config(root: Path, epsilons=(1, 4)) -> dict:
    """The default-like campaign in `root` (absolute paths): syn-S, optional Adult, NP/PM/PS-PM."""
    return {
        "campaign": "tiny",
        "results_dir": str(root / "results"),
        "data": {"raw_dir": str(root / "raw"), "prepared_dir": str(root / "prepared"),
                 "mirror": str(root / "no-mirror-here"), "allow_download": False},
        "datasets": [{"name": "syn-S-0.01-0.9"}, {"name": "adult", "optional": True}],
        "models": ["lr"],
        "mechanisms": [{"name": "np", "label": "NP"}, {"name": "pm", "label": "PM"},
                       {"name": "ps-pm", "label": "PS-PM"}],
        "epsilons": list(epsilons),
        "seeds": [0],
        "training": {"learning_rate": 0.1, "eval_every": 5},
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}"},
        "audit": TEST_AUDIT,
    }


# What the test process puts in its own environment, which a user's shell has not: pytest's variables (the
# running test, the xdist worker) and what importing polars sets (jemalloc's settings, to polars' default;
# MLflow's import imports polars). With them, the campaigns of each test, of each xdist worker, or those
# started after a test imported MLflow would key a warm seed of their own (fork_server.seed_key) and start
# cold.
SET_BY_IMPORTS = ("_RJEM_MALLOC_CONF",)


def from_test_process(name: str) -> bool:
    return name.startswith("PYTEST_") or name in SET_BY_IMPORTS


def environment(extra_path: str | Path | None = None, **variables: str) -> dict[str, str]:
    paths = [str(extra_path)] if extra_path else []
    paths += [str(REPO), os.environ.get("PYTHONPATH", "")]
    inherited = {name: value for name, value in os.environ.items() if not from_test_process(name)}
    return {**inherited, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            "MLFLOW_DISABLE_TELEMETRY": "true", **variables}


def snakemake(root: Path, config: dict, dryrun: bool = False, targets=(), cores: int = 2) -> None:
    """Run the workflow in-process through Snakemake's Python API (writes root/campaign.yaml), with the
    variables a command-line run gets (environment()) and without the test process's: its worker then keys
    the same warm seed. What the workflow itself sets or removes stays as it left it."""
    config_path = root / "campaign.yaml"
    config_path.write_text(yaml.safe_dump(config))
    added = {name: value for name, value in environment().items() if os.environ.get(name) != value}
    replaced = {name: os.environ.get(name) for name in added}
    popped = {name: os.environ.pop(name) for name in list(os.environ) if from_test_process(name)}
    os.environ.update(added)
    try:
        _run_api(root, config_path, dryrun, targets, cores)
    finally:
        for name, value in replaced.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        os.environ.update(popped)


def _run_api(root: Path, config_path: Path, dryrun: bool, targets, cores: int) -> None:
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        ExecutionSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
    )

    with SnakemakeApi(OutputSettings(quiet=None, dryrun=dryrun, show_failed_logs=True)) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=cores),
            config_settings=ConfigSettings(configfiles=[config_path]),
            storage_settings=StorageSettings(),
            snakefile=REPO / "Snakefile",
            workdir=root,
        )
        dag = workflow.dag(DAGSettings(targets=[str(target) for target in targets]))
        # use_threads: the local `run:` jobs in threads of this Snakemake, as `snakemake` runs them through
        # the workflow profile (profiles/default), which the API does not read; without it each spawns a
        # whole Snakemake.
        dag.execute_workflow(executor="dryrun" if dryrun else "local",
                             execution_settings=ExecutionSettings(latency_wait=5, use_threads=True))


def snakemake_command(workdir: Path, config: dict, *args: str) -> list[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "campaign.yaml").write_text(yaml.safe_dump(config))
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
            "--configfile", str(workdir / "campaign.yaml"), *args]


def start_snakemake(workdir: Path, config: dict, *args: str, output: Path, env: dict | None = None) -> Snakemake:
    """Start Snakemake on `config` in `workdir`, its stdout and stderr into the file `output`."""
    return start_snakemake_command(snakemake_command(workdir, config, *args), output, env)


def start_snakemake_command(command: list[str], output: Path, env: dict | None = None,
                            cwd: Path | None = None) -> Snakemake:
    """Start `command`, a `python -m snakemake ...` command line, forked from the server that imported
    Snakemake (fresh_processes.Snakemake), its stdout and stderr into the file `output`."""
    assert command[:3] == [sys.executable, "-m", "snakemake"], command
    return Snakemake(command[3:], env or environment(), output, cwd=cwd)


def run_snakemake(workdir: Path, config: dict, *args: str, env: dict | None = None,
                  timeout: float = 600) -> subprocess.CompletedProcess:
    """Run Snakemake to completion; returns the process with stdout+stderr in `.stdout`."""
    return run_snakemake_command(snakemake_command(workdir, config, *args), env=env, timeout=timeout)


def run_snakemake_command(command: list[str], env: dict | None = None, timeout: float = 600,
                          cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `command`, a `python -m snakemake ...` command line, to completion as start_snakemake_command
    starts it; returns the process with stdout+stderr in `.stdout`."""
    with tempfile.NamedTemporaryFile("r", prefix="snakemake-", suffix=".out") as output:
        process = start_snakemake_command(command, Path(output.name), env, cwd)
        try:
            code = process.wait(timeout)
        finally:
            process.kill()
        return subprocess.CompletedProcess(process.arguments, code, stdout=output.read())


def comparable(frame: pd.DataFrame, key: str = "run_id") -> pd.DataFrame:
    """The table without timing columns, in a stable row order, for exact comparison."""
    kept = frame[[c for c in frame.columns if c not in TIMING_COLUMNS]]
    sort = [key] if key in kept.columns else [c for c in ("dataset", "model", "label", "epsilon")
                                              if c in kept.columns]
    return kept.sort_values(sort).reset_index(drop=True)
