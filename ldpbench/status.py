"""`ldpbench status <campaign dir>`: how far a campaign is, read from its results directory alone.

What is planned comes from the campaign's manifests (trials.json for a tuned campaign's trials,
manifest.json for its final runs, written once the tuning has selected); what is done from the run
files (a run is done once its summary is written: published in the summaries tree, or inside the
attempt directory of a job still computing its cell); what is running from those attempt directories
whose process is alive on this machine. Throughput is the runs finished within the last `window`
seconds (their summaries' modification times), and the time left is what remains at that rate.
Nothing here imports torch: it answers in a fraction of a second while the campaign runs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ldpbench import lifeline
from ldpbench.durations import duration
from ldpbench.errors import LdpbenchError
from ldpbench.layout import (
    RUNS_DIR,
    CampaignLayout,
    attempt_summaries,
    campaign_attempts,
    published_summaries,
    run_id_of,
)

DEFAULT_WINDOW_SECONDS = 600.0


@dataclass(frozen=True)
class StageProgress:
    """The runs of one stage (the tuning trials, the final runs): planned, done, in a running job."""

    name: str
    planned: int | None  # None: not known yet (the final runs of a tuned campaign before the selection)
    done: int
    running: int  # runs of cells whose job is computing them now, not done yet

    @property
    def pending(self) -> int | None:
        return None if self.planned is None else self.planned - self.done - self.running


@dataclass(frozen=True)
class CampaignStatus:
    campaign: str
    root: Path
    stages: tuple[StageProgress, ...]
    jobs_running: int  # live attempts: cells being computed on this machine
    stale_attempts: int  # attempts whose process is not alive here (killed, or on another node)
    finished_in_window: int
    window_seconds: float  # the span the rate is measured over (shorter at the start of a campaign)
    complete: bool  # every planned run done and the summary table written
    summary_table: Path  # where that table is, in the campaign's directory

    @property
    def runs_per_second(self) -> float | None:
        return self.finished_in_window / self.window_seconds if self.finished_in_window else None

    @property
    def remaining(self) -> int | None:
        if any(stage.planned is None for stage in self.stages):
            return None
        return sum(stage.planned - stage.done for stage in self.stages)

    @property
    def seconds_left(self) -> float | None:
        rate, remaining = self.runs_per_second, self.remaining
        return None if rate is None or remaining is None else remaining / rate


def _manifest_runs(path: Path) -> list[dict] | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())["runs"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise LdpbenchError(f"'{path}' is not a campaign manifest ({error})") from None


def campaign_status(root: str | Path, window: float = DEFAULT_WINDOW_SECONDS,
                    now: float | None = None) -> CampaignStatus:
    """The status of the campaign whose results directory is `root` (results/<campaign>)."""
    root = Path(root)
    layout = CampaignLayout(root.parent, root.name)
    trials, final = _manifest_runs(layout.trials_manifest), _manifest_runs(layout.manifest)
    if trials is None and final is None:
        raise LdpbenchError(f"'{root}' holds neither {layout.manifest.name} nor {layout.trials_manifest.name}: "
                            "not a campaign's results directory, or its workflow has not started")
    now = time.time() if now is None else now
    runs_dir = root / RUNS_DIR
    finished = {run_id_of(path.parent): path.stat().st_mtime for path in published_summaries(runs_dir)}
    live_cells, stale = set(), 0
    for cell, pid, attempt in campaign_attempts(runs_dir):
        if lifeline.process(pid) is not None:
            live_cells.add(cell)
            finished.update({run_id_of(path.parent): path.stat().st_mtime for path in attempt_summaries(attempt)})
        else:
            stale += 1

    def stage(name: str, runs: list[dict] | None) -> StageProgress:
        if runs is None:
            return StageProgress(name, None, 0, 0)
        done = sum(run["run_id"] in finished for run in runs)
        running = sum(run["cell_id"] in live_cells and run["run_id"] not in finished for run in runs)
        return StageProgress(name, len(runs), done, running)

    stages = ((stage("tuning trials", trials),) if trials is not None else ()) + (stage("final runs", final),)
    plans = list(layout.plans_dir.glob("*.json"))
    started = min((path.stat().st_mtime for path in plans), default=min(finished.values(), default=now))
    window_start = max(now - window, started)
    in_window = sum(window_start <= finished_at <= now for finished_at in finished.values())
    complete = all(s.planned is not None and s.done == s.planned for s in stages) and layout.table("summary").exists()
    return CampaignStatus(root.name, root, stages, len(live_cells), stale, in_window, max(now - window_start, 1e-9),
                          complete, layout.table("summary").relative_to(root))


def format_status(status: CampaignStatus) -> str:
    lines = [f"campaign '{status.campaign}' ({status.root})"]
    for stage in status.stages:
        if stage.planned is None:
            lines.append(f"  {stage.name + ':':15s} not known until the tuning has selected each setting")
            continue
        lines.append(f"  {stage.name + ':':15s} {stage.done:,} of {stage.planned:,} done, {stage.running:,} running, "
                     f"{stage.pending:,} pending")
    jobs = f"  jobs:           {status.jobs_running} running on this machine"
    if status.stale_attempts:
        jobs += f"; {status.stale_attempts} attempt(s) of processes not alive here (killed, or on another node)"
    lines.append(jobs)
    if status.complete:
        lines.append(f"  complete:       every planned run is done and {status.summary_table} is written")
        return "\n".join(lines)
    rate = status.runs_per_second
    if rate is None:
        lines.append(f"  throughput:     no run finished in the last {duration(status.window_seconds)}")
        return "\n".join(lines)
    lines.append(f"  throughput:     {rate * 60:,.1f} runs/min ({status.finished_in_window:,} runs in the last "
                 f"{duration(status.window_seconds)})")
    left = status.seconds_left
    lines.append("  time left:      " + (f"about {duration(left)} for {status.remaining:,} runs at that rate"
                                         if left is not None else
                                         "unknown until the final runs are known (after the tuning)"))
    return "\n".join(lines)
