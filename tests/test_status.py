"""`ldpbench status`: planned, done, running and pending runs, throughput and time left, from the files."""

import json
import os
import subprocess
import sys
import time

import pytest

from ldpbench.layout import ATTEMPT_MARK, CampaignLayout, attempts_dir, run_dir
from ldpbench.status import campaign_status, format_status

NOW = time.time()


def run(run_id, cell_id):
    return {"run_id": run_id, "cell_id": cell_id, "label": "PM", "plan": {}}


def write_summary(directory, seconds_ago):
    directory.mkdir(parents=True)
    summary = directory / "summary.parquet"
    summary.write_bytes(b"not read: only its time counts")
    os.utime(summary, (NOW - seconds_ago, NOW - seconds_ago))


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def campaign(tmp_path):
    """A tuned campaign part-way through its trials: cell c1 published, c2 computing (one run done),
    a stale attempt of a killed job, the final runs not selected yet."""
    layout = CampaignLayout(tmp_path / "results", "tiny")
    layout.root.mkdir(parents=True)
    layout.trials_manifest.write_text(json.dumps({"runs": [run("r1", "c1"), run("r2", "c1"), run("r3", "c2"),
                                                           run("r4", "c2")]}))
    (layout.root / "plans").mkdir()
    for cell in ("c1", "c2"):
        plan = layout.plan(cell)
        plan.write_text("[]")
        os.utime(plan, (NOW - 60, NOW - 60))  # the campaign started a minute ago
    c1 = layout.cell("syn", "pm", "c1")
    write_summary(run_dir(c1, "r1"), 30)
    write_summary(run_dir(c1, "r2"), 20)
    attempts = attempts_dir(layout.cell("syn", "pm", "c2"))
    write_summary(run_dir(attempts / f"cell=c2{ATTEMPT_MARK}{os.getpid()}-ab12", "r3"), 10)
    (attempts / f"cell=c9{ATTEMPT_MARK}{dead_pid()}-cd34").mkdir()
    return layout


def test_a_running_tuned_campaign_before_its_selection(campaign):
    status = campaign_status(campaign.root, now=NOW)
    [trials, final] = status.stages
    assert (trials.planned, trials.done, trials.running, trials.pending) == (4, 3, 1, 0)
    assert final.planned is None and status.remaining is None and status.seconds_left is None
    assert (status.jobs_running, status.stale_attempts) == (1, 1)
    assert status.finished_in_window == 3 and status.window_seconds == pytest.approx(60)
    text = format_status(status)
    assert "tuning trials:  3 of 4 done, 1 running, 0 pending" in text
    assert "final runs:     not known until the tuning has selected" in text
    assert "3.0 runs/min (3 runs in the last 1 min 00 s)" in text
    assert "1 attempt(s) of processes not alive here" in text


def test_the_time_left_is_what_remains_at_the_rate_of_the_window(campaign):
    campaign.manifest.write_text(json.dumps({"runs": [run("f1", "c3"), run("f2", "c3")]}))
    status = campaign_status(campaign.root, now=NOW)
    assert status.remaining == 1 + 2 and status.seconds_left == pytest.approx(3 / (3 / 60))
    assert "about 1 min 00 s for 3 runs at that rate" in format_status(status)
    # A shorter window sees only the last runs: 1 in 15 s.
    recent = campaign_status(campaign.root, window=15, now=NOW)
    assert recent.finished_in_window == 1 and recent.seconds_left == pytest.approx(3 * 15)


def test_a_campaign_is_complete_once_every_run_is_done_and_its_summary_table_written(campaign, capsys):
    campaign.trials_manifest.write_text(json.dumps({"runs": [run("r1", "c1"), run("r2", "c1")]}))
    campaign.manifest.write_text(json.dumps({"runs": [run("r1", "c1")]}))
    assert not campaign_status(campaign.root, now=NOW).complete
    campaign.table("summary").parent.mkdir(parents=True)
    campaign.table("summary").write_bytes(b"")
    status = campaign_status(campaign.root, now=NOW)
    assert status.complete and "complete:" in format_status(status)
    # --watch prints until the campaign is complete: here once.
    from ldpbench.cli import main

    assert main(["status", str(campaign.root), "--watch", "0.01"]) == 0
    assert capsys.readouterr().out.count("complete:") == 1


def test_status_of_a_directory_that_is_no_campaign_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ldpbench", "status", str(tmp_path)], capture_output=True,
                            text=True, env={k: v for k, v in os.environ.items() if k != "LDPBENCH_WORKER"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ldpbench status: error: '{tmp_path}' holds neither manifest.json nor trials.json: not a campaign's "
        "results directory, or its workflow has not started"]


def test_status_imports_no_torch(campaign):
    code = (f"import sys; from ldpbench.status import campaign_status; campaign_status({str(campaign.root)!r}); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
