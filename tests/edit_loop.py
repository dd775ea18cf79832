"""The edit loop of a researcher, as the edit tests drive it (tests/workflow/test_edits*.py): run a campaign,
edit its file, run again, and check the run executed exactly the cells the edit adds (as its dry run
planned), trained no stored run again, and left the tables of the edited file run from scratch."""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd

from ldpbench.campaign import campaign_cells, validate_config
from ldpbench.layout import CampaignLayout, stored_summaries

from fresh_processes import Snakemake
from workflow_cli import TIMING_COLUMNS, run_snakemake, start_snakemake

TABLES = ("runs", "curves", "summary", "comparisons", "rankings", "verdicts", "tuning", "selected", "audit")
# The campaign's tables as targets: the report and MLflow are views of them, tested elsewhere.
TARGETS = tuple(f"results/edits/tables/{table}.parquet" for table in TABLES)
# Besides the timing columns: how many runs trained together depends on which runs a job had to train.
UNCOMPARED = TIMING_COLUMNS | {"trained_together"}

# The rules after the cells: what reruns when the final cells (their set or their runs) change.
AFTER_FINAL = {"manifest", "aggregate", "compare", "audit_table"}
# ... and when the tuning trials change.
TUNING = {"trials", "select"}


def cells_of(config: dict) -> dict[str, str]:
    """cell id -> phase of a campaign file, as the workflow expands it (an optional dataset whose files are
    not at hand left out)."""
    from ldpbench.data import registry

    config = validate_config(copy.deepcopy(config))
    data = config["data"]
    datasets = [entry["name"] for entry in config["datasets"]
                if not entry["optional"] or registry.get(entry["name"]).is_local(data["raw_dir"], data["mirror"])]
    return {cell.cell_id: cell.phase for cell in campaign_cells(config, datasets)}


def plan_of(output: str) -> tuple[Counter, set[str]]:
    """(jobs per rule, cell ids of the run_cell jobs) that a Snakemake run or dry run printed."""
    if "Nothing to be done" in output:
        return Counter(), set()
    stats = output.split("Job stats:")[1].split("total")[0]
    jobs = Counter({rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)$", stats, re.M)})
    cells = set(re.findall(r"output: \S*/cells/dataset=[^/]+/mechanism=[^/]+/([0-9a-f]{16})\.json", output))
    return jobs, cells


def planned(workdir: Path, config: dict, targets=TARGETS) -> tuple[Counter, set[str]]:
    """(jobs per rule, cell ids of the run_cell jobs) of a dry run."""
    result = run_snakemake(workdir, config, "--dry-run", "--cores", "2", *targets)
    assert result.returncode == 0, result.stdout[-5000:]
    return plan_of(result.stdout)


def tables(workdir: Path, campaign: str = "edits") -> dict[str, pd.DataFrame]:
    directory = CampaignLayout(workdir / "results", campaign).tables_dir
    found = {}
    for table in TABLES:
        frame = pd.read_parquet(directory / f"{table}.parquet")
        kept = frame[[column for column in frame.columns if column not in UNCOMPARED]]
        found[table] = kept.sort_values(list(kept.columns[:8])).reset_index(drop=True)
    return found


def stored(workdir: Path, campaign: str = "edits") -> dict[Path, int]:
    """Every stored run's summary and when it was written."""
    return {path: path.stat().st_mtime_ns for path in stored_summaries(workdir / "results" / campaign / "runs")}


def run(workdir: Path, config: dict, targets=TARGETS) -> str:
    """Run the campaign file; what Snakemake printed (its job stats and each job it ran)."""
    result = run_snakemake(workdir, config, "--cores", "2", *targets)
    assert result.returncode == 0, result.stdout[-5000:]
    return result.stdout


class Campaign:
    """One results directory edited step by step, and a fresh one per edited file for the reference: only
    the tables, which are what an edit is compared by (the report and MLflow are views of them)."""

    def __init__(self, root: Path, config: dict, targets: tuple[str, ...] = TARGETS, dry_run_first: bool = False):
        self.root, self.workdir, self.config, self.targets = root, root / "edited", config, targets
        self.dry_run_first = dry_run_first
        self.name = config["campaign"]
        self.reference_targets = tuple(f"results/{self.name}/tables/{table}.parquet" for table in TABLES)
        self.done: set[str] = set()  # every cell whose job has run in the edited directory
        self.references: dict[str, tuple[Path, Snakemake | None]] = {}

    def start_reference(self, config: dict) -> str:
        """Start running `config` from scratch in a fresh directory (beside the edited one's run: the two
        Snakemakes mostly wait on their own start-up and scheduling, so they share the cores well)."""
        key = json.dumps(config, sort_keys=True)
        if key not in self.references:
            workdir = self.root / f"scratch-{len(self.references)}"
            log = self.root / f"scratch-{len(self.references)}.log"
            process = start_snakemake(workdir, config, "--cores", "2", *self.reference_targets, output=log)
            self.references[key] = (workdir, process)
        return key

    def reference(self, key: str) -> dict[str, pd.DataFrame]:
        """The tables of a file run from scratch (the same file, the same tables)."""
        workdir, process = self.references[key]
        if process is not None:
            assert process.wait(timeout=600) == 0, (workdir.parent / f"{workdir.name}.log").read_text()[-5000:]
            self.references[key] = (workdir, None)
        return tables(workdir, self.name)

    def edit(self, change, *, reruns: set[str], tail: set[str]) -> set[str]:
        """Apply `change` to the campaign file and run it: it must run exactly the cells the edit adds and
        the rules named (`reruns`: besides the cells and their plans, those of the tuning; `tail`: those
        after the cells), train no stored run again, and leave the tables of the edited file run from
        scratch. With `dry_run_first`, the dry run must plan that too. Returns the new cells."""
        edited = copy.deepcopy(self.config)
        change(edited)
        # The from-scratch run goes beside the edited one's, except when the edit prepares a dataset: two
        # Snakemakes preparing one dataset into one prepared_dir at once race on its files.
        prepares = "prepare_dataset" in reruns
        reference = None if prepares else self.start_reference(edited)
        new_cells = set(cells_of(edited)) - self.done
        expected = Counter({"run_cell": len(new_cells), "plan": len(new_cells)}) + Counter(reruns | tail)
        if self.dry_run_first:
            self.assert_plan(planned(self.workdir, edited, self.targets), expected, new_cells, "the dry run")
        before = stored(self.workdir, self.name)
        self.assert_plan(plan_of(run(self.workdir, edited, self.targets)), expected, new_cells, "the run")
        after = stored(self.workdir, self.name)
        assert {path: after.get(path) for path in before} == before, "a stored run was trained again"
        self.done |= new_cells
        self.config = edited
        for table, frame in self.reference(reference or self.start_reference(edited)).items():
            pd.testing.assert_frame_equal(tables(self.workdir, self.name)[table], frame, obj=table)
        return new_cells

    @staticmethod
    def assert_plan(plan: tuple[Counter, set[str]], expected: Counter, new_cells: set[str], what: str) -> None:
        jobs, cells = plan
        assert cells == new_cells, (what, sorted(cells), sorted(new_cells))
        assert +jobs == +expected, (what, jobs, expected)

    def start(self) -> None:
        """Run the first file; its tables are the reference of any later edit back to it."""
        run(self.workdir, self.config, self.targets)
        first = self.root / "first"
        shutil.copytree(self.workdir, first)
        self.started_from(first)

    def start_from(self, first: Path) -> None:
        """Start from a copy of `first`, a directory where the first file has run."""
        shutil.copytree(first, self.workdir)
        self.started_from(first)

    def started_from(self, first: Path) -> None:
        self.done = set(cells_of(self.config))
        self.references[json.dumps(self.config, sort_keys=True)] = (first, None)
