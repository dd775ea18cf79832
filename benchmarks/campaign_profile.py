"""Where a campaign's core-time goes, whole and from scratch: the profile of each paper campaign that
performance goal 8 asks for, beside run_profile.py's split of its runs.

    python benchmarks/campaign_profile.py CAMPAIGN_FILE [...] [--cores 2] [--workdir DIR]
        [--out benchmarks/results/campaign_profile.json]

Each campaign file runs as `campaign_throughput.py --campaigns` runs it: `snakemake --cores N
--configfile FILE` in a fresh directory, its datasets prepared and its features extracted from the
mirror inside the clock, tuning, audits, tables, report and tracking included, no warm seed before
or after it. Its core-time (cores × wall time) is then read from what the campaign left:

* every job the warm worker forked holds its cores while it runs (one, or the `--threads` its command
  line gives: feature extraction), and its wall and CPU seconds are in the worker's log (its ENDED
  line, joined to its FORKED line by the pid), grouped here by command;
* inside the run-cell jobs, the runs' training (their summaries' train_seconds: the rounds with their
  evaluations and checkpoints, which run_profile.py splits) and the audits (the jobs' own "audited"
  log lines) are told apart from the rest of the jobs (building the runs, reading and writing files);
* "no job" is the core-time no forked job held: Snakemake building the job graph and running its local
  rules (plans, manifest, trials) in its own threads, the jobs' clients starting, the cores waiting
  between jobs and for the campaign's serial tail.

CPU seconds are given beside: those of the jobs from the worker's log; the worker's own (its imports,
holding the datasets), from its last log line; Snakemake's own process (its job graph, its local rules'
threads; not its children, the jobs' clients), sampled while it runs. A job the worker reaps may have
been ended by SIGTERM after it sent its exit status to its client (the worker ends what its client no
longer waits for), so its exit code is not the job's success: Snakemake's is. Printed and written as
JSON; not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from collections import defaultdict
from pathlib import Path

import psutil
import pyarrow.dataset as ds

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # its siblings, however this file is loaded
from campaign_throughput import from_scratch, measure  # noqa: E402
from result_file import write_result_file  # noqa: E402

from ldpbench.launch.fork_server import DECLINED, ENDED, FORKED, STOPPED  # noqa: E402
from ldpbench.layout import FINAL, SUMMARIES, TRIAL, CampaignLayout  # noqa: E402

# The parts of a campaign, by the ldpbench command of its jobs (run-cell's are split further).
COMMAND_PARTS = {
    "prepare": "preparation", "features": "feature extraction",
    "select": "tables and verdicts", "aggregate": "tables and verdicts", "compare": "tables and verdicts",
    "scorecard": "tables and verdicts", "audit-table": "audit table",
    "report": "report", "tracking-init": "tracking", "track": "tracking", "track-report": "tracking",
}
ORDER = ("preparation", "feature extraction", f"runs ({TRIAL})", f"runs ({FINAL})", "tables and verdicts",
         "audit table", "report", "tracking", "other commands", "no job")
FORKED_LINE = re.compile(rf" {FORKED} (\d+) from .*?: ldpbench (\S+)(.*)$")
ENDED_LINE = re.compile(rf" {ENDED} (\d+) \(exit (-?\d+)\): ([0-9.]+) s wall, ([0-9.]+) s CPU")
DECLINED_LINE = re.compile(rf" {DECLINED} for process ")
STOPPED_LINE = re.compile(rf" {STOPPED} after \d+ commands, ([0-9.]+) s of its own CPU")
AUDITED_LINE = re.compile(r" audited \d+ of \d+ private configuration\(s\) in ([0-9.]+) s")


def worker_jobs(worker_log: Path) -> tuple[list[dict], int, float]:
    """(each job the worker forked and reaped: its command, arguments, exit code, wall and CPU seconds and
    the cores it holds; how many commands it declined, which their clients ran themselves; its own CPU
    seconds) from its log."""
    forked: dict[int, tuple[str, str]] = {}
    jobs, declined, own = [], 0, 0.0
    for line in worker_log.read_text().splitlines():
        if match := FORKED_LINE.search(line):
            forked[int(match[1])] = (match[2], match[3])
        elif match := ENDED_LINE.search(line):
            command, arguments = forked.pop(int(match[1]))  # a pid is reused only once its job is reaped
            threads = re.search(r"--threads (\d+)", arguments)
            jobs.append({"command": command, "arguments": arguments, "exit": int(match[2]),
                         "wall": float(match[3]), "cpu": float(match[4]), "cores": int(threads[1]) if threads else 1})
        elif DECLINED_LINE.search(line):
            declined += 1
        elif match := STOPPED_LINE.search(line):
            own = float(match[1])
    return jobs, declined, own


def run_cell_phase(arguments: str) -> str:
    """The phase (trial or final) of a run-cell job, from its cell's plan file."""
    cell = re.search(r"--cell (\S+)", arguments)[1]
    return json.loads(Path(cell).read_text())["phase"]


def profile(directory: Path, campaign: str, wall: float, cores: int, snakemake_cpu: float) -> dict:
    """The campaign's core-time and CPU by part, from its files in `directory` (see the module's doc)."""
    layout = CampaignLayout(directory / "results", campaign)
    jobs, declined, worker_cpu = worker_jobs(directory / layout.log("worker"))
    core, cpu = defaultdict(float), defaultdict(float)
    for job in jobs:
        part = (f"runs ({run_cell_phase(job['arguments'])})" if job["command"] == "run-cell"
                else COMMAND_PARTS.get(job["command"], "other commands"))
        core[part] += job["wall"] * job["cores"]
        cpu[part] += job["cpu"]
    core["no job"] = wall * cores - sum(job["wall"] * job["cores"] for job in jobs)
    # The summaries tree as one table, its phase from the Hive keys of the paths.
    summaries = ds.dataset(layout.runs_dir / SUMMARIES, format="parquet", partitioning="hive").to_table(
        columns=["run_id", "train_seconds", "phase"]).to_pandas()
    # A final run whose plan a trial ran is the trial's run, linked by the final cell's job, not trained
    # again: from scratch the trials come first, so each run counts once, in its trial.
    summaries = summaries.sort_values("phase", key=lambda phase: phase != TRIAL, kind="stable")
    training = summaries.drop_duplicates("run_id").groupby("phase")["train_seconds"].sum()
    audits = sum(float(match[1]) for log in (directory / layout.log_dir / "runs").rglob("*.log")
                 for match in AUDITED_LINE.finditer(log.read_text()))  # final cells audit
    inside = {}
    for phase in (TRIAL, FINAL):
        if f"runs ({phase})" in core:
            parts = {"training": float(training.get(phase, 0.0)), "audits": audits if phase == FINAL else 0.0}
            inside[phase] = {**parts, "the rest of the jobs": core[f"runs ({phase})"] - sum(parts.values())}
    jobs_cpu = sum(job["cpu"] for job in jobs)
    return {
        "campaign": campaign, "wall_seconds": wall, "cores": cores, "core_seconds": round(wall * cores, 2),
        "jobs": len(jobs), "declined_jobs": declined,
        "core_seconds_by_part": {part: round(core[part], 3) for part in ORDER if part in core},
        "run_cells": {phase: {part: round(seconds, 3) for part, seconds in parts.items()}
                      for phase, parts in inside.items()},
        "cpu_seconds_by_part": {part: round(cpu[part], 3) for part in ORDER if part in cpu},
        "cpu_seconds": {"jobs": round(jobs_cpu, 3), "worker": round(worker_cpu, 3),
                        "snakemake's own process": round(snakemake_cpu, 3)},
    }


class SnakemakeCpu(threading.Thread):
    """Samples the CPU seconds of this process's one child, Snakemake, its own (not its children's),
    until it ends: the last sample, at most SAMPLE_SECONDS before its end."""

    SAMPLE_SECONDS = 0.05

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seconds = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        watched = None
        while not self.done.is_set():
            try:
                if watched is None:
                    children = psutil.Process().children()
                    watched = children[0] if children else None
                if watched is not None:
                    times = watched.cpu_times()
                    self.seconds = times.user + times.system
            except psutil.Error:  # it ended between two samples
                watched = None
            self.done.wait(self.SAMPLE_SECONDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaigns", type=Path, nargs="+", help="campaign files, each from scratch")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=REPO / "benchmarks" / "results" / "campaign_profile")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "campaign_profile.json"))
    args = parser.parse_args(argv)
    results = []
    for campaign_file in args.campaigns:
        directory = args.workdir / campaign_file.stem
        config = from_scratch(campaign_file.resolve(), directory)
        snakemake_cpu = SnakemakeCpu()
        snakemake_cpu.start()
        try:
            measured = measure(directory, config, args.cores)
        finally:
            snakemake_cpu.done.set()
            snakemake_cpu.join()
        row = profile(directory, config["campaign"], measured["wall_seconds"], args.cores, snakemake_cpu.seconds)
        results.append(row)
        print(f"\n{row['campaign']}: {row['wall_seconds']:.1f} s wall × {row['cores']} cores = "
              f"{row['core_seconds']:.1f} core-s; {row['jobs']} jobs forked, "
              f"{row['declined_jobs']} declined")
        print(f"  {'part':36s} {'core-s':>8s} {'share':>7s} {'CPU s':>8s}")
        for part, seconds in row["core_seconds_by_part"].items():
            used = row["cpu_seconds_by_part"].get(part)
            print(f"  {part:36s} {seconds:8.1f} {seconds / row['core_seconds']:7.1%} "
                  f"{'' if used is None else format(used, '8.1f')}")
            for inner, inner_seconds in row["run_cells"].get(part.removeprefix("runs (").rstrip(")"), {}).items():
                print(f"    {inner:34s} {inner_seconds:8.1f} {inner_seconds / row['core_seconds']:7.1%}")
        print("  CPU s: " + ", ".join(f"{who} {seconds:.1f}" for who, seconds in row["cpu_seconds"].items()))
    write_result_file("campaign_profile", results, args.out, cores=args.cores)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
