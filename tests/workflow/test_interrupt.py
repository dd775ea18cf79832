"""Long steps are visible and one Ctrl-C stops the whole campaign: a terminal's SIGINT to Snakemake's process
group during feature extraction and during a cell's training ends the workflow within seconds, with no
traceback and no partial output, and the next run completes the campaign."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ldpbench.layout import CampaignLayout, stored_summaries

from workflow_cli import environment, run_snakemake, small_config, snakemake_command

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the processes through /proc")]

STOPPED_WITHIN = 5.0  # seconds from Ctrl-C to the end of Snakemake


def session_processes(session: int) -> list[str]:
    """The command lines of the live processes of a session."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _, _, sid = stat[stat.rindex(")") + 2:].split()[:4]
        if int(sid) == session and state not in "ZXx":
            found.append(argv)
    return found


def interrupt_when(workdir: Path, config: dict, ready, timeout: float = 300) -> tuple[str, float]:
    """Start the workflow as a terminal does (its own process group, which a terminal's Ctrl-C signals
    whole), wait until `ready()`, send SIGINT to the group; (console output, seconds until it ended)."""
    console = workdir / "console.log"
    workdir.mkdir(parents=True, exist_ok=True)
    with console.open("w") as out:
        process = subprocess.Popen(snakemake_command(workdir, config, "--cores", "2"), env=environment(),
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not ready():
                assert process.poll() is None, console.read_text()[-5000:]
                assert time.monotonic() < deadline, console.read_text()[-5000:]
                time.sleep(0.05)
            sent = time.monotonic()
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=60)
            took = time.monotonic() - sent
            time.sleep(0.5)
            assert not session_processes(process.pid), session_processes(process.pid)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert process.returncode != 0
    return console.read_text(), took


def test_ctrl_c_during_a_cell_stops_the_campaign_with_no_partial_output(tmp_path):
    config = small_config(seeds=(0,), mechanisms=("pm",), epsilons=(1,))
    config["training"].update(epochs=300, eval_every=1000)  # minutes of training
    config["tracking"]["enabled"] = False
    layout = CampaignLayout(tmp_path / "results", "tiny")

    def training() -> bool:
        return any(layout.runs_dir.glob(".attempts/*/attempt.json"))

    output, took = interrupt_when(tmp_path, config, training)
    assert took < STOPPED_WITHIN, took
    assert "Traceback" not in output
    # Nothing half written: no attempt, no run, no cell marker, no summary table.
    assert not list(layout.runs_dir.glob(".attempts/*")) and not stored_summaries(layout.runs_dir)
    assert not list(layout.root.glob("cells/*/*/*.json")) and not layout.table("summary").exists()
    [cell_log] = (tmp_path / "logs" / "tiny" / "runs").rglob("*.log")
    assert "Traceback" not in cell_log.read_text() and "ldpbench run-cell: interrupted" in cell_log.read_text()
    # The next run trains the cell again (nothing is taken for done, nothing refuses to start).
    planned = run_snakemake(tmp_path, config, "--dry-run", "--cores", "2")
    assert planned.returncode == 0 and "rule run_cell:" in planned.stdout, planned.stdout[-5000:]


def test_ctrl_c_during_feature_extraction_after_its_progress_is_shown(tmp_path):
    raw = tmp_path / "raw" / "sec"
    raw.mkdir(parents=True)
    words = "the contract shall terminate upon notice by either party provided all obligations are met".split()
    rng = random.Random(0)
    raw.joinpath("sec_contract_clauses.csv").write_text("text,label\n" + "".join(
        f'"{" ".join(rng.choice(words) for _ in range(40))}",{i % 2}\n' for i in range(20_000)))
    config = small_config(seeds=(0,), mechanisms=("pm",), epsilons=(1,))
    config["datasets"] = [{"name": "sec", "features": "minilm"}]
    config["features"] = {"dir": str(tmp_path / "features"), "threads": 1}
    config["tracking"]["enabled"] = False
    console = tmp_path / "console.log"

    def extracting() -> bool:
        # The step's progress, with the time left, reaches the console Snakemake shows.
        return console.exists() and "ldpbench features sec/minilm: " in console.read_text()

    output, took = interrupt_when(tmp_path, config, extracting)
    assert took < STOPPED_WITHIN, took
    assert "Traceback" not in output
    progress_line = next(line for line in output.splitlines() if line.startswith("ldpbench features sec/minilm: "))
    assert " of 20,000 records)" in progress_line
    # The prepared dataset is complete; no features, not even a temporary directory of them.
    assert (tmp_path / "prepared" / "sec" / "meta.json").exists()
    assert not (tmp_path / "features").exists() or not list((tmp_path / "features").rglob("*.npy"))
    log = (tmp_path / "logs" / "features" / "sec" / "minilm.log").read_text()
    assert "Traceback" not in log and "ldpbench features: interrupted" in log
    # The next run starts the step again (nothing is taken for done, nothing refuses to start).
    planned = run_snakemake(tmp_path, config, "--dry-run", "--cores", "2")
    assert planned.returncode == 0, planned.stdout[-5000:]
    assert "rule features:" in planned.stdout and "rule prepare_dataset:" not in planned.stdout
