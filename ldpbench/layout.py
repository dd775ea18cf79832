"""Where a campaign's files live: the one description of the results tree, for workflow and package.

    <results_dir>/<campaign>/
        manifest.json                      the campaign's final runs (plans, ids, labels, cells)
        trials.json                        a tuned campaign's trials (their plans and points)
        plans/<cell_id>.json               the runs of one cell, read by its job
        cells/dataset=<d>/mechanism=<m>/<cell_id>.json
                                           a cell's job is done: the runs it holds (written last)
        runs/summaries/dataset=<d>/mechanism=<m>/phase=<trial|final>/run_id=<run_id>/summary.parquet
        runs/curves/dataset=<d>/mechanism=<m>/phase=<trial|final>/run_id=<run_id>/curve.parquet
        runs/ledgers/dataset=<d>/mechanism=<m>/phase=<trial|final>/run_id=<run_id>/ledger.parquet
                                           the run store: every run trained, once, by its id (a
                                           plan's hash); one Hive tree per kind of run file, each
                                           one dataset for pyarrow, DuckDB and polars; a run's
                                           summary is published last and marks it complete
        runs/.attempts/cell=<cell_id>.attempt-<pid>-<token>/   a cell being computed: attempt.json
                                           (who, which runs, which are training) and the runs not
                                           published yet
        checkpoints/<run_id>.pt            resumable training state
        quarantine/                        corrupt runs moved aside by aggregation
        audit/<key>.parquet                the privacy audit of one (mechanism, parameters, ε of one
                                           report, classes) at the campaign's audit settings
        tables/{runs,curves,summary}.parquet           aggregation
        tables/{comparisons,rankings,verdicts}.parquet paired comparisons of the mechanisms
        tables/{tuning,selected}.parquet               trials and selected settings (with `tuning:`)
        tables/audit.parquet                           the audits (with `audit: enabled`)
        tables/scorecard.parquet                       the papers' claims read (with `scorecard.claims`)
        report/index.html and its figures
        tracking/{store,mlflow,report}.json  markers of the MLflow store, the logged campaign, its report
        mlflow-artifacts/                  artifacts of an MLflow store without a server
        progress/                          what `ldpbench status` reads: the workflow's state and
                                           cells (workflow.json), a Snakemake building its job graph
                                           (starting-<pid>.json), the jobs running (jobs/)
    logs/<campaign>/...                    job logs of the campaign (relative to the working directory)
    logs/data/, logs/features/             job logs of data preparation and feature extraction
    <prepared_dir>/<dataset>/meta.json, <features_dir>/<dataset>/<encoder>/meta.json

Functions take plain strings for their names, so the workflow builds its rule patterns by passing
Snakemake wildcards ("{cell_id}") where a value goes. Paths are built with pathlib, so a
results_dir with a trailing slash or a leading "./" names the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Files of one run directory; the summary is written last and marks a complete run.
SUMMARY_FILE = "summary.parquet"
CURVE_FILE = "curve.parquet"
LEDGER_FILE = "ledger.parquet"
# The trees of run files under runs/, one per kind, in the order a cell publishes them (summaries
# last), with the file each run has in it. Kept apart, each tree reads as one table: a reader given
# the whole runs/ directory would mix three schemas.
SUMMARIES, CURVES, LEDGERS = "summaries", "curves", "ledgers"
RUN_FILES = {CURVES: CURVE_FILE, LEDGERS: LEDGER_FILE, SUMMARIES: SUMMARY_FILE}
ATTEMPTS_DIR = ".attempts"  # hidden: pyarrow skips it, and it sits in no tree
ATTEMPT_FILE = "attempt.json"  # in an attempt directory: its process, its runs, those training now
# The phases of a campaign's runs, a Hive key of every tree: the tuning trials, then the final runs.
TRIAL, FINAL = "trial", "final"
PHASES = (TRIAL, FINAL)

# The campaign tables, <campaign>/tables/<table>.parquet, by the job that writes them: aggregation
# (summary.parquet last), the comparison of mechanisms (verdicts last) and, in a campaign with a
# `tuning:` section, the selection (selected last).
AGGREGATE_TABLES = ("runs", "curves", "summary")
COMPARE_TABLES = ("comparisons", "rankings", "verdicts")
TUNING_TABLES = ("tuning", "selected")
# The privacy audit of the mechanisms that ran (with `audit: enabled`), and the reproduction
# scorecard (with `scorecard.claims`).
AUDIT_TABLE = "audit"
SCORECARD_TABLE = "scorecard"
TABLES = AGGREGATE_TABLES + COMPARE_TABLES + TUNING_TABLES + (AUDIT_TABLE, SCORECARD_TABLE)
MANIFEST = "manifest.json"  # the campaign's run list, in its directory
TRIALS_MANIFEST = "trials.json"  # a tuned campaign's trial runs, beside it
# Directories of the campaign that the package is handed by path (beside manifest.json).
RUNS_DIR = "runs"
TABLES_DIR = "tables"
REPORT_DIR = "report"

# Report pages and figures, in <campaign>/report/.
REPORT_INDEX = "index.html"
# The report's figures, each written as PNG and SVG (same stem) into report/figures/.
FIGURES_DIR = "figures"
FIGURE_PATTERNS = ["{name}.png", "{name}.svg"]  # what Snakemake's report takes from report/figures/
ACCURACY_FIGURE = "accuracy_vs_epsilon.png"
AUC_FIGURE = "auc_vs_epsilon.png"
CURVES_FIGURE = "convergence.png"
COMMUNICATION_FIGURE = "accuracy_vs_communication.png"
PARETO_EPSILON_FIGURE = "pareto_epsilon.png"
PARETO_BITS_FIGURE = "pareto_bits.png"

# An attempt directory: cell=<id>.attempt-<pid>-<token>/, renamed to cell=<id>/ when complete.
ATTEMPT_MARK = ".attempt-"

LOGS = Path("logs")
ARTIFACTS_DIR = "mlflow-artifacts"
# Defaults of `ldpbench tracking-server`: one store for every campaign under the default results_dir.
_DEFAULT_RESULTS_DIR = Path("results")  # the campaign schema's default results_dir
SERVER_STORE = _DEFAULT_RESULTS_DIR / "mlflow.db"
SERVER_ARTIFACTS = _DEFAULT_RESULTS_DIR / ARTIFACTS_DIR
PREPARED_META = "meta.json"


def _partition(dataset: str, mechanism: str) -> Path:
    """The Hive-style partition directories of a (dataset, mechanism), shared by runs, cells and logs."""
    return Path(f"dataset={dataset}") / f"mechanism={mechanism}"


def _check_kind(kind: str) -> None:
    if kind not in RUN_FILES:
        raise ValueError(f"unknown kind of run file '{kind}'; the kinds are {', '.join(RUN_FILES)}")


def run_dir(runs_dir: str | Path, kind: str, dataset: str, mechanism: str, phase: str, run_id: str) -> Path:
    """Where one run's file of `kind` is stored: its Hive-style directory in the tree of that kind."""
    _check_kind(kind)
    if phase not in PHASES:
        raise ValueError(f"unknown phase '{phase}'; the phases are {', '.join(PHASES)}")
    return _run_path(runs_dir, kind, dataset, mechanism, phase, run_id)


def _run_path(runs_dir: str | Path, kind: str, dataset: str, mechanism: str, phase: str, run_id: str) -> Path:
    return Path(runs_dir) / kind / _partition(dataset, mechanism) / f"phase={phase}" / f"run_id={run_id}"


def run_file(runs_dir: str | Path, kind: str, dataset: str, mechanism: str, phase: str, run_id: str) -> Path:
    """One run's file of `kind` (its summary, curve or ledger) in the store."""
    return run_dir(runs_dir, kind, dataset, mechanism, phase, run_id) / RUN_FILES[kind]


def run_file_pattern(kind: str) -> str:
    """Where the run files of `kind` are, relative to a campaign's directory, "…" for each key (for docs)."""
    _check_kind(kind)
    return (_run_path(RUNS_DIR, kind, "…", "…", "…", "…") / RUN_FILES[kind]).as_posix()


def stored_summaries(runs_dir: str | Path) -> list[Path]:
    """The summary file of every run in the store (both phases)."""
    return list((Path(runs_dir) / SUMMARIES).glob(f"*/*/phase=*/run_id=*/{SUMMARY_FILE}"))


def run_id_of(run_directory: str | Path) -> str:
    """The run id of a run's directory (run_id=<id>)."""
    return Path(run_directory).name.removeprefix("run_id=")


def staged_run_dir(attempt: str | Path, run_id: str) -> Path:
    """Where an attempt writes one run's files before they are published."""
    return Path(attempt) / f"run_id={run_id}"


def attempts_dir(runs_dir: str | Path) -> Path:
    """Where processes compute cells: runs/.attempts/, outside every tree."""
    return Path(runs_dir) / ATTEMPTS_DIR


def attempt_dir(runs_dir: str | Path, cell_id: str, pid: int, token: str) -> Path:
    """The directory one process computes a cell in."""
    return attempts_dir(runs_dir) / f"{attempt_prefix(cell_id)}{pid}-{token}"


def attempt_prefix(cell_id: str) -> str:
    """What the names of every attempt directory of a cell start with."""
    return f"cell={cell_id}{ATTEMPT_MARK}"


def campaign_attempts(runs_dir: str | Path) -> list[tuple[str, int, Path]]:
    """(cell id, pid, directory) of every attempt directory of a campaign's runs (runs/.attempts/)."""
    found = []
    for attempt in attempts_dir(runs_dir).glob(f"cell=*{ATTEMPT_MARK}*"):
        cell, _, rest = attempt.name.partition(ATTEMPT_MARK)
        pid = rest.split("-", 1)[0]
        if pid.isdigit():
            found.append((cell.removeprefix("cell="), int(pid), attempt))
    return found


def figure_link(figure: str | Path, form: str) -> str:
    """The link from the report's page to one of its figures, `form` "png" or "svg"."""
    return f"{FIGURES_DIR}/{Path(figure).stem}.{form}"


def checkpoint_file(checkpoint_dir: str | Path, run_id: str) -> Path:
    return Path(checkpoint_dir) / f"{run_id}.pt"


def table_file(tables_dir: str | Path, table: str) -> Path:
    """One campaign table; `table` is one of TABLES."""
    if table not in TABLES:
        raise ValueError(f"unknown campaign table '{table}'; the tables are {', '.join(TABLES)}")
    return Path(tables_dir) / f"{table}.parquet"


def quarantine_dir(runs_dir: str | Path) -> Path:
    """Where aggregation moves corrupt runs: <campaign>/quarantine/, beside the runs tree."""
    return Path(runs_dir).parent / "quarantine"


def quarantined_run(runs_dir: str | Path, kind: str, dataset: str, mechanism: str, phase: str, run_id: str,
                    stamp: str) -> Path:
    """Where a corrupt run's directory of `kind` is moved (one flat name: kind, partition, run and time)."""
    stored = run_dir(runs_dir, kind, dataset, mechanism, phase, run_id)
    return quarantine_dir(runs_dir) / ".".join([*stored.relative_to(runs_dir).parts, stamp])


def prepared_meta(prepared_dir: str | Path, dataset: str) -> Path:
    """meta.json of a prepared dataset (written last: it stands for the whole directory)."""
    return Path(prepared_dir) / dataset / PREPARED_META


def features_meta(features_dir: str | Path, dataset: str, encoder: str) -> Path:
    """meta.json of a dataset's features by one encoder (written last)."""
    return Path(features_dir) / dataset / encoder / PREPARED_META


def prepare_log(dataset: str) -> Path:
    return LOGS / "data" / f"prepare_{dataset}.log"


def features_log(dataset: str, encoder: str, suffix: str = ".log") -> Path:
    """The job log (or, with suffix ".benchmark.tsv", the benchmark) of one feature extraction."""
    return LOGS / "features" / dataset / f"{encoder}{suffix}"


@dataclass(frozen=True)
class CampaignLayout:
    """The files of one campaign under `results_dir`, and its job logs."""

    results_dir: str | Path
    campaign: str

    @classmethod
    def at(cls, root: str | Path) -> CampaignLayout:
        """The layout of the campaign whose directory is `root` (<results_dir>/<campaign>)."""
        root = Path(root)
        return cls(root.parent, root.name)

    @property
    def root(self) -> Path:
        return Path(self.results_dir) / self.campaign

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def campaign_file(self) -> Path:
        """The campaign's configuration as resolved (its files, --config, the defaults), for the record."""
        return self.root / "campaign.yaml"

    @property
    def trials_manifest(self) -> Path:
        """A tuned campaign's trials (plans, ids, labels, the point each tries)."""
        return self.root / TRIALS_MANIFEST

    def cell_index(self, phase: str) -> Path:
        """The ids of the campaign's cells of one phase, rewritten only when they change: an input of that
        phase's manifest, so that a cell added or removed reruns it by modification time alone."""
        return self.root / f"cells-{phase}.json"

    def plan(self, cell_id: str) -> Path:
        return self.plans_dir / f"{cell_id}.json"

    @property
    def plans_dir(self) -> Path:
        return self.root / "plans"

    @property
    def runs_dir(self) -> Path:
        return self.root / RUNS_DIR

    def run_file(self, kind: str, dataset: str, mechanism: str, phase: str, run_id: str) -> Path:
        return run_file(self.runs_dir, kind, dataset, mechanism, phase, run_id)

    def cell_marker(self, dataset: str, mechanism: str, cell_id: str) -> Path:
        """Written last by a cell's job: the cell is done (its runs are in the store)."""
        return self.root / "cells" / _partition(dataset, mechanism) / f"{cell_id}.json"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tables_dir(self) -> Path:
        return self.root / TABLES_DIR

    def table(self, table: str) -> Path:
        return table_file(self.tables_dir, table)

    @property
    def audits_dir(self) -> Path:
        """The privacy audits of the campaign, one file per audited configuration (ldpbench.audit)."""
        return self.root / "audit"

    @property
    def progress_dir(self) -> Path:
        """What `ldpbench status` reads besides the runs: the workflow's state, the jobs running."""
        return self.root / "progress"

    @property
    def report_dir(self) -> Path:
        return self.root / REPORT_DIR

    def report(self, name: str = REPORT_INDEX) -> Path:
        """The report's index page."""
        return self.report_dir / name

    @property
    def figures_dir(self) -> Path:
        """The report's figures, PNG and SVG (the page embeds the PNGs: it resolves wherever it is shown)."""
        return self.report_dir / FIGURES_DIR

    @property
    def tracking_store(self) -> Path:
        """Marker of the created MLflow store and experiment."""
        return self.root / "tracking" / "store.json"

    @property
    def tracking_marker(self) -> Path:
        """Marker of the logged campaign (run id → MLflow run id)."""
        return self.root / "tracking" / "mlflow.json"

    @property
    def tracking_report_marker(self) -> Path:
        """Marker of the report attached to the logged campaign's run."""
        return self.root / "tracking" / "report.json"

    @property
    def artifacts_dir(self) -> Path:
        return self.root / ARTIFACTS_DIR

    @property
    def log_dir(self) -> Path:
        return LOGS / self.campaign

    def log(self, job: str) -> Path:
        """The log of one of the campaign's single jobs (manifest, aggregate, report, ...)."""
        return self.log_dir / f"{job}.log"

    def plan_log(self, cell_id: str) -> Path:
        return self.log_dir / "plans" / f"{cell_id}.log"

    def cell_log(self, dataset: str, mechanism: str, cell_id: str) -> Path:
        return self.log_dir / "runs" / _partition(dataset, mechanism) / f"{cell_id}.log"
