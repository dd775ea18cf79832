"""A local run of the workflow starts no timed wake-up of Snakemake's scheduler: onstart switches the job
rate limit off (ldpbench/snakemake_compat.py says why), and with the limit on, every scheduling pass
that finds jobs waiting starts one more `threading.Timer` (one more chain of wake-ups a second).

The runs are in-process, through Snakemake's API, as `snakemake --cores 1` runs them from the command
line: its default rate limit (the API's default is none) and `run:` jobs in threads (profiles/default).
They run the planning jobs of a campaign of a dozen cells (a plan file per cell, then the manifest),
which need no dataset, and count the timers started.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml

from ldpbench import snakemake_compat
from ldpbench.errors import UnsupportedSnakemake
from ldpbench.layout import CampaignLayout

from workflow_cli import REPO, small_config

pytestmark = pytest.mark.integration


def cli_rate_limit():
    """The job rate limit `snakemake` gets without --max-jobs-per-timespan."""
    from snakemake.cli import get_argument_parser
    from snakemake.settings.types import MaxJobsPerTimespan

    return MaxJobsPerTimespan.parse_choice(get_argument_parser().get_default("max_jobs_per_timespan"))


def planning_run(root: Path, dryrun: bool = False) -> int:
    """Run the planning jobs of a campaign of a dozen cells in `root`; returns how many jobs ran (the plan
    files and the manifest written)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        ExecutionSettings,
        OutputSettings,
        ResourceSettings,
        SchedulingSettings,
        StorageSettings,
    )

    config = {**small_config(epsilons=(0.5, 1, 2, 4, 8)), "worker": {"enabled": False}}
    config_path = root / "campaign.yaml"
    config_path.write_text(yaml.safe_dump(config))
    manifest = CampaignLayout(config["results_dir"], config["campaign"]).manifest
    with SnakemakeApi(OutputSettings(quiet=None, dryrun=dryrun)) as api:
        workflow = api.workflow(resource_settings=ResourceSettings(cores=1),
                                config_settings=ConfigSettings(configfiles=[config_path]),
                                storage_settings=StorageSettings(), snakefile=REPO / "Snakefile", workdir=root)
        dag = workflow.dag(DAGSettings(targets=[str(manifest)]))
        dag.execute_workflow(executor="dryrun" if dryrun else "local",
                             execution_settings=ExecutionSettings(use_threads=True),
                             scheduling_settings=SchedulingSettings(max_jobs_per_timespan=cli_rate_limit()))
    return len(list((root / manifest.parent / "plans").glob("*.json"))) + (root / manifest).exists()


@pytest.fixture
def timers(monkeypatch) -> list[float]:
    """The delays of the `threading.Timer`s started from now on (Snakemake's scheduler starts its timed
    wake-ups with `threading.Timer`, and nothing else in these runs starts one)."""
    started = []

    class CountedTimer(threading.Timer):
        def start(self):
            started.append(self.interval)
            super().start()

    monkeypatch.setattr(threading, "Timer", CountedTimer)
    return started


def test_a_local_run_starts_no_timed_wakeup(tmp_path, timers):
    assert planning_run(tmp_path) > 10
    assert timers == []


def test_with_the_limit_on_every_pass_that_finds_jobs_waiting_starts_a_wakeup(tmp_path, timers, monkeypatch):
    """The power check: what onstart prevents. With one core, each job is started by a pass that found it
    waiting; every such pass starts a timer, and each timer's pass starts another while jobs wait."""
    monkeypatch.setattr(snakemake_compat, "switch_off_local_rate_limit", lambda workflow: False)
    jobs = planning_run(tmp_path)
    assert jobs > 10 and len(timers) >= jobs and set(timers) == {cli_rate_limit().timespan}


def test_a_snakemake_without_an_attribute_the_workflow_uses_fails_at_parse_time_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(snakemake_compat.WORKFLOW_ATTRIBUTES, "renamed_attribute", "what a rename looks like")
    monkeypatch.setitem(snakemake_compat.NEEDED, "workflow.renamed_attribute", "what a rename looks like")
    with pytest.raises(Exception) as error:
        planning_run(tmp_path, dryrun=True)
    cause = error.value if isinstance(error.value, UnsupportedSnakemake) else error.value.__cause__
    assert isinstance(cause, UnsupportedSnakemake), repr(error.value)
    assert "workflow.renamed_attribute: what a rename looks like" in str(cause)
    assert not (tmp_path / "results").exists()
