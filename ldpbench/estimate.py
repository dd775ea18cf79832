"""What a campaign will take before anything runs (`ldpbench validate --estimate`): its runs, its jobs
(under a SLURM profile, its SLURM jobs too) and the core-time of its runs, from runs measured earlier.

The measurements are run summaries in a run store: a pilot campaign's, or this campaign's own from an
earlier run. A run's cost is its `wall_seconds` (its share of its cell's training, with its own
preparation and evaluation; a cell's job runs on one core, so wall time is core-time). Two runs are of
one kind when their plans match but for seed, fold, ε and learning rates, which change the numbers and
mostly not the work (where ε does, the median over the measured ε prices it): a planned run costs the
median of the measured runs of its kind. A run with no measured kind is priced per round, from
measured runs of its dataset, model, mechanism (parameters included) and features: the median of their
time outside training (preparation, the test), plus their median training seconds per round times the
rounds it plans (an over-estimate where training has a fixed start that a short pilot spreads over few
rounds: a pilot with one seed at the campaign's rounds prices every run by its kind). A run with neither
is listed as unmeasured; nothing is guessed for it.

Left out of the core-time: job starts, the steps after the cells (tables, report, tracking), each
seconds whatever the grid's size, and the final cells' privacy audits: seconds for each audited
(mechanism, ε) with narrow reports, tens of seconds where the reports are wide (a DiffSketch sketch of
1,900 values), a large share of a campaign of few runs (benchmarks/campaign_profile.py measures it).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from ldpbench.campaign import campaign_cells, tuned_cell_runs
from ldpbench.errors import ConfigError
from ldpbench.layout import FINAL, TRIAL, stored_summaries
from ldpbench.plan import RunPlan, canonical_json

# What the estimate reads of a stored run's summary.
MEASURED_COLUMNS = ("plan", "status", "rounds", "clients", "wall_seconds", "train_seconds")
# Plan keys that change a run's numbers but not its work.
NOT_WORK = ("seed", "fold", "epsilon")
NOT_WORK_TRAINING = ("learning_rate", "local_learning_rate")
# The plan keys that decide how many training clients a run of a dataset has.
SPLIT_KEYS = ("dataset", "features", "data_part", "test_fraction", "folds", "public_fraction")
SPLIT_TRAINING_KEYS = ("validation_fraction", "partition")
# The SLURM profile's group of the cells' jobs (profiles/slurm/profile.yaml: groups, group-components).
CELL_RULE = "run_cell"


def work_kind(plan: Mapping[str, Any]) -> str:
    """A run's plan without what changes its numbers but not its work."""
    training = {key: value for key, value in plan["training"].items() if key not in NOT_WORK_TRAINING}
    return canonical_json({**{key: value for key, value in plan.items() if key not in NOT_WORK}, "training": training})


def mechanism_kind(plan: Mapping[str, Any]) -> str:
    """What decides a round's work apart from the training settings: data, model, mechanism."""
    keys = ("dataset", "features", "model", "network_params", "mechanism", "mechanism_params")
    return canonical_json({key: plan[key] for key in keys})


def split_kind(plan: Mapping[str, Any]) -> str:
    """What decides a run's number of training clients."""
    return canonical_json({**{key: plan[key] for key in SPLIT_KEYS},
                           **{key: plan["training"][key] for key in SPLIT_TRAINING_KEYS}})


def describe(plan: Mapping[str, Any]) -> str:
    params = plan["mechanism_params"]
    shown = f"{plan['mechanism']}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})" if params \
        else plan["mechanism"]
    features = f" on {plan['features']} features" if plan["features"] else ""
    return f"{plan['dataset']}{features} · {plan['model']} · {shown}"


@dataclass(frozen=True)
class Measurements:
    """The measured runs, by kind: wall seconds of each run; seconds outside training and training
    seconds per round; training clients."""

    runs: int
    sources: tuple[str, ...]
    wall_by_work: Mapping[str, tuple[float, ...]]
    outside_by_mechanism: Mapping[str, tuple[float, ...]]
    per_round_by_mechanism: Mapping[str, tuple[float, ...]]
    clients_by_split: Mapping[str, tuple[int, ...]]

    @classmethod
    def read(cls, directories: Iterable[str | Path]) -> Measurements:
        """The successful runs stored under each directory: a campaign's directory (holding runs/), a
        results directory (holding campaigns), or a run store itself."""
        wall: dict[str, list[float]] = defaultdict(list)
        outside: dict[str, list[float]] = defaultdict(list)
        per_round: dict[str, list[float]] = defaultdict(list)
        clients: dict[str, list[int]] = defaultdict(list)
        runs, sources = 0, []
        for directory in directories:
            directory = Path(directory)
            if not directory.is_dir():
                raise ConfigError(f"--measured '{directory}': no such directory")
            stores = [store for store in (directory, directory / "runs", *directory.glob("*/runs"))
                      if (store / "summaries").is_dir()]
            files = [path for store in stores for path in stored_summaries(store)]
            if not files:
                raise ConfigError(f"--measured '{directory}': holds no stored run (no runs/summaries/ under it)")
            sources.append(f"{len(files)} stored runs under {directory}")
            for row in ds.dataset(files, format="parquet").to_table(columns=list(MEASURED_COLUMNS)).to_pylist():
                if row["status"] != "ok" or not row["rounds"]:
                    continue
                plan = json.loads(row["plan"])
                runs += 1
                wall[work_kind(plan)].append(row["wall_seconds"])
                kind = mechanism_kind(plan)
                outside[kind].append(row["wall_seconds"] - row["train_seconds"])
                per_round[kind].append(row["train_seconds"] / row["rounds"])
                clients[split_kind(plan)].append(row["clients"])
        return cls(runs, tuple(sources), *({key: tuple(values) for key, values in by_kind.items()}
                                          for by_kind in (wall, outside, per_round, clients)))

    def run_seconds(self, plan: Mapping[str, Any]) -> tuple[float, str] | None:
        """(estimated core-seconds, how) of one planned run, or None when nothing measured prices it."""
        same_kind = self.wall_by_work.get(work_kind(plan))
        if same_kind:
            return statistics.median(same_kind), "of its kind"
        kind = mechanism_kind(plan)
        per_round = self.per_round_by_mechanism.get(kind)
        settings = RunPlan.from_dict(dict(plan)).training
        known_rounds = settings.rounds or (settings.stop is not None and settings.stop.max_rounds)
        clients = self.clients_by_split.get(split_kind(plan))
        if not per_round or not (known_rounds or clients):
            return None
        rounds = settings.total_rounds(int(statistics.median(clients)) if clients else 1)
        return statistics.median(self.outside_by_mechanism[kind]) + statistics.median(per_round) * rounds, \
            "per round"


@dataclass(frozen=True)
class CellCost:
    phase: str
    seconds: float  # of the runs priced


@dataclass(frozen=True)
class SlurmJobs:
    profile: str
    group_size: int  # cells per SLURM job (1: ungrouped)
    cores: int  # cells a group job runs at once
    cell_jobs: int
    other_jobs: int  # dataset preparation and feature extraction
    cell_runtime_minutes: float | None  # the profile's run_cell runtime at the first attempt


@dataclass(frozen=True)
class Estimate:
    datasets: tuple[str, ...]
    skipped: tuple[str, ...]
    runs: Mapping[str, int]  # phase -> runs
    cells: tuple[CellCost, ...]
    feature_jobs: int
    priced: Mapping[str, int]  # how -> runs
    unmeasured: Mapping[str, int]  # kind described -> runs
    sources: tuple[str, ...]
    slurm: SlurmJobs | None

    @property
    def core_seconds(self) -> float:
        return sum(cell.seconds for cell in self.cells)

    def lines(self) -> list[str]:
        cells = Counter(cell.phase for cell in self.cells)
        skipped = f"; left out: {', '.join(self.skipped)} (optional, files not at hand)" if self.skipped else ""
        lines = [f"estimate over the datasets {', '.join(self.datasets)}{skipped}",
                 f"  runs: {self.runs.get(FINAL, 0):,} final, {self.runs.get(TRIAL, 0):,} tuning trials",
                 f"  jobs: {len(self.cells):,} cells ({cells.get(TRIAL, 0):,} trial, {cells.get(FINAL, 0):,} final), "
                 f"{_count(len(self.datasets), 'dataset preparation')}, "
                 f"{_count(self.feature_jobs, 'feature extraction')}; a plan per cell and the steps after the "
                 "cells run where Snakemake runs"]
        if self.slurm is not None:
            slurm = self.slurm
            grouping = (f"{slurm.group_size} cells per job, {slurm.cores} at a time" if slurm.group_size > 1
                        else "one cell per job")
            lines.append(f"  SLURM ({slurm.profile}): at least {slurm.cell_jobs:,} jobs for the cells ({grouping}) "
                         f"and {slurm.other_jobs} for preparation and features")
        if not self.sources:
            lines.append("  core-time: not estimated: no measured runs (pass --measured with the results of a pilot "
                         "campaign, e.g. this file with one seed and fewer rounds)")
            return lines
        priced = sum(self.priced.values())
        how = ", ".join(f"{count:,} {label}" for label, count in sorted(self.priced.items()))
        longest = max((cell.seconds for cell in self.cells), default=0.0)
        lines.append(f"  core-time of the runs: {_duration(self.core_seconds)} for {priced:,} of "
                     f"{sum(self.runs.values()):,} runs ({how or 'none priced'}); the longest cell "
                     f"{_duration(longest)}; job starts, audits and the steps after the cells not included")
        if self.slurm is not None and self.slurm.cell_runtime_minutes is not None \
                and longest > 60 * self.slurm.cell_runtime_minutes:
            lines.append(f"  warning: the longest cell exceeds the profile's {CELL_RULE} runtime "
                         f"({self.slurm.cell_runtime_minutes:g} min at the first attempt): raise it in set-resources")
        for kind, count in sorted(self.unmeasured.items()):
            lines.append(f"  unmeasured: {count:,} runs of {kind}")
        lines += [f"  measured: {source}" for source in self.sources]
        return lines


def _count(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} core-seconds"
    if seconds < 7200:
        return f"{seconds / 60:.1f} core-minutes"
    return f"{seconds / 3600:.1f} core-hours"


def slurm_jobs(profile_dir: str | Path, cell_counts: Mapping[str, int], other_jobs: int) -> SlurmJobs:
    """The SLURM jobs a workflow profile submits for the cells (grouped as its `groups` and
    `group-components` say: at least one job per group of cells of one phase, since a tuned campaign's
    final cells become ready only after its trials) and for preparation and features."""
    import yaml

    path = Path(profile_dir) / "profile.yaml"
    if not path.is_file():
        path = Path(profile_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--workflow-profile '{profile_dir}': neither profile.yaml nor config.yaml there")
    settings = yaml.safe_load(path.read_text()) or {}
    group = (settings.get("groups") or {}).get(CELL_RULE)
    size = int((settings.get("group-components") or {}).get(group, 1)) if group else 1
    cell_jobs = sum(math.ceil(count / size) for count in cell_counts.values())
    runtime = ((settings.get("set-resources") or {}).get(CELL_RULE) or {}).get("runtime",
                                                                              (settings.get("default-resources")
                                                                               or {}).get("runtime"))
    return SlurmJobs(str(profile_dir), size, int(settings.get("cores", 1)), cell_jobs, other_jobs,
                     _first_attempt(runtime))


def _first_attempt(value: Any) -> float | None:
    """A resource of the profile at the first attempt: a number, or an expression of `attempt`."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        # The profile's own expression (Snakemake evaluates it the same way), with nothing but `attempt`.
        return float(eval(str(value), {"__builtins__": {}}, {"attempt": 1}))  # noqa: S307
    except Exception:
        return None


def estimate(config: dict[str, Any], datasets: list[str], skipped: list[str], measurements: Measurements | None,
             profile_dir: str | Path | None = None) -> Estimate:
    """The estimate of a validated campaign over `datasets` (those it runs)."""
    cells = campaign_cells(config, datasets)
    runs: Counter = Counter()
    priced: Counter = Counter()
    unmeasured: Counter = Counter()
    costs = []
    # work kind -> (core-seconds, how) or None, and what names it: runs of one kind are priced alike.
    prices: dict[str, tuple[tuple[float, str] | None, str]] = {}
    for cell in cells:
        # A tuned final cell's runs are built after its selection: priced at the entry's own settings (a
        # learning rate changes no run's work).
        plans = [run["plan"] for run in (tuned_cell_runs(config, cell, {}) if cell.tuned else cell.runs)]
        runs[cell.phase] += len(plans)
        seconds = 0.0
        for plan in plans if measurements is not None else ():
            kind = work_kind(plan)
            if kind not in prices:
                prices[kind] = (measurements.run_seconds(plan), describe(plan))
            found, described = prices[kind]
            if found is None:
                unmeasured[described] += 1
                continue
            seconds += found[0]
            priced[found[1]] += 1
        costs.append(CellCost(cell.phase, seconds))
    feature_jobs = len({(entry["name"], entry["features"]) for entry in config["datasets"]
                        if entry["features"] and entry["name"] in datasets})
    slurm = None
    if profile_dir is not None:
        slurm = slurm_jobs(profile_dir, Counter(cost.phase for cost in costs), len(datasets) + feature_jobs)
    return Estimate(tuple(datasets), tuple(skipped), dict(runs), tuple(costs), feature_jobs, dict(priced),
                    dict(unmeasured), measurements.sources if measurements is not None else (), slurm)

