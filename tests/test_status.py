"""`ldpbench status`: the state of the workflow, runs done, running and pending, the other steps,
throughput and time left, from the files of a campaign and the records of its processes."""

import datetime as dt
import json
import os
import subprocess
import sys
import time

import pytest

from ldpbench import progress
from ldpbench.launch import processes
from ldpbench.layout import ATTEMPT_FILE, CampaignLayout, attempt_dir, run_file
from ldpbench.status import campaign_status, format_status

NOW = float(int(time.time()))  # whole seconds, as the records write their times


def iso(seconds_ago: float) -> str:
    return dt.datetime.fromtimestamp(NOW - seconds_ago, dt.UTC).isoformat(timespec="seconds")


def dead_identity() -> dict:
    """The identity of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return {**processes.identity(), "pid": process.pid}


def write_run(layout: CampaignLayout, phase: str, run_id: str, seconds_ago: float) -> None:
    summary = run_file(layout.runs_dir, "summaries", "syn", "pm", phase, run_id)
    summary.parent.mkdir(parents=True)
    summary.write_bytes(b"not read: only its time counts")
    os.utime(summary, (NOW - seconds_ago, NOW - seconds_ago))


def write_plan(layout: CampaignLayout, cell_id: str, run_ids: list[str]) -> None:
    layout.plans_dir.mkdir(parents=True, exist_ok=True)
    layout.plan(cell_id).write_text(json.dumps({"cell_id": cell_id, "runs": [{"run_id": r} for r in run_ids]}))


def write_workflow(layout: CampaignLayout, state: str = progress.RUNNING, identity: dict | None = None) -> None:
    cells = {"t1": {"phase": "trial", "dataset": "syn", "mechanism": "pm", "runs": 2},
             "t2": {"phase": "trial", "dataset": "syn", "mechanism": "pm", "runs": 2},
             "f1": {"phase": "final", "dataset": "syn", "mechanism": "pm", "runs": 3}}
    layout.progress_dir.mkdir(parents=True, exist_ok=True)
    (layout.progress_dir / progress.WORKFLOW_FILE).write_text(json.dumps({
        **(identity or processes.identity()), "state": state, "started_at": iso(60), "ended_at": None,
        "log": "/work/.snakemake/log/x.log", "cells": cells}))


def write_job(layout: CampaignLayout, name: str, record: dict) -> None:
    jobs = layout.progress_dir / progress.JOBS_DIR
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{name}.json").write_text(json.dumps({"what": "", "log": None, "progress": None, **record}))


@pytest.fixture
def campaign(tmp_path):
    """A tuned campaign a minute into its trials: trial cell t1 done (its runs 30 and 20 s ago, one of
    them stored before this workflow started), t2 computing (one run done, one training), a stale
    attempt of a killed job, the final cell's runs not known yet (its plan waits for the selection)."""
    layout = CampaignLayout(tmp_path / "results", "tiny")
    write_workflow(layout)
    write_plan(layout, "t1", ["r1", "r2"])
    write_plan(layout, "t2", ["r3", "r4"])
    write_run(layout, "trial", "r1", 30)
    write_run(layout, "trial", "r2", 120)  # stored by an earlier workflow: not this one's throughput
    layout.cell_marker("syn", "pm", "t1").parent.mkdir(parents=True)
    layout.cell_marker("syn", "pm", "t1").write_text("{}")
    write_run(layout, "trial", "r3", 10)
    attempt = attempt_dir(layout.runs_dir, "t2", os.getpid(), "ab12")
    attempt.mkdir(parents=True)
    (attempt / ATTEMPT_FILE).write_text(json.dumps({**processes.identity(), "training": ["r4"]}))
    stale = attempt_dir(layout.runs_dir, "t9", 1, "cd34")
    stale.mkdir()
    (stale / ATTEMPT_FILE).write_text(json.dumps({**dead_identity(), "training": ["r9"]}))
    write_job(layout, "cell", {**processes.identity(), "step": "run-cell", "what": "PM (tuning trials)",
                               "state": progress.RUNNING})
    return layout


def test_a_running_tuned_campaign_before_its_selection(campaign):
    status = campaign_status(campaign.root, now=NOW)
    [trials, final] = status.stages
    assert status.state == "running"
    assert (trials.planned, trials.done, trials.running, trials.pending) == (4, 3, 1, 0)
    assert (final.planned, final.done, final.running, final.pending) == (3, 0, 0, 3)
    assert (status.jobs_running, status.stale_attempts) == (1, 1)
    assert status.finished_in_window == 2 and status.window_seconds == pytest.approx(60)
    text = format_status(status, now=NOW)
    assert "running, started 1 min 00 s ago" in text
    assert "tuning trials:  3 of 4 done, 1 running, 0 pending" in text
    assert "final runs:     0 of 3 done, 0 running, 3 pending" in text
    assert "2.0 runs/min (2 runs in the last 1 min 00 s)" in text
    assert "1 attempt(s) of processes not alive here" in text


def test_the_time_left_is_what_remains_at_the_rate_of_the_window(campaign):
    status = campaign_status(campaign.root, now=NOW)
    assert status.remaining == 1 + 3 and status.seconds_left == pytest.approx(4 / (2 / 60))
    assert "about 2 min 00 s for 4 runs at that rate" in format_status(status, now=NOW)
    # A shorter window sees only the last runs: 1 in 15 s.
    recent = campaign_status(campaign.root, window=15, now=NOW)
    assert recent.finished_in_window == 1 and recent.seconds_left == pytest.approx(4 * 15)


def test_steps_that_are_not_runs_show_their_progress_and_eta(campaign):
    write_job(campaign, "features", {**processes.identity(), "step": "features", "what": "ag_news/minilm",
                                     "state": progress.RUNNING,
                                     "progress": {"done": 12000, "total": 50000, "unit": "texts", "seconds_left": 90}})
    write_job(campaign, "prepare", {**dead_identity(), "step": "prepare", "what": "adult", "state": "ok"})
    text = format_status(campaign_status(campaign.root, now=NOW), now=NOW)
    assert "running:        features ag_news/minilm: 24 % (12,000 of 50,000 texts), about 1 min 30 s left" in text
    assert "steps done:     prepare" in text and "jobs:           2 running on this machine" in text


def test_complete_only_once_the_workflow_has_ended_successfully(campaign, capsys):
    for run_id in ("r4", "f1", "f2", "f3"):
        write_run(campaign, "trial" if run_id == "r4" else "final", run_id, 5)
    write_plan(campaign, "f1", ["f1", "f2", "f3"])
    for cell in ("t2", "f1"):
        campaign.cell_marker("syn", "pm", cell).write_text("{}")
    status = campaign_status(campaign.root, now=NOW)
    # Every run is done, but the report and tracking are still running: not complete yet.
    assert status.remaining == 0 and not status.complete
    assert "every run is done; the steps after them are running" in format_status(status, now=NOW)
    progress.workflow_ends(campaign.progress_dir, True, "/work/.snakemake/log/x.log")
    status = campaign_status(campaign.root, now=NOW)
    assert status.complete and "complete:       the workflow ended successfully" in format_status(status, now=NOW)
    # --watch prints until the campaign has ended: here once.
    from ldpbench.cli import main

    assert main(["status", str(campaign.root), "--watch", "0.01"]) == 0
    assert capsys.readouterr().out.count("complete:") == 1


def test_a_failed_workflow_names_its_failed_jobs_and_their_logs(campaign):
    write_job(campaign, "cell", {**dead_identity(), "step": "run-cell", "what": "PM (tuning trials)",
                                 "state": progress.FAILED, "log": "/w/logs/tiny/runs/t2.log"})
    progress.workflow_ends(campaign.progress_dir, False, "/w/.snakemake/log/x.log")
    text = format_status(campaign_status(campaign.root, now=NOW), now=NOW)
    assert "campaign 'tiny'" in text and ": failed" in text
    assert "failed:         run-cell PM (tuning trials) (log: /w/logs/tiny/runs/t2.log)" in text
    assert "Snakemake's log: /w/.snakemake/log/x.log" in text


def test_a_workflow_whose_snakemake_is_gone_is_stopped_and_a_reused_pid_is_not_alive(campaign):
    write_workflow(campaign, identity=dead_identity())
    assert campaign_status(campaign.root, now=NOW).state == "stopped"
    # The same pid started at another time is another process (a reused pid): not alive.
    write_workflow(campaign, identity={**processes.identity(), "pid_started": processes.identity()["pid_started"] + 1})
    assert campaign_status(campaign.root, now=NOW).state == "stopped"
    assert "stopped:        its Snakemake is gone" in format_status(campaign_status(campaign.root, now=NOW), now=NOW)


def test_a_snakemake_building_the_job_graph_is_starting_never_the_last_workflows_numbers(campaign, tmp_path):
    progress.workflow_ends(campaign.progress_dir, True, None)
    progress.Starting(campaign.progress_dir)  # this process, alive
    status = campaign_status(campaign.root, now=NOW)
    assert status.state == "starting" and status.stages == ()
    assert "building its job graph" in format_status(status, now=NOW)
    # Before any workflow record: starting too, not an error.
    fresh = CampaignLayout(tmp_path / "other", "new")
    fresh.progress_dir.mkdir(parents=True)
    progress.Starting(fresh.progress_dir)
    assert campaign_status(fresh.root, now=NOW).state == "starting"
    # A dry run's record (its process has ended) counts for nothing, and the next workflow removes it.
    gone = fresh.progress_dir / f"{progress.STARTING_PREFIX}1.json"
    gone.write_text(json.dumps({**dead_identity(), "started_at": iso(5)}))
    (fresh.progress_dir / f"{progress.STARTING_PREFIX}{os.getpid()}.json").unlink()
    with pytest.raises(Exception, match="no workflow has run it yet"):
        campaign_status(fresh.root, now=NOW)
    progress.Starting(fresh.progress_dir)
    assert not gone.exists()


def run_status(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ldpbench", "status", str(path)], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "LDPBENCH_WORKER"})


def test_status_of_a_directory_that_is_no_campaign_is_one_line_and_exit_2(tmp_path):
    result = run_status(tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ldpbench status: error: '{tmp_path}' has no workflow record ({tmp_path}/progress/workflow.json): not a "
        "campaign's results directory, or no workflow has run it yet"]


@pytest.mark.parametrize("record", [
    "not json", "[]", '{"state": "running"}', '{"state": "done", "cells": {}}',
    '{"state": "running", "cells": {"c": {"phase": "trial"}}}',
    '{"state": "running", "cells": {"c": {"phase": "warmup", "dataset": "d", "mechanism": "m", "runs": 1}}}',
    '{"state": "running", "cells": {"c": {"phase": "final", "dataset": "d", "mechanism": "m", "runs": "many"}}}',
])
def test_a_malformed_workflow_record_is_one_line_and_exit_2(tmp_path, record):
    layout = CampaignLayout(tmp_path, "c")
    layout.progress_dir.mkdir(parents=True)
    (layout.progress_dir / progress.WORKFLOW_FILE).write_text(record)
    result = run_status(layout.root)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "workflow record" in result.stderr


def test_status_imports_no_torch(campaign):
    code = (f"import sys; from ldpbench.status import campaign_status; campaign_status({str(campaign.root)!r}); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_refused_campaign_file_leaves_no_starting_record_nor_the_directories_it_made(tmp_path):
    (tmp_path / "results").mkdir()
    starting = progress.Starting(tmp_path / "results" / "new" / "progress")
    assert starting.path.exists()
    starting.withdraw()
    assert list(tmp_path.iterdir()) == [tmp_path / "results"]  # made before: kept
