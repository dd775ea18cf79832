"""The column map: every run file and campaign table, declared once with its ordered columns.

Each column has its Arrow type, whether it may be null, a one-line meaning and, where a view shows it,
its report heading and how MLflow shows it. The writers take column order and types from here
(`frame_to_table`, `write_table`): a table written with a column the map lacks, or without one it
declares, fails naming the table and the column. The run files are the source of truth: every later
table, figure and MLflow run is derived from them, and they are read back against these schemas (a
missing column or wrong type is an error that names the file). `python -m ldpbench.results.schema >
docs/tables.md` renders the map; tests/test_docs.py checks that the committed page equals it, and
tests/column_map.py checks a campaign's tables against it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from ldpbench.errors import LdpbenchError
from ldpbench.layout import CURVES, LEDGERS, SUMMARIES, TABLES_DIR, run_file_pattern, table_file

STRING, FLOAT, INT, BOOL = pa.string(), pa.float64(), pa.int64(), pa.bool_()
# How MLflow shows a column (ldpbench.results.tracking_entries): a run's final value as a tag
# `final.<name>` (a tag keeps ∞ visible), a metric of the configuration or campaign run as it is, or a
# metric at each evaluated round.
FINAL_TAG, METRIC, STEP_METRIC = "tag final.<name>", "metric", "metric per round"


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    meaning: str
    nullable: bool = True
    heading: str = ""  # the report's heading of the column, where the report shows it under its own name
    mlflow: str = ""  # FINAL_TAG, METRIC or STEP_METRIC where MLflow shows it under its own name
    added: bool = False  # run files: absent from files written by earlier versions, read as nulls

    @property
    def field(self) -> pa.Field:
        return pa.field(self.name, self.type, nullable=self.nullable)


@dataclass(frozen=True)
class Table:
    name: str
    file: str  # where it is, relative to the campaign's directory
    written_by: str
    meaning: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    def schema(self) -> pa.Schema:
        return pa.schema([column.field for column in self.columns])

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"table '{self.name}' has no column '{name}' in the column map (ldpbench/results/schema.py)")


class ColumnMapError(LdpbenchError):
    """A table does not follow the column map: a column it lacks, one the map does not declare, a wrong type."""


# ---------------------------------------------------------------------------- columns of several tables
# Declared once; a table takes one by name, or with a setting of its own (`_use`).
SHARED = {column.name: column for column in [
    Column("campaign", STRING, "the campaign's name", nullable=False),
    Column("run_id", STRING, "the run's id: a hash of its canonical plan", nullable=False),
    Column("cell_id", STRING, "the cell (group of runs one job trains) the run belongs to", nullable=False),
    Column("dataset", STRING, "the dataset's registry name", nullable=False),
    Column("model", STRING, "the model's registry name", nullable=False),
    Column("label", STRING, "the mechanism entry's label in the campaign (a mechanism with its parameters)",
           nullable=False),
    Column("mechanism", STRING, "the mechanism's registry name", nullable=False),
    Column("mechanism_params", STRING, "the mechanism's parameters as canonical JSON", nullable=False),
    Column("epsilon", FLOAT, "the campaign's privacy budget ε of the configuration; ∞ for non-private mechanisms",
           nullable=False, heading="ε"),
    Column("seed", INT, "the replicate's seed: it fixes the split, partition, cohorts and start", nullable=False),
    Column("fold", INT, "the cross-validation fold", nullable=False),
    Column("status", STRING, "ok or diverged", nullable=False),
    Column("test_accuracy", FLOAT, "test accuracy"),
    Column("test_auc", FLOAT, "test ROC AUC: binary, or macro one-vs-rest for several classes"),
    Column("test_loss", FLOAT, "test cross-entropy loss"),
    Column("train_loss", FLOAT, "training loss"),
    Column("validation_accuracy", FLOAT, "accuracy on the validation clients; NaN without them"),
    Column("validation_auc", FLOAT, "ROC AUC on the validation clients; NaN without them"),
    Column("validation_loss", FLOAT, "loss on the validation clients; NaN without them"),
    Column("classes", INT, "the task's classes (the random-guess reference is 1/classes)"),
    Column("epsilon_per_report", FLOAT, "the budget one report is created with: ε, or with epsilon_scope total "
           "ε split over the most reports a client can send", heading="ε / report"),
    Column("epsilon_claimed_per_report", FLOAT, "ε of one report as the mechanism claims it",
           heading="claimed ε / report"),
    Column("epsilon_worst_case_per_report", FLOAT, "ε of one report in the worst case: the largest log-ratio of "
           "report probabilities over two inputs", heading="worst-case ε / report"),
    Column("bits_per_report", FLOAT, "uplink bits of one report", heading="uplink bits / report"),
    Column("reports_per_client_max", INT, "the most reports one client sent"),
    Column("epsilon_claimed_client_max", FLOAT, "the largest claimed ε one client spent (basic composition over "
           "its reports)", heading="claimed ε / client"),
    Column("epsilon_worst_case_client_max", FLOAT, "the largest worst-case ε one client spent (basic composition "
           "over its reports)", heading="worst-case ε / client"),
    Column("uplink_bits_total", FLOAT, "uplink bits all clients sent"),
    Column("train_seconds", FLOAT, "training time (a group trained together: its time ÷ its size)"),
    Column("metric", STRING, "the metric the row is about (test_accuracy or test_auc)", nullable=False),
    Column("mean", FLOAT, "the metric's mean over the seeds of the ok runs (each seed's folds averaged)"),
    Column("ci95_low", FLOAT, "lower end of the mean's 95 % interval over seeds (a bounded metric's: from its "
           "logits, mapped back)"),
    Column("ci95_high", FLOAT, "upper end of the mean's 95 % interval over seeds"),
    Column("uplink_bits_total_mean", FLOAT, "uplink bits all clients sent, mean over the configuration's runs"),
    Column("runs_unconverged", INT, "ok runs whose test accuracy still moved over their last quarter"),
    Column("epsilon_worst_case_client_total", FLOAT, "worst-case ε per client of the final run plus its tuning "
           "trials", heading="worst-case ε / client (with tuning)"),
    Column("tuning_epsilon_claimed_client_max", FLOAT, "claimed ε per client the tuning trials spent (their "
           "per-trial maxima summed; 0 untuned or tuned on public data)"),
    Column("tuning_epsilon_worst_case_client_max", FLOAT, "worst-case ε per client the tuning trials spent "
           "(their per-trial maxima summed; 0 untuned or tuned on public data)"),
    Column("point", INT, "the index of the tuning point in the search space's order", nullable=False),
    Column("setting", STRING, "the tuning point as canonical JSON (training keys, params.<name>)", nullable=False),
    Column("score", FLOAT, "the tuning metric: a trial's final value, or the point's mean over tuning seeds"),
    Column("direction", STRING, "whether the tuning metric is maximised or minimised", nullable=False),
    Column("n_pairs", INT, "seeds both mechanisms ran with a finite metric (the replicates paired)"),
    Column("alpha", FLOAT, "the test's significance level"),
    Column("p_value_adjusted", FLOAT, "the paired test's p-value after Holm's adjustment within its family"),
    Column("dims", INT, "the dimension of one report's input"),
    Column("verdict", STRING, "the result in words", nullable=False),
]}


def _use(name: str, **settings) -> Column:
    """A shared column with settings of this table (its meaning here, its MLflow view)."""
    return replace(SHARED[name], **settings)


def _columns(*items: str | Column) -> tuple[Column, ...]:
    return tuple(SHARED[item] if isinstance(item, str) else item for item in items)


# ---------------------------------------------------------------------------- run files
RUN_KEY = _columns("run_id", "dataset", "model", "mechanism", "mechanism_params", "epsilon", "seed", "fold")

RUN_SUMMARY = Table(
    "summary (run file)", run_file_pattern(SUMMARIES),
    "ldpbench.runner (every run; written last: its presence marks a complete run)",
    "one row: the run's plan, final metrics, accounting and costs", RUN_KEY + _columns(
        Column("plan", STRING, "the canonical run plan JSON (RunPlan.canonical_json)", nullable=False),
        "status", "test_accuracy", "test_auc", "test_loss", "train_loss",
        Column("rounds", INT, "rounds trained"),
        Column("rounds_planned", INT, "rounds the plan asked for (the plateau stop may end a run earlier)"),
        Column("epochs", INT, "local epochs per round"),
        Column("clients", INT, "clients in the run's partition"),
        Column("records", INT, "training records (clients may hold several)"),
        Column("test_records", INT, "test records"),
        "dims", "epsilon_per_report", "epsilon_claimed_per_report", "epsilon_worst_case_per_report",
        Column("delta_claimed_per_report", FLOAT, "δ of an (ε, δ) claim of one report; 0 for pure ε"),
        "bits_per_report", "reports_per_client_max", "epsilon_claimed_client_max", "epsilon_worst_case_client_max",
        "uplink_bits_total", "train_seconds",
        Column("wall_seconds", FLOAT, "wall time of the run: its training time and what it took outside training"),
        Column("started_at", STRING, "when the run started (ISO 8601)"),
        Column("finished_at", STRING, "when the run finished (ISO 8601)"),
        Column("ldpbench_version", STRING, "the ldpbench version that ran it"),
        Column("torch_version", STRING, "the PyTorch version that ran it"),
        _use("classes", added=True),
        Column("features_provenance", STRING, "JSON: encoder, weights and their hash, pooling (pretrained "
               "features); null for raw data", added=True),
        _use("validation_accuracy", added=True), _use("validation_auc", added=True),
        _use("validation_loss", added=True),
        Column("validation_records", INT, "records of the validation clients", added=True),
        Column("stopped_early", BOOL, "the plateau stop (training.stop) ended the run", added=True),
        Column("gradients", STRING, "how the clients' gradients were computed: closed-form, vmap, per-client or "
               "fused (training.gradients)", added=True),
        Column("trained_together", INT, "runs of its cell trained round by round with this one, itself included "
               "(1: alone)", added=True),
        Column("test_majority_accuracy", FLOAT, "test accuracy of always predicting the training split's majority "
               "class", added=True),
        *(Column(f"{split}_digest", STRING, f"the records of its {split} split: the first 16 hex digits of the "
                 f"sha256 of the data files' digests and the split's sorted record indices{absent}", added=True)
          for split, absent in (("training", ""), ("validation", "; null without validation clients"),
                                ("test", "; null without a test split (trials on public data)")))
    ))

RUN_CURVE = Table(
    "curve (run file)", run_file_pattern(CURVES), "ldpbench.runner",
    "the run's metrics at each evaluated round", _columns(
        "run_id",
        Column("round", INT, "the round after which the metrics were evaluated (0: before training)",
               nullable=False),
        Column("epoch", INT, "local epochs run by then", nullable=False),
        "test_accuracy", "test_auc", "test_loss", "train_loss", "validation_accuracy", "validation_auc",
        "validation_loss",
    ))

RUN_LEDGER = Table(
    "ledger (run file)", run_file_pattern(LEDGERS), "ldpbench.runner",
    "the privacy spent by each client of the run", _columns(
        Column("client", INT, "the client's index in the run's partition into clients", nullable=False),
        Column("reports", INT, "reports the client sent", nullable=False),
        Column("epsilon_claimed", FLOAT, "claimed ε the client spent (basic composition)", nullable=False),
        Column("epsilon_worst_case", FLOAT, "worst-case ε the client spent (basic composition)", nullable=False),
    ))

RUN_FILES = (RUN_SUMMARY, RUN_CURVE, RUN_LEDGER)
SUMMARY_SCHEMA = RUN_SUMMARY.schema()
CURVE_SCHEMA = RUN_CURVE.schema()
LEDGER_SCHEMA = RUN_LEDGER.schema()
# Columns a run file written by an earlier version may lack; they are read as nulls.
ADDED_FIELDS = frozenset(column.name for column in RUN_SUMMARY.columns if column.added)

# ---------------------------------------------------------------------------- campaign tables
_FINAL = {"test_accuracy", "test_auc", "test_loss", "train_loss", "rounds", "train_seconds", "wall_seconds",
          "epsilon_per_report", "epsilon_claimed_per_report", "epsilon_worst_case_per_report", "bits_per_report",
          "epsilon_claimed_client_max", "epsilon_worst_case_client_max", "uplink_bits_total"}
_RUN_COLUMNS = tuple(replace(column, added=False, mlflow=FINAL_TAG if column.name in _FINAL else "")
                     for column in RUN_SUMMARY.columns)


def _campaign_table(name: str, written_by: str, meaning: str, columns: tuple[Column, ...]) -> Table:
    """A table of the campaign's tables directory, at its file in the layout."""
    return Table(name, table_file(TABLES_DIR, name).as_posix(), written_by, meaning, columns)


def _tables(*tables: Table) -> dict[str, Table]:
    return {table.name: table for table in tables}


TABLES = _tables(
    _campaign_table("runs", "ldpbench aggregate (ldpbench.results.tables)",
          "one row per run of the manifest: its run file's summary with its label, cell and convergence",
          _columns("campaign", _RUN_COLUMNS[0], "label", "cell_id", *_RUN_COLUMNS[1:],
                   Column("final_slope", FLOAT, "relative change of the test accuracy over the last quarter of "
                          "the rounds (ldpbench.results.convergence); NaN with too few points"),
                   Column("converged", BOOL, "stopped by the plateau stop, or |final_slope| within the threshold",
                          nullable=False))),
    _campaign_table("curves", "ldpbench aggregate (ldpbench.results.tables)",
          "every run's curve points, with the run's keys",
          tuple(replace(column, mlflow=STEP_METRIC) if column.name in
                {"test_accuracy", "test_auc", "test_loss", "train_loss"} else column for column in RUN_CURVE.columns)
          + _columns("dataset", "model", "label", "mechanism", "epsilon", "seed", "fold")),
    _campaign_table("summary", "ldpbench aggregate (ldpbench.results.tables)",
          "one row per configuration (dataset, model, label, ε): the test accuracy and AUC over its seeds, its "
          "accounting, costs and tuning",
          _columns(
              "campaign", "dataset", "model", "label", "mechanism", "mechanism_params", "epsilon",
              _use("metric", meaning="the metric of mean, std and ci95_* (test_accuracy)"),
              Column("runs", INT, "runs of the configuration", nullable=False, mlflow=METRIC),
              Column("runs_ok", INT, "its runs that finished ok", nullable=False, mlflow=METRIC),
              Column("seeds", INT, "seeds with an ok run (the replicates)", nullable=False, mlflow=METRIC),
              Column("runs_diverged", INT, "its runs that diverged", nullable=False, mlflow=METRIC),
              _use("runs_unconverged", nullable=False, mlflow=METRIC),
              "mean",
              Column("std", FLOAT, "standard deviation of the seeds' means"),
              "ci95_low", "ci95_high",
              Column("auc_mean", FLOAT, "test AUC, mean over the seeds of the ok runs"),
              Column("auc_std", FLOAT, "standard deviation of the seeds' test AUC"),
              Column("auc_ci95_low", FLOAT, "lower end of the test AUC's 95 % interval over seeds"),
              Column("auc_ci95_high", FLOAT, "upper end of the test AUC's 95 % interval over seeds"),
              Column("majority_accuracy", FLOAT, "test accuracy of the majority class, mean over seeds; NaN "
                     "unknown", mlflow=METRIC),
              Column("trivial", BOOL, "test accuracy not shown above the majority class; null unknown"),
              Column("auc_trivial", BOOL, "test AUC not shown above 0.5"),
              "classes", _use("uplink_bits_total_mean", mlflow=METRIC),
              Column("train_seconds_mean", FLOAT, "training time, mean over the runs", mlflow=METRIC),
              *(_use(name, mlflow=METRIC) for name in (
                  "epsilon_per_report", "epsilon_claimed_per_report", "epsilon_worst_case_per_report",
                  "bits_per_report", "reports_per_client_max", "epsilon_claimed_client_max",
                  "epsilon_worst_case_client_max")),
              Column("tuned", BOOL, "the configuration's setting was selected by tuning", nullable=False),
              Column("selected_setting", STRING, "the tuning point selected (canonical JSON); null untuned"),
              Column("tuning_data", STRING, "what the trials trained on: private or public; null untuned"),
              _use("tuning_epsilon_claimed_client_max", mlflow=METRIC),
              _use("tuning_epsilon_worst_case_client_max", mlflow=METRIC),
              Column("epsilon_claimed_client_total", FLOAT, "claimed ε per client of the final run plus its "
                     "tuning trials", mlflow=METRIC, heading="claimed ε / client (with tuning)"),
              _use("epsilon_worst_case_client_total", mlflow=METRIC),
          )),
    _campaign_table("tuning", "ldpbench select (ldpbench.tuning)",
          "one row per tuning trial run: the point it tried and its score",
          _columns(
              "campaign", "dataset", "model", "label", "mechanism", "epsilon", "point", "setting", "seed", "fold",
              "run_id", "status", _use("score", meaning="the trial's final value of the tuning metric"),
              Column("metric", STRING, "the tuning metric (a validation metric)", nullable=False),
              "direction",
              Column("data", STRING, "what the trials trained on: private or public", nullable=False),
              "epsilon_claimed_client_max", "epsilon_worst_case_client_max",
          )),
    _campaign_table("selected", "ldpbench select (ldpbench.tuning)",
          "one row per tuned configuration: the point selected and what the tuning spent",
          _columns(
              "campaign", "dataset", "model", "label", "mechanism", "epsilon", "point", "setting",
              _use("score", meaning="the selected point's mean score over the tuning seeds"),
              Column("metric", STRING, "the tuning metric (a validation metric)", nullable=False),
              "direction",
              Column("trials", INT, "points tried", nullable=False, heading="points tried"),
              Column("trial_runs", INT, "trial runs (points × tuning seeds)", nullable=False, heading="trial runs"),
              Column("tuning_data", STRING, "what the trials trained on: private or public", nullable=False),
              "tuning_epsilon_claimed_client_max", "tuning_epsilon_worst_case_client_max",
          )),
    _campaign_table("comparisons", "ldpbench compare (ldpbench.results.compare)",
          "one row per pair of private mechanisms in a family (dataset, model, ε, metric): the paired test",
          _columns(
              "dataset", "model", "epsilon", "metric",
              Column("mechanism_a", STRING, "the pair's first label (the family ordered by mean, highest first)",
                     nullable=False),
              Column("mechanism_b", STRING, "the pair's second label", nullable=False),
              "n_pairs",
              Column("mean_a", FLOAT, "a's mean over the paired seeds"),
              Column("mean_b", FLOAT, "b's mean over the paired seeds"),
              Column("mean_diff", FLOAT, "mean of the per-seed differences a − b"),
              Column("sd_diff", FLOAT, "standard deviation of the per-seed differences"),
              _use("ci95_low", meaning="lower end of the paired-t 95 % interval of the mean difference"),
              _use("ci95_high", meaning="upper end of the paired-t 95 % interval of the mean difference"),
              Column("effect_size", FLOAT, "d_z: the mean difference ÷ the differences' standard deviation"),
              Column("effect_ci95_low", FLOAT, "lower end of d_z's 95 % interval (noncentral t)"),
              Column("effect_ci95_high", FLOAT, "upper end of d_z's 95 % interval (noncentral t)"),
              Column("test", STRING, "the paired test: paired t-test or Wilcoxon signed-rank test", nullable=False),
              Column("statistic", FLOAT, "the test's statistic"),
              Column("p_value", FLOAT, "the test's two-sided p-value; NaN with fewer than 2 pairs"),
              "p_value_adjusted",
              Column("better", STRING, "a, b or tie: which is better after Holm at alpha", nullable=False),
              "alpha",
          )),
    _campaign_table("rankings", "ldpbench compare (ldpbench.results.compare)",
          "one row per private mechanism in a family: its rank, letter group and Pareto fronts",
          _columns(
              "dataset", "model", "epsilon", "metric", "label",
              _use("mean", meaning="the configuration's mean of the metric (the summary's)"),
              _use("ci95_low", meaning="lower end of its 95 % interval (the summary's)"),
              _use("ci95_high", meaning="upper end of its 95 % interval (the summary's)"),
              Column("rank", INT, "1 + the mechanisms significantly better (after Holm)", nullable=False,
                     mlflow=METRIC),
              Column("group", STRING, "letters: mechanisms sharing one cannot be separated", nullable=False),
              Column("top", BOOL, "in the top group (rank 1)", nullable=False, mlflow=METRIC),
              "epsilon_worst_case_client_total", "uplink_bits_total_mean", "runs_unconverged",
              Column("trivial", BOOL, "not shown better than a constant predictor in this metric", nullable=False),
              Column("pareto_epsilon", BOOL, "on the front of mean against worst-case ε per client (with tuning)",
                     nullable=False, mlflow=METRIC),
              Column("pareto_bits", BOOL, "on the front of mean against uplink bits", nullable=False,
                     mlflow=METRIC),
          )),
    _campaign_table("verdicts", "ldpbench compare (ldpbench.results.compare)",
          "one row per family: the best mechanism, or those the data cannot separate from it",
          _columns(
              "dataset", "model", "epsilon", "metric",
              Column("best", STRING, "the top group's labels", nullable=False),
              _use("verdict", meaning="the top label, or 'tie: A, B', naming trivial ones"),
              Column("mechanisms", INT, "private mechanisms in the family", nullable=False),
              _use("n_pairs", meaning="the fewest paired seeds of the family's pairs", heading="paired seeds"),
              Column("best_mean", FLOAT, "the best mechanism's mean"),
              Column("best_ci95_low", FLOAT, "lower end of its 95 % interval"),
              Column("best_ci95_high", FLOAT, "upper end of its 95 % interval"),
              _use("epsilon_worst_case_client_total", meaning="the best mechanism's worst-case ε per client "
                   "(with tuning)"),
              _use("bits_per_report", meaning="the best mechanism's uplink bits of one report"),
              Column("unconverged", BOOL, "a mechanism of the top group has unconverged runs", nullable=False),
              Column("trivial", STRING, "the top group's labels not shown better than a constant predictor",
                     nullable=False),
          )),
    _campaign_table("audit", "ldpbench audit-table (ldpbench.audit)",
          "one row per audited (mechanism, parameters, ε of one report): the lower bound on ε found",
          _columns(
              "mechanism",
              Column("params", STRING, "the mechanism's campaign parameters, as JSON"),
              _use("epsilon", meaning="the budget of one report it was created with", heading=""),
              "dims",
              Column("claimed", FLOAT, "claimed ε of one report", heading="claimed ε"),
              Column("worst_case", FLOAT, "worst-case ε of one report", heading="worst-case ε"),
              Column("audited_lower_bound", FLOAT, "the audit's lower bound on ε (ln of the Clopper–Pearson "
                     "bounds' ratio)", heading="audited ε ≥"),
              Column("samples", INT, "reports drawn per input of each pair", heading="reports per input"),
              Column("pairs", INT, "input pairs audited"),
              Column("pair", STRING, "the pair that gave the bound"),
              Column("event", STRING, "the distinguishing event that gave the bound"),
              _use("alpha", meaning="the level at which the bound holds (two one-sided bounds at alpha/2)"),
              _use("verdict", meaning="consistent, claim exceeded or defect (bound above the worst case)"),
          )),
    _campaign_table("scorecard", "ldpbench scorecard (ldpbench.scorecard)",
          "one row per paper claim and ε: the paper's number, ours with its interval, the status",
          _columns(
              Column("paper", STRING, "the paper the claim is from", nullable=False),
              Column("claims_file", STRING, "the claims file", nullable=False),
              Column("claim", STRING, "the claim's id in its file", nullable=False),
              Column("source", STRING, "the paper's table or figure"),
              Column("statement", STRING, "the claim in words"),
              "dataset", "model",
              _use("epsilon", meaning="the ε it is read at (a growth: the largest of its list)"),
              _use("metric", meaning="the claim's metric: accuracy or auc"),
              Column("relation", STRING, "value, difference, order, at_least or increases", nullable=False),
              Column("mechanisms", STRING, "the compared labels, 'A vs B'", nullable=False),
              Column("paper_value", FLOAT, "the paper's number (percent or points); NaN for an order"),
              Column("tolerance", FLOAT, "Δ: the claim's tolerance"),
              Column("ours", FLOAT, "our number: the mean over seeds (percent or points)"),
              Column("ours_low", FLOAT, "lower end of ours' 95 % interval"),
              Column("ours_high", FLOAT, "upper end of ours' 95 % interval"),
              Column("gap", FLOAT, "ours − paper"),
              _use("p_value_adjusted", meaning="an order's paired test after Holm, where compared"),
              Column("replicates", INT, "seeds read"),
              Column("replicates_needed", FLOAT, "seeds an inconclusive claim would need at the observed spread"),
              Column("trivial", STRING, "the compared configurations not shown better than a constant predictor"),
              Column("basis", STRING, "where the numbers come from"),
              Column("status", STRING, "reproduced, refuted, inconclusive or not run", nullable=False),
              Column("why", STRING, "the status's reason in words"),
              Column("substitution", STRING, "what differs from the paper's setting"),
          )),
)


# ---------------------------------------------------------------------------- the writers and checks
def table(name: str) -> Table:
    """The campaign table `name`; ColumnMapError naming the tables there are otherwise."""
    if name not in TABLES:
        raise ColumnMapError(f"no campaign table '{name}' in the column map; the tables are {', '.join(TABLES)}")
    return TABLES[name]


def column_problems(declared: Table, names: Iterable[str]) -> list[str]:
    """What is wrong with a table's column names: those the map lacks, those it declares and the table lacks."""
    names = list(names)
    undeclared = [name for name in names if name not in declared.names]
    missing = [name for name in declared.names if name not in names]
    return ([f"table '{declared.name}' has column '{name}', which the column map (ldpbench/results/schema.py) "
             "does not declare" for name in undeclared]
            + [f"table '{declared.name}' lacks column '{name}' of the column map" for name in missing])


def check_columns(declared: Table, names: Iterable[str]) -> None:
    problems = column_problems(declared, names)
    if problems:
        raise ColumnMapError("; ".join(problems))


def frame_to_table(name: str, frame) -> pa.Table:
    """A pandas DataFrame as the Arrow table `name` of the map: its columns in the map's order and types.
    ColumnMapError naming the table and the column when a column is undeclared, missing or does not convert."""
    declared = table(name)
    check_columns(declared, frame.columns)
    try:
        return pa.Table.from_pandas(frame[declared.names], schema=declared.schema(), preserve_index=False)
    except (pa.ArrowException, ValueError, TypeError) as error:
        raise ColumnMapError(f"table '{name}' does not fit the column map's types: {error}") from None


def write_table(path: str | Path, name: str, frame) -> None:
    """Write the campaign table `name` (a DataFrame) to `path`, atomically, as the column map declares it."""
    import pyarrow.parquet as pq

    from ldpbench.atomic import atomic_path

    arrow = frame_to_table(name, frame)
    with atomic_path(path) as tmp:
        pq.write_table(arrow, tmp)


def file_problems(path: str | Path, declared: Table) -> list[str]:
    """How a written table's file departs from the map: columns (names and order), types, nulls in a
    column declared not nullable."""
    import pyarrow.parquet as pq

    written = pq.read_table(path)
    where = f"{path}: "
    problems = column_problems(declared, written.column_names)
    if not problems and written.column_names != declared.names:
        problems.append(f"table '{declared.name}' has its columns in the order {written.column_names}, "
                        f"not the map's {declared.names}")
    for column in declared.columns:
        if column.name not in written.column_names:
            continue
        found = written.schema.field(column.name)
        if found.type != column.type:
            problems.append(f"table '{declared.name}' column '{column.name}' is {found.type}, the map says "
                            f"{column.type}")
        if not column.nullable and written.column(column.name).null_count:
            problems.append(f"table '{declared.name}' column '{column.name}' holds nulls, the map says it may not")
    return [where + problem for problem in problems]


def tables_problems(tables_dir: str | Path) -> list[str]:
    """How the tables in a campaign's tables directory depart from the map; a Parquet file there that is no
    campaign table is a problem too."""
    problems = []
    for path in sorted(Path(tables_dir).glob("*.parquet")):
        if path.stem not in TABLES:
            problems.append(f"{path}: no campaign table '{path.stem}' in the column map")
            continue
        problems += file_problems(path, TABLES[path.stem])
    return problems


def mlflow_columns(name: str, view: str) -> tuple[str, ...]:
    """The columns of table `name` that MLflow shows as `view` (FINAL_TAG, METRIC, STEP_METRIC), in order."""
    return tuple(column.name for column in table(name).columns if column.mlflow == view)


def heading(name: str, column: str) -> str:
    """The report's heading of a column of table `name` (its name where the map gives none)."""
    return table(name).column(column).heading or column


def headed(name: str, frame, columns: Iterable[str]) -> dict:
    """`columns` of a frame of table `name` under their report headings, in order."""
    return {heading(name, column): frame[column] for column in columns}


# ---------------------------------------------------------------------------- docs/tables.md
HEADER = """# Tables

Every file a campaign writes under `results/<campaign>/`, with its columns in order: the run files
each run writes, then the campaign tables built from them. This page is generated from the column map,
[`ldpbench/results/schema.py`](../ldpbench/results/schema.py), by
`python -m ldpbench.results.schema > docs/tables.md`; a test fails when the two differ. How to add a
column: [tracking.md](tracking.md#adding-a-column).

Types are Arrow's (`double` is a 64-bit float). A column marked *not null* never holds a null. *Report*
is its heading wherever the report shows it; *MLflow* how `ldpbench track` shows it: `tag final.<name>`
on each run, `metric` on the configuration's run, `metric per round` at each evaluated round
([tracking.md](tracking.md#what-mlflow-shows)). A run-file column marked *added* is read as null from
files written before it existed.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_table(declared: Table, run_file: bool) -> str:
    lines = [f"## {declared.name}", "", f"`{declared.file}`, written by {declared.written_by}: {declared.meaning}.",
             ""]
    if run_file:
        lines += ["| column | type | null | meaning |", "|---|---|---|---|"]
    else:
        lines += ["| column | type | null | meaning | report | MLflow |", "|---|---|---|---|---|---|"]
    for column in declared.columns:
        null = ("" if column.nullable else "not null") + (" added" if column.added else "")
        cells = [f"`{column.name}`", str(column.type), null.strip(), _cell(column.meaning)]
        if not run_file:
            cells += [_cell(column.heading), column.mlflow]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render() -> str:
    """docs/tables.md."""
    parts = [HEADER, "# Run files\n"] + [render_table(t, True) for t in RUN_FILES]
    parts += ["# Campaign tables\n"] + [render_table(t, False) for t in TABLES.values()]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.stdout.write(render())
