"""The edit loop of a researcher: run a campaign, edit its file, run again. Every edit reruns exactly what
it changes (the run executes exactly the cells the edited file adds, as its dry run planned; a stored run
is never trained again) and the tables then equal those of the edited file run from scratch. An edit back
to an earlier file trains nothing."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from ldpbench.campaign import campaign_cells, validate_config
from ldpbench.layout import CampaignLayout, stored_summaries

from workflow_cli import TIMING_COLUMNS, environment, run_snakemake, small_config, snakemake_command

pytestmark = pytest.mark.integration

TABLES = ("runs", "curves", "summary", "comparisons", "rankings", "verdicts", "tuning", "selected", "audit")
# The campaign's tables as targets: the report and MLflow are views of them, tested elsewhere.
TARGETS = tuple(f"results/edits/tables/{table}.parquet" for table in TABLES)
REPO = Path(__file__).resolve().parents[2]
# Besides the timing columns: how many runs trained together depends on which runs a job had to train.
UNCOMPARED = TIMING_COLUMNS | {"trained_together"}


def base_config(prepared: Path) -> dict:
    """A tuned campaign of a few cells: NP and PM on syn-S at two ε and two seeds, the learning rate tuned."""
    config = small_config(name="edits", prepared_dir=prepared, mechanisms=("np", "pm"), epsilons=(1, 4),
                          seeds=(0, 1), rounds=10)
    config["tuning"] = {"space": {"learning_rate": [0.03, 0.3]}}
    config["tracking"] = {"enabled": False}
    return config


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
    """One results directory edited step by step, and a fresh one per edited file for the reference."""

    def __init__(self, root: Path, config: dict, targets: tuple[str, ...] = TARGETS, dry_run_first: bool = False):
        self.root, self.workdir, self.config, self.targets = root, root / "edited", config, targets
        self.dry_run_first = dry_run_first
        self.name = config["campaign"]
        self.done: set[str] = set()  # every cell whose job has run in the edited directory
        self.references: dict[str, tuple[Path, subprocess.Popen | None]] = {}

    def start_reference(self, config: dict) -> str:
        """Start running `config` from scratch in a fresh directory (beside the edited one's run: the two
        Snakemakes mostly wait on their own start-up and scheduling, so they share the cores well)."""
        key = json.dumps(config, sort_keys=True)
        if key not in self.references:
            workdir = self.root / f"scratch-{len(self.references)}"
            log = (self.root / f"scratch-{len(self.references)}.log").open("w")
            process = subprocess.Popen(snakemake_command(workdir, config, "--cores", "2", *self.targets),
                                       env=environment(), stdout=log, stderr=subprocess.STDOUT)
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


@pytest.fixture(scope="session")
def first_run(tmp_path_factory) -> tuple[dict, Path]:
    """The base campaign file and a directory where it has run: each chain of edits starts from a copy."""
    root = tmp_path_factory.mktemp("edits-first")
    config = base_config(root / "prepared")
    run(root / "first", config)
    return config, root / "first"


def edited_campaign(tmp_path: Path, first_run: tuple[dict, Path]) -> Campaign:
    config, first = first_run
    campaign = Campaign(tmp_path, copy.deepcopy(config))
    campaign.start_from(first)
    return campaign


# The rules after the cells: what reruns when the final cells (their set or their runs) change.
AFTER_FINAL = {"manifest", "aggregate", "compare", "audit_table"}
# ... and when the tuning trials change.
TUNING = {"trials", "select"}


# The edits a researcher makes, in four chains from the same first run (so that they run side by side):
# each edit applies to the file the one before it left.
@pytest.mark.slow
def test_epsilon_edits_rerun_exactly_what_they_change(tmp_path, first_run):
    campaign = edited_campaign(tmp_path, first_run)
    # ε: added (its trials and final cell), changed, removed (nothing to train).
    new = campaign.edit(lambda c: c.update(epsilons=[1, 2, 4]), reruns=TUNING, tail=AFTER_FINAL)
    assert Counter(cells_of(campaign.config)[cell] for cell in new) == {"trial": 1, "final": 1}
    campaign.edit(lambda c: c.update(epsilons=[1, 2, 8]), reruns=TUNING, tail=AFTER_FINAL)
    assert campaign.edit(lambda c: c.update(epsilons=[1, 8]), reruns=TUNING, tail=AFTER_FINAL) == set()


@pytest.mark.slow
def test_seed_and_mechanism_edits_rerun_exactly_what_they_change(tmp_path, first_run):
    campaign = edited_campaign(tmp_path, first_run)
    # A seed: added (every final cell is new and trains that seed alone; the tuning seed is unchanged),
    # then removed again (the earlier cells are done: nothing runs but the tables).
    new = campaign.edit(lambda c: c.update(seeds=[0, 1, 2]), reruns=set(), tail=AFTER_FINAL)
    assert Counter(cells_of(campaign.config)[cell] for cell in new) == {"final": 3}
    assert campaign.edit(lambda c: c.update(seeds=[0, 1]), reruns=set(), tail=AFTER_FINAL) == set()
    # A mechanism entry: added, its parameter changed, removed.
    ps_pm = {"name": "ps-pm", "label": "ps-pm", "params": {"mu": 0.1}}
    campaign.edit(lambda c: c["mechanisms"].append(copy.deepcopy(ps_pm)), reruns=TUNING, tail=AFTER_FINAL)
    campaign.edit(lambda c: c["mechanisms"][-1]["params"].update(mu=0.2), reruns=TUNING, tail=AFTER_FINAL)
    assert campaign.edit(lambda c: c["mechanisms"].pop(), reruns=TUNING, tail=AFTER_FINAL) == set()


@pytest.mark.slow
def test_dataset_model_and_tuning_edits_rerun_exactly_what_they_change(tmp_path, first_run):
    campaign = edited_campaign(tmp_path, first_run)
    # A dataset and a model.
    campaign.edit(lambda c: c["datasets"].append({"name": "syn-S-0.01-0.9"}), reruns=TUNING | {"prepare_dataset"},
                  tail=AFTER_FINAL)
    campaign.edit(lambda c: c.update(models=["lr", "svm"]), reruns=TUNING, tail=AFTER_FINAL)
    # The tuning: a grid point (every trial and tuned cell is new; only the new point's trials train, and
    # a final run whose selection stays is not trained again), then the metric (the trial cells, which
    # say how their runs are scored, are new; none of their runs trains again).
    campaign.edit(lambda c: c["tuning"]["space"]["learning_rate"].append(0.1), reruns=TUNING, tail=AFTER_FINAL)
    campaign.edit(lambda c: c["tuning"].update(metric="validation_loss"), reruns=TUNING, tail=AFTER_FINAL)


@pytest.mark.slow
def test_training_fold_and_audit_edits_rerun_exactly_what_they_change_and_an_edit_back_trains_nothing(
        tmp_path, first_run):
    campaign = edited_campaign(tmp_path, first_run)
    first = copy.deepcopy(campaign.config)
    # A training setting and the fold count: every run changes.
    campaign.edit(lambda c: c["training"].update(l2=0.001), reruns=TUNING, tail=AFTER_FINAL)
    campaign.edit(lambda c: c.update(split={"folds": 2}), reruns=TUNING, tail=AFTER_FINAL)
    # The audit's settings: no cell, the audit table alone (it computes the audits they need).
    campaign.edit(lambda c: c["audit"].update(samples=30_000), reruns=set(), tail={"audit_table"})
    # Back to the first file: every cell is done; only the tables are written again.
    assert campaign.edit(lambda c: (c.clear(), c.update(copy.deepcopy(first))), reruns=TUNING,
                         tail=AFTER_FINAL) == set()


@pytest.mark.slow
def test_the_default_campaign_takes_a_seed_and_a_new_epsilon(tmp_path):
    """The issue's own cases, on config/config.yaml itself (syn-L; UCI Adult is left out where its files are
    not at hand, as here): a fourth seed, then ε 8 -> 4, each planned exactly, and the tables, the report and
    MLflow those of the edited file."""
    import yaml

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["results_dir"] = "results"
    config["data"].update(raw_dir=str(tmp_path / "raw"), prepared_dir=str(tmp_path / "prepared"), mirror=None)
    config["tracking"]["uri"] = "sqlite:///results/mlflow.db"
    targets = (*(f"results/default/tables/{table}.parquet" for table in TABLES), "results/default/report/index.html",
               "results/default/tracking/mlflow.json")
    campaign = Campaign(tmp_path, config, targets, dry_run_first=True)
    campaign.start()
    views = {"report", "track", "campaign_file"}  # the report, MLflow and the campaign file MLflow attaches
    # A seed: a new final cell per configuration, each training that seed alone.
    new = campaign.edit(lambda c: c.update(seeds=[0, 1, 2, 3]), reruns=set(), tail=AFTER_FINAL | views)
    assert len(new) == len([c for c in cells_of(campaign.config).values() if c == "final"]) == 7
    runs = tables(campaign.workdir, "default")["runs"]
    assert sorted(runs["seed"].unique()) == [0, 1, 2, 3] and len(runs) == 7 * 4
    assert_mlflow_matches_the_tables(campaign.workdir)
    # ε 8 -> 4: PM and PS-PM at ε = 4, their trials and final cells; nothing else.
    new = campaign.edit(lambda c: c.update(epsilons=[0.5, 2, 4]), reruns=TUNING, tail=AFTER_FINAL | views)
    assert Counter(cells_of(campaign.config)[cell] for cell in new) == {"trial": 2, "final": 2}
    assert set(tables(campaign.workdir, "default")["summary"]["epsilon"]) == {0.5, 2.0, 4.0, float("inf")}
    assert_mlflow_matches_the_tables(campaign.workdir)
    # The README's query over the run store: the learning rates tried, by phase, of every run trained
    # (the ε = 8 runs stay in the store: they left the tables only).
    import duckdb

    query = (REPO / "README.md").read_text().split("```sql\n")[1].split("```")[0]
    found = duckdb.sql(query.replace("'results/", f"'{campaign.workdir}/results/")).df()
    trials = found[found["phase"] == "trial"]
    assert set(trials["learning_rate"]) == {0.03, 0.1, 0.3} and set(found["phase"]) == {"trial", "final"}
    assert set(found["epsilon"]) == {0.5, 2.0, 4.0, 8.0, float("inf")}
    assert found.loc[found["phase"] == "final", "runs"].sum() == len(stored(campaign.workdir, "default")) - \
        trials["runs"].sum()


def assert_mlflow_matches_the_tables(workdir: Path) -> None:
    """MLflow, a view of the tables: a live run per run of the tables and a configuration per summary row
    with its mean."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'results' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ldpbench/default")
    logged = client.search_runs([experiment.experiment_id], max_results=1000)
    by_level = {}
    for run in logged:
        by_level.setdefault(run.data.tags["ldpbench.level"], []).append(run)
    runs, summary = tables(workdir, "default")["runs"], tables(workdir, "default")["summary"]
    assert sorted(run.data.tags["run_key"] for run in by_level["run"]) == sorted(runs["run_id"])
    means = {(run.data.params["label"], run.data.tags["epsilon"]): run.data.metrics["test_accuracy_mean"]
             for run in by_level["configuration"]}
    assert means == pytest.approx({(row.label, f"{row.epsilon:g}"): row.mean for row in summary.itertuples()})


@pytest.mark.slow
def test_an_edit_reruns_what_it_changes_without_snakemakes_records(tmp_path, first_run):
    """Snakemake's "set of input files changed" trigger reads its records of the last run under
    .snakemake/; with them gone (deleted, or the results moved to another checkout) an added ε planned
    nothing and the tables silently lacked it. The phases' cell indexes rerun the manifests by time."""
    config, first = first_run
    campaign = Campaign(tmp_path, copy.deepcopy(config), dry_run_first=True)
    campaign.start_from(first)
    shutil.rmtree(campaign.workdir / ".snakemake")
    new = campaign.edit(lambda c: c.update(epsilons=[1, 2, 4]), reruns=TUNING, tail=AFTER_FINAL)
    assert len(new) == 2  # the new ε's trial cell and final cell, trained and in the tables
    assert 2.0 in set(tables(campaign.workdir)["summary"]["epsilon"])
