"""`ldpbench status <campaign dir>`: where a campaign stands, read from its results directory alone.

The campaign is the one the last workflow runs (progress/workflow.json, ldpbench.progress: its cells,
written when Snakemake starts its jobs), never an earlier version of the file: a run counts once it
is in the run store for one of those cells. A cell's runs are known from its plan file (a tuned final
cell's once its trials have selected its setting; until then only their number); a cell is done once
its marker is written. What is running comes from the processes themselves: the attempt directories
of cells being computed (attempt.json names the runs training now) and the records of the jobs the
workflow runs (their step, their progress and ETA, how they ended). A process is alive when its pid
and start time match on this host; on another host (a cluster node) its record is trusted.

States: starting (a Snakemake is building the job graph), running, complete (the workflow ended
successfully), failed (it ended with an error: the failed jobs and their logs), stopped (its Snakemake
is gone without ending: killed, or the machine restarted). Throughput counts the runs finished since
the workflow started within the last `window` seconds. Nothing here imports torch: it answers in a
fraction of a second while the campaign runs.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ldpbench import progress
from ldpbench.durations import duration
from ldpbench.errors import LdpbenchError
from ldpbench.launch import processes
from ldpbench.layout import ATTEMPT_FILE, FINAL, SUMMARIES, TRIAL, CampaignLayout, campaign_attempts, run_file

DEFAULT_WINDOW_SECONDS = 600.0
STARTING, STOPPED = "starting", "stopped"
STAGE_NAMES = {TRIAL: "tuning trials", FINAL: "final runs"}


@dataclass(frozen=True)
class StageProgress:
    """The runs of one stage (the tuning trials, the final runs): planned, done, training now."""

    name: str
    planned: int
    done: int
    running: int

    @property
    def pending(self) -> int:
        return self.planned - self.done - self.running


@dataclass(frozen=True)
class StepProgress:
    """A job of the workflow that is not a cell's (preparation, features, selection, aggregation, audits,
    report, tracking), or a cell's job that failed."""

    step: str
    what: str
    state: str  # running, ok, failed
    log: str | None
    progress: dict[str, Any] | None


@dataclass(frozen=True)
class CampaignStatus:
    campaign: str
    root: Path
    state: str  # starting, running, complete, failed, stopped
    since: float | None  # when the workflow (or, starting, its Snakemake) started, as a Unix time
    ended: float | None
    workflow_log: str | None
    stages: tuple[StageProgress, ...]
    steps: tuple[StepProgress, ...]
    jobs_running: int  # the workflow's jobs alive on this machine
    stale_attempts: int  # attempts whose process is not alive here (killed, or on another node)
    finished_in_window: int
    window_seconds: float  # the span the rate is measured over (shorter at the start of a campaign)

    @property
    def complete(self) -> bool:
        return self.state == progress.COMPLETE

    @property
    def ended_state(self) -> bool:
        """Whether nothing more will happen without another workflow (complete, failed, stopped)."""
        return self.state in (progress.COMPLETE, progress.FAILED, STOPPED)

    @property
    def runs_per_second(self) -> float | None:
        return self.finished_in_window / self.window_seconds if self.finished_in_window else None

    @property
    def remaining(self) -> int:
        return sum(stage.planned - stage.done for stage in self.stages)

    @property
    def seconds_left(self) -> float | None:
        rate = self.runs_per_second
        return None if rate is None else self.remaining / rate


def _timestamp(text: str | None) -> float | None:
    try:
        return dt.datetime.fromisoformat(text).timestamp() if text else None
    except (TypeError, ValueError):
        return None


def _starting(directory: Path) -> dict[str, Any] | None:
    """The record of a live Snakemake building this campaign's job graph, if there is one."""
    for path in sorted(directory.glob(f"{progress.STARTING_PREFIX}*.json")):
        record = progress.read_record(path)
        if record is not None and processes.recorded_alive(record):
            return record
    return None


def _cells(workflow: dict[str, Any], source: Path) -> dict[str, dict[str, Any]]:
    cells = workflow.get("cells")
    keys = {"phase", "dataset", "mechanism", "runs"}
    if not isinstance(cells, dict) or not all(
            isinstance(cell, dict) and keys <= set(cell) and cell["phase"] in STAGE_NAMES
            and isinstance(cell["runs"], int) and not isinstance(cell["runs"], bool) for cell in cells.values()):
        raise LdpbenchError(f"'{source}' is not a workflow record of ldpbench (its cells are not readable)")
    return cells


def _cell_runs(layout: CampaignLayout, cell_id: str) -> list[str] | None:
    """The run ids of a cell, from its plan file (None before it is written)."""
    record = progress.read_record(layout.plan(cell_id))
    try:
        return None if record is None else [str(run["run_id"]) for run in record["runs"]]
    except (KeyError, TypeError):
        return None


def campaign_status(root: str | Path, window: float = DEFAULT_WINDOW_SECONDS,
                    now: float | None = None) -> CampaignStatus:
    """The status of the campaign whose results directory is `root` (results/<campaign>)."""
    layout = CampaignLayout.at(root)
    directory = layout.progress_dir
    now = time.time() if now is None else now
    workflow_path = directory / progress.WORKFLOW_FILE
    workflow = progress.read_record(workflow_path)
    if workflow is None and workflow_path.exists():
        raise LdpbenchError(f"'{workflow_path}' is not a workflow record of ldpbench (not a JSON object)")
    starting = _starting(directory)
    if workflow is None and starting is None:
        raise LdpbenchError(f"'{layout.root}' has no workflow record ({workflow_path}): not a campaign's results "
                            "directory, or no workflow has run it yet")
    state = workflow.get("state") if workflow else None
    if state == progress.RUNNING and processes.recorded_alive(workflow) is False:
        state = STOPPED
    if starting is not None and state != progress.RUNNING:
        # A new workflow is reading the campaign file: the last one's cells may no longer be the campaign.
        return CampaignStatus(layout.campaign, layout.root, STARTING, _timestamp(starting.get("started_at")), None,
                              None, (), (), 0, 0, 0, 0.0)
    if state not in (progress.RUNNING, progress.COMPLETE, progress.FAILED, STOPPED):
        raise LdpbenchError(f"'{workflow_path}' is not a workflow record of ldpbench (state {state!r})")
    cells = _cells(workflow, workflow_path)
    started = _timestamp(workflow.get("started_at")) or now

    live_attempts, stale, training = set(), 0, set()
    for cell_id, _, attempt in campaign_attempts(layout.runs_dir):
        record = progress.read_record(attempt / ATTEMPT_FILE)
        if record is None or processes.recorded_alive(record) is False:
            stale += 1
            continue
        live_attempts.add(cell_id)
        training.update(str(run_id) for run_id in record.get("training") or [])

    planned, done, running = Counter(), Counter(), Counter()
    finished_at = []
    for cell_id, cell in cells.items():
        phase, count = cell["phase"], int(cell["runs"])
        planned[phase] += count
        complete = layout.cell_marker(cell["dataset"], cell["mechanism"], cell_id).exists()
        stored = 0
        for run_id in _cell_runs(layout, cell_id) or []:
            try:
                finished = run_file(layout.runs_dir, SUMMARIES, cell["dataset"], cell["mechanism"], phase,
                                    run_id).stat().st_mtime
            except OSError:
                running[phase] += run_id in training
                continue
            stored += 1
            if finished >= started:
                finished_at.append(finished)
        done[phase] += count if complete else stored
    stages = tuple(StageProgress(STAGE_NAMES[phase], planned[phase], done[phase], running[phase])
                   for phase in (TRIAL, FINAL) if planned[phase])

    steps, jobs_running = [], 0
    for path in sorted((directory / progress.JOBS_DIR).glob("*.json")):
        record = progress.read_record(path)
        if record is None:
            continue
        job_state = record.get("state")
        if job_state == progress.RUNNING:
            alive = processes.recorded_alive(record)
            if alive is False:
                job_state = "gone"  # killed without ending (its workflow's state says more)
            else:
                jobs_running += alive is True
        if record.get("step") == "run-cell" and job_state != progress.FAILED:
            continue  # counted as runs
        steps.append(StepProgress(str(record.get("step")), str(record.get("what") or ""), str(job_state),
                                  record.get("log"), record.get("progress")))

    window_start = max(now - window, started)
    in_window = sum(window_start <= moment <= now for moment in finished_at)
    return CampaignStatus(layout.campaign, layout.root, state, started, _timestamp(workflow.get("ended_at")),
                          workflow.get("log"), stages, tuple(steps), jobs_running, stale, in_window,
                          max(now - window_start, 1e-9))


def format_status(status: CampaignStatus, now: float | None = None) -> str:
    now = time.time() if now is None else now
    ago = f", started {duration(max(now - status.since, 0))} ago" if status.since else ""
    head = f"campaign '{status.campaign}' ({status.root}): {status.state}"
    if status.state == STARTING:
        return (f"{head}{ago}\n  starting:       Snakemake is reading the campaign file and building its job "
                "graph; the runs are counted once its jobs start")
    lines = [head + ago]
    for stage in status.stages:
        lines.append(f"  {stage.name + ':':15s} {stage.done:,} of {stage.planned:,} done, {stage.running:,} "
                     f"running, {stage.pending:,} pending")
    by_state: dict[str, list[StepProgress]] = {}
    for step in status.steps:
        by_state.setdefault(step.state, []).append(step)
    for step in by_state.get(progress.RUNNING, []):
        detail = f": {progress.format_progress(step.progress)}" if step.progress else ""
        lines.append(f"  {'running:':15s} {step.step}{' ' + step.what if step.what else ''}{detail}")
    finished = Counter(step.step for step in by_state.get(progress.OK, []))
    if finished:
        lines.append(f"  {'steps done:':15s} " + ", ".join(f"{name} ×{count}" if count > 1 else name
                                                           for name, count in finished.items()))
    ended_badly = by_state.get(progress.FAILED, []) + by_state.get(progress.STOPPED, []) + by_state.get("gone", [])
    for ended, name, log in dict.fromkeys(  # a job retried fails alike, into one log: one line
            ("failed" if step.state == progress.FAILED else "was stopped",
             step.step + (f" {step.what}" if step.what else ""), step.log) for step in ended_badly):
        lines.append(f"  {ended + ':':15s} {name}{f' (log: {log})' if log else ''}")
    jobs = f"  jobs:           {status.jobs_running} running on this machine"
    if status.stale_attempts:
        jobs += f"; {status.stale_attempts} attempt(s) of processes not alive here (killed, or on another node)"
    lines.append(jobs)
    if status.state == progress.COMPLETE:
        lines.append("  complete:       the workflow ended successfully; the tables are in "
                     f"{status.root / 'tables'}")
        return "\n".join(lines)
    if status.state == progress.FAILED:
        lines.append("  failed:         the workflow ended with an error" +
                     (f"; Snakemake's log: {status.workflow_log}" if status.workflow_log else ""))
        return "\n".join(lines)
    if status.state == STOPPED:
        lines.append("  stopped:        its Snakemake is gone without ending (killed?); run the workflow again "
                     "to resume (after `snakemake --unlock` if it says the directory is locked)")
        return "\n".join(lines)
    rate = status.runs_per_second
    if rate is None:
        lines.append(f"  throughput:     no run finished in the last {duration(status.window_seconds)}")
        return "\n".join(lines)
    lines.append(f"  throughput:     {rate * 60:,.1f} runs/min ({status.finished_in_window:,} runs in the last "
                 f"{duration(status.window_seconds)})")
    left = status.seconds_left
    lines.append(f"  time left:      about {duration(left)} for {status.remaining:,} runs at that rate"
                 if status.remaining else "  time left:      every run is done; the steps after them are running")
    return "\n".join(lines)
