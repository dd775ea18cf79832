"""What a campaign looks like in MLflow, built from its tables: one entry per MLflow run.

Six levels, each an MLflow run tagged `ldpbench.level` (tuning and trial only in a tuned campaign):

- **campaign** (top level): what the campaign ran (datasets, models, mechanisms, ε, seeds as
  params), its counts as metrics; its files (campaign file, manifest, tables, report) are attached
  as artifacts by `tracking.track`.
- **configuration** (top level): one (dataset, model, mechanism, ε), one row of the summary table:
  its params, the mean and 95 % interval of accuracy and AUC over seeds (folds averaged), ε (claimed,
  worst case, audited lower bound), bits, its rank, whether the verdict names it best, and a `trivial`
  tag (accuracy, auc: not shown better than a constant predictor). These are
  the rows MLflow's runs page, charts and compare view show first. Its description (MLflow's
  Description column, the first after the run's name and times) reads the row at a glance: mean and
  interval in percent, rounded, and where the verdict puts it ("best", "tied best with ...", "rank 2").
- **run** (child of its configuration): one seed and fold; its metrics are its per-round curves
  alone, so its view opens on them (MLflow's UI puts any metric named "<section>/<name>" in a chart
  section above the unprefixed ones); its single values are `final.*` tags (a curve's last point is
  its final value).
- **curve** (top level): one dataset, model and label (a mechanism's configuration) across ε: at step
  i its metrics are the i-th smallest finite ε and the mean accuracy with its 95 % interval there,
  in percent, under names that carry the dataset and model (`<dataset>/<model>/accuracy_pct`), so
  that a chart of them against `<dataset>/<model>/epsilon` draws that panel's mechanisms alone, one
  line each: the curves view.
- **tuning** (child of a tuned configuration): the sweep that chose its setting: the points tried,
  the tuning metric, the setting selected with its score, and the privacy the trials spent.
- **trial** (child of its tuning run): one trial run (a point, seed and fold): the point's setting as
  `setting.*` params, its validation curve per round and its `score` (the tuning metric's final
  value) as metrics. MLflow's compare view of the tuning run's children is then the sweep.

CHOICE: the campaign is the experiment (`ldpbench/<campaign>` by default), so configurations are
top-level runs rather than children of the campaign run: MLflow's runs page shows top-level runs
and collapses children, and a campaign parent would hide every configuration behind one row.

An entry's fingerprint hashes what it shows (name, params, metrics, content tags, inputs), not who
logged it: re-tracking an unchanged campaign from another commit changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from ldpbench.data.prepared import recorded_digests
from ldpbench.errors import LdpbenchError
from ldpbench.results.compare import FAMILY
from ldpbench.results.mlflow_common import (
    CAMPAIGN,
    CAMPAIGN_TAG,
    CONFIGURATION,
    CURVE,
    FINGERPRINT_TAG,
    LEVEL_TAG,
    RUN,
    TRIAL,
    TUNING,
    param_text,
)
from ldpbench.results.palette import RUN_COLOUR_TAG, mechanism_colours
from ldpbench.results.schema import CURVE_SCHEMA, FINAL_TAG, METRIC, STEP_METRIC, mlflow_columns
from ldpbench.results.tables import CONFIG_COLUMNS, trivial_metrics

# What MLflow shows of each table under the column's own name: the column map's `mlflow` marks.
CURVE_METRICS = mlflow_columns("curves", STEP_METRIC)  # a run's metrics at each evaluated round
FINAL_METRICS = mlflow_columns("runs", FINAL_TAG)
FINAL_TAG_PREFIX = "final."  # a run's single values, as tags (∞ stays visible in a tag)
CONFIGURATION_FACTS = mlflow_columns("summary", METRIC)  # summary columns shown as they are on a configuration
INTERVAL = ("mean", "std", "ci95_low", "ci95_high")
# In percent, rounded: what the view's columns show, under names that MLflow's order of metric columns
# (by name) puts as mean, lower, upper: accuracy_pct, accuracy_pct_ci_lower, accuracy_pct_ci_upper.
SHOWN_INTERVAL = {"mean": "", "ci95_low": "_ci_lower", "ci95_high": "_ci_upper"}
PERCENT_DIGITS = 2
DESCRIPTION_TAG = "mlflow.note.content"  # a run's description in MLflow's UI
RANKING_FACTS = mlflow_columns("rankings", METRIC)
# A trial is selected by a validation metric: its curve shows those and the training loss.
TRIAL_CURVE_METRICS = (*(name for name in CURVE_SCHEMA.names if name.startswith("validation_")), "train_loss")
TUNED_KEY = ("dataset", "model", "label", "epsilon")  # a tuning's configuration in the `selected` table


# A run's splits, each an input of its MLflow run with the split's name as its context (MLflow's UI
# shows the context beside the dataset), and the runs table's column of the split's records.
SPLIT_RECORDS = {"training": "records", "validation": "validation_records", "test": "test_records"}


@dataclass(frozen=True)
class Dataset:
    """A dataset as MLflow records an input: its name, digest, where it came from and, for one split of a
    run, its context (training, validation, test); the whole prepared data has none."""

    name: str
    digest: str  # the first 16 hex digits of the data file's sha256 (of its files' records, when several)
    source: str  # the data file (its directory, when several)
    profile: str  # JSON: records, features, classes, the full sha256, the raw files' addresses
    context: str | None = None

    @cached_property  # read once, not for every split of every run
    def profile_fields(self) -> dict[str, Any]:
        return json.loads(self.profile)

    def split(self, context: str, digest: str, records: Any) -> Dataset:
        """One split of it: `digest` (ldpbench.data.split.split_digest) names its records."""
        profile = {**self.profile_fields, "split": context, "split_records": _plain(records),
                   "data_digest": self.digest}
        return replace(self, digest=digest, context=context, profile=json.dumps(profile, sort_keys=True, default=str))

    def as_input(self):
        from mlflow.entities import Dataset as MlflowDataset
        from mlflow.entities import DatasetInput, InputTag

        dataset = MlflowDataset(self.name, self.digest, "local", json.dumps({"uri": self.source}),
                                profile=self.profile)
        tags = [] if self.context is None else [InputTag("mlflow.data.context", self.context)]
        return DatasetInput(dataset, tags=tags)


@dataclass(frozen=True)
class Entry:
    """One MLflow run to be: level, key (its `run_key` tag), what it shows and where it hangs."""

    level: str
    key: str
    name: str
    params: Mapping[str, str]
    metrics: tuple[tuple[str, float, int], ...]  # (key, value, step); only finite values
    tags: Mapping[str, str]  # content tags; the level, campaign and fingerprint are added by `all_tags`
    campaign: str
    timestamp_ms: int  # when its numbers were made: MLflow shows that, not when they were tracked
    parent_key: str | None = None
    start_ms: int | None = None
    status: str = "FINISHED"
    datasets: tuple[Dataset, ...] = field(default=())

    @cached_property  # asked twice per entry (the stored run's check, then its tags)
    def fingerprint(self) -> str:
        shown = {"name": self.name, "params": dict(self.params), "metrics": list(self.metrics),
                 "tags": dict(self.tags), "status": self.status,
                 "datasets": sorted((d.name, d.digest, d.context or "") for d in self.datasets)}
        return hashlib.sha256(json.dumps(shown, sort_keys=True, default=str).encode()).hexdigest()[:32]

    def all_tags(self, system: Mapping[str, str]) -> dict[str, str]:
        return {**system, **self.tags, "run_key": self.key, LEVEL_TAG: self.level, CAMPAIGN_TAG: self.campaign,
                FINGERPRINT_TAG: self.fingerprint}


def _finite(items: Iterable[tuple[str, Any]], step: int = 0) -> tuple[tuple[str, float, int], ...]:
    """(name, value, step) for each value that MLflow can store (it has no ∞ or NaN)."""
    out = []
    for name, value in items:
        if value is None or isinstance(value, str):
            continue
        number = float(value)
        if math.isfinite(number):
            out.append((name, number, step))
    return tuple(out)


def _plain(value: Any) -> Any:
    """A table's number as Python's (an int stays an int, so 100 rounds read "100")."""
    return value.item() if hasattr(value, "item") else value


def _millis(timestamp: Any) -> int:
    return int(pd.Timestamp(timestamp).timestamp() * 1000)


def _configuration_key(campaign: str, values: Mapping[str, Any]) -> str:
    # repr, not param_text: two ε that agree to 6 digits are still two configurations.
    parts = [repr(float(values[c])) if c == "epsilon" else str(values[c]) for c in CONFIG_COLUMNS]
    return f"configuration:{campaign}:" + json.dumps(parts)


def _configuration_name(values: Mapping[str, Any]) -> str:
    return f"{values['dataset']}/{values['model']}/{values['label']}/eps={float(values['epsilon']):g}"


def run_entries(runs: pd.DataFrame, curves: pd.DataFrame, datasets: Mapping[str, Dataset]) -> list[Entry]:
    """One entry per run of the runs table, each under its configuration."""
    grouped = dict(tuple(curves.groupby("run_id"))) if len(curves) else {}
    entries = []
    for _, row in runs.iterrows():
        plan = json.loads(row["plan"])
        params = {
            "dataset": row["dataset"], "model": row["model"], "mechanism": row["mechanism"],
            "label": row["label"], "epsilon": row["epsilon"], "seed": row["seed"], "fold": row["fold"],
            "folds": plan["folds"], "test_fraction": plan["test_fraction"],
            **{f"network.{k}": v for k, v in plan["network_params"].items()},
            **{f"mechanism.{k}": v for k, v in plan["mechanism_params"].items()},
            **{f"training.{k}": v for k, v in plan["training"].items()},
        }
        curve = grouped.get(row["run_id"], pd.DataFrame(columns=["round"]))
        shown = [name for name in CURVE_METRICS if name in curve.columns]
        metrics = [point for step, values in zip(curve["round"], curve[shown].itertuples(index=False))
                   for point in _finite(zip(shown, values), int(step))]
        tags = {
            **{FINAL_TAG_PREFIX + name: str(_plain(row[name])) for name in FINAL_METRICS if name in row},
            "dataset": row["dataset"], "model": row["model"], "mechanism": row["mechanism"], "label": row["label"],
            "epsilon": param_text(float(row["epsilon"])), "status": row["status"], "ldpbench.run_id": row["run_id"],
        }
        entries.append(Entry(
            RUN, row["run_id"],
            f"{row['dataset']}/{row['model']}/{row['label']}/eps={row['epsilon']:g}/seed={row['seed']}/fold={row['fold']}",
            {k: param_text(v) for k, v in params.items()}, tuple(metrics), tags, str(row["campaign"]),
            _millis(row["finished_at"]), parent_key=_configuration_key(str(row["campaign"]), row),
            start_ms=_millis(row["started_at"]), status="FINISHED" if row["status"] == "ok" else "FAILED",
            datasets=_splits(row, datasets.get(row["dataset"]))))
    return entries


def _splits(row: Mapping[str, Any], dataset: Dataset | None) -> tuple[Dataset, ...]:
    """A run's inputs: each split it used, by context, where the run recorded which records it held
    (runs from before that record: the whole dataset, without a context)."""
    if dataset is None:
        return ()
    splits = tuple(dataset.split(split, row[f"{split}_digest"], row.get(records))
                   for split, records in SPLIT_RECORDS.items() if isinstance(row.get(f"{split}_digest"), str))
    return splits or (dataset,)


def _identity(values: Mapping[str, Any], columns: Iterable[str]) -> tuple:
    """The values of `columns` as one hashable key (ε as a float, the rest as text)."""
    return tuple(float(values[c]) if c == "epsilon" else str(values[c]) for c in columns)


def _first_rows(table: pd.DataFrame | None, columns: tuple[str, ...]) -> dict[tuple, dict[str, Any]]:
    """Each key's first row of `table`, read once (rather than a scan of the table per configuration)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for row in [] if table is None else table.to_dict("records"):
        rows.setdefault(_identity(row, columns), row)
    return rows


def _audited(audit: pd.DataFrame | None, row: pd.Series) -> pd.DataFrame:
    """The audit rows of a configuration's mechanism at its budget of one report."""
    if audit is None or audit.empty or not math.isfinite(float(row["epsilon_per_report"])):
        return pd.DataFrame()
    same = audit[(audit["mechanism"] == row["mechanism"]) & (audit["params"] == row["mechanism_params"])]
    return same[[math.isclose(e, float(row["epsilon_per_report"]), rel_tol=1e-9) for e in same["epsilon"]]]


def configuration_entries(summary: pd.DataFrame, runs: pd.DataFrame, datasets: Mapping[str, Dataset],
                          rankings: pd.DataFrame | None = None, verdicts: pd.DataFrame | None = None,
                          audit: pd.DataFrame | None = None) -> list[Entry]:
    """One entry per summary row: the configuration's numbers over its seeds (folds averaged)."""
    entries = []
    campaign = str(runs["campaign"].iloc[0])
    # Each table is indexed once; a configuration then looks its rows up.
    members_of = dict(tuple(runs.groupby([_configuration_key(campaign, row) for row in runs.to_dict("records")])))
    ranking_keys, verdict_keys = (*FAMILY, "label"), tuple(FAMILY)  # a verdict per family, a rank per label in it
    ranked_rows, verdict_rows = _first_rows(rankings, ranking_keys), _first_rows(verdicts, verdict_keys)
    colours = mechanism_colours(summary["label"])
    for _, row in summary.iterrows():
        values = {column: row[column] for column in CONFIG_COLUMNS}
        metric = str(row["metric"])
        members = members_of.get(_configuration_key(campaign, values), runs.iloc[:0])
        params = {**{column: param_text(row[column]) for column in ("dataset", "model", "mechanism", "label")},
                  "epsilon": param_text(float(row["epsilon"])), "metric": metric,
                  **{f"mechanism.{k}": param_text(v) for k, v in json.loads(row["mechanism_params"]).items()},
                  "tuned": str(bool(row.get("tuned", False)))}
        if row.get("selected_setting"):
            params["selected_setting"] = str(row["selected_setting"])
        metrics = list(_finite((f"{metric}_{part}", row[part]) for part in INTERVAL))
        metrics += _finite((f"test_auc_{part}", row[f"auc_{part}"]) for part in INTERVAL if f"auc_{part}" in row)
        metrics += _finite((percent_metric(metric, part), _percent(row[part])) for part in SHOWN_INTERVAL)
        metrics += _finite((percent_metric("test_auc", part), _percent(row[f"auc_{part}"]))
                           for part in SHOWN_INTERVAL if f"auc_{part}" in row)
        metrics += _finite([("epsilon", row["epsilon"])])
        metrics += _finite((name, row[name]) for name in CONFIGURATION_FACTS if name in row)
        tags = {"dataset": str(row["dataset"]), "model": str(row["model"]), "mechanism": str(row["mechanism"]),
                "label": str(row["label"]), "epsilon": param_text(float(row["epsilon"])),
                "epsilon_worst_case_client_total": str(row.get("epsilon_worst_case_client_total", "")),
                "runs": ", ".join(sorted(members["run_id"])),
                # Not shown better than a constant predictor (ldpbench.results.tables.trivial).
                "trivial": ", ".join(metric.removeprefix("test_") for metric in trivial_metrics(row)) or "no",
                RUN_COLOUR_TAG: colours[str(row["label"])]}
        ranked = ranked_rows.get(_identity({**values, "metric": metric}, ranking_keys))
        if ranked is not None:
            metrics += _finite((name, ranked[name]) for name in RANKING_FACTS)
            tags["group"] = str(ranked["group"])
        verdict = verdict_rows.get(_identity({**values, "metric": metric}, verdict_keys))
        if verdict is not None:
            text = str(verdict["verdict"])
            # 1 when the verdict names this configuration alone as best (significantly), else 0.
            metrics += _finite([("verdict_best", float(text == str(row["label"])))])
            tags["verdict"] = text
        tags[DESCRIPTION_TAG] = description(row, verdict, ranked)
        audited = _audited(audit, row)
        if len(audited):
            metrics += _finite([("epsilon_audited_lower_bound", audited["audited_lower_bound"].max())])
            tags["audit_verdict"] = ", ".join(sorted(set(audited["verdict"].astype(str))))
        timed = members if len(members) else runs
        entries.append(Entry(CONFIGURATION, _configuration_key(campaign, values), _configuration_name(values),
                             params, tuple(metrics), tags, campaign, _millis(timed["finished_at"].max()),
                             start_ms=_millis(timed["started_at"].min()),
                             datasets=tuple(datasets[d] for d in [row["dataset"]] if d in datasets)))
    return entries


def tuning_entries(summary: pd.DataFrame, selected: pd.DataFrame, tuning: pd.DataFrame, trial_runs: pd.DataFrame,
                   trial_curves: pd.DataFrame) -> list[Entry]:
    """Each tuned configuration's sweep: its tuning run under the configuration, then one trial run per
    row of the tuning table under that. `trial_runs` and `trial_curves` are the trials' run files (when
    each ran, its curve); a selection whose configuration has no final runs in the summary is skipped."""
    campaign = str(summary["campaign"].iloc[0])
    configurations = {_identity(row, TUNED_KEY): row for row in summary.to_dict("records")}
    started = dict(zip(trial_runs["run_id"], trial_runs["started_at"]))
    finished = dict(zip(trial_runs["run_id"], trial_runs["finished_at"]))
    curves = dict(tuple(trial_curves.groupby("run_id"))) if len(trial_curves) else {}
    trials_of: dict[tuple, list[dict[str, Any]]] = {}
    for trial in tuning.sort_values(["point", "seed", "fold"]).to_dict("records"):
        trials_of.setdefault(_identity(trial, TUNED_KEY), []).append(trial)
    entries = []
    for chosen in selected.to_dict("records"):
        key = _identity(chosen, TUNED_KEY)
        configuration, trials = configurations.get(key), trials_of.get(key)
        if configuration is None or trials is None:
            continue
        name = _configuration_name(configuration)
        tuning_key = f"{TUNING}/{_configuration_key(campaign, configuration)}"
        shown = {column: param_text(configuration[column]) for column in ("dataset", "model", "mechanism", "label")}
        shown["epsilon"] = param_text(float(configuration["epsilon"]))
        params = {**shown, "tuning_metric": chosen["metric"], "direction": chosen["direction"],
                  "tuning_data": chosen["tuning_data"], "points": param_text(_plain(chosen["trials"])),
                  "trial_runs": param_text(_plain(chosen["trial_runs"])),
                  "selected_point": param_text(_plain(chosen["point"])), "selected_setting": chosen["setting"]}
        metrics = _finite([("selected_score", chosen["score"]),
                           ("tuning_epsilon_claimed_client_max", chosen["tuning_epsilon_claimed_client_max"]),
                           ("tuning_epsilon_worst_case_client_max", chosen["tuning_epsilon_worst_case_client_max"])])
        missing = sorted(trial["run_id"] for trial in trials if trial["run_id"] not in started)
        if missing:
            raise LdpbenchError(f"the tuning of {name} lists trial runs with no run file: {', '.join(missing)}")
        times = [(started[trial["run_id"]], finished[trial["run_id"]]) for trial in trials]
        selection = (f"selected point {chosen['point']} {chosen['setting']}: {chosen['metric']} "
                        f"{chosen['score']:.4g} (mean over the tuning seeds), of {chosen['trials']} points in "
                        f"{chosen['trial_runs']} trial runs on {chosen['tuning_data']} data")
        entries.append(Entry(TUNING, tuning_key, f"{name}/tuning", params, metrics,
                             {**shown, "configuration": name, DESCRIPTION_TAG: selection},
                             campaign, max(_millis(end) for _, end in times),
                             parent_key=_configuration_key(campaign, configuration),
                             start_ms=min(_millis(start) for start, _ in times)))
        for trial in trials:
            run_id = trial["run_id"]
            curve = curves.get(run_id, pd.DataFrame(columns=["round"]))
            drawn = [metric for metric in TRIAL_CURVE_METRICS if metric in curve.columns]
            metrics = [point for step, values in zip(curve["round"], curve[drawn].itertuples(index=False))
                       for point in _finite(zip(drawn, values), int(step))]
            metrics += _finite([("score", trial["score"])])
            setting = {f"setting.{key}": param_text(value) for key, value in json.loads(trial["setting"]).items()}
            params = {"point": param_text(_plain(trial["point"])), "seed": param_text(_plain(trial["seed"])),
                      "fold": param_text(_plain(trial["fold"])), "tuning_metric": trial["metric"], **setting}
            entries.append(Entry(
                TRIAL, f"{TRIAL}/{run_id}",
                f"{name}/point={trial['point']}/seed={trial['seed']}/fold={trial['fold']}", params, tuple(metrics),
                {**shown, "status": str(trial["status"]), "ldpbench.run_id": run_id}, campaign,
                _millis(finished[run_id]), parent_key=tuning_key, start_ms=_millis(started[run_id]),
                status="FINISHED" if trial["status"] == "ok" else "FAILED"))
    return entries


def percent_metric(metric: str, part: str) -> str:
    """The name of a configuration's metric in percent: test_accuracy's mean is `accuracy_pct`, its
    ci95_low `accuracy_pct_ci_lower` (they sort before the view's other metrics, ε and bits)."""
    return f"{metric.removeprefix('test_')}_pct{SHOWN_INTERVAL[part]}"


def _percent(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else round(100 * float(value), PERCENT_DIGITS)


def description(row: Mapping[str, Any], verdict: Mapping[str, Any] | None, ranked: Mapping[str, Any] | None) -> str:
    """A configuration at a glance: "<mean> % [<lower>, <upper>] · tied best with PM, PS-PM", the mean and 95 %
    interval of its metric over seeds in percent, then where its family's verdict puts it (and a
    `trivial` flag: not shown better than a constant predictor)."""
    if pd.isna(row["mean"]):
        return "no successful run"
    low, high = (_percent(row[part]) for part in ("ci95_low", "ci95_high"))
    mean = f"{_percent(row['mean']):.{PERCENT_DIGITS}f} %"
    # One seed has no interval (the replicate is the seed): said, not left blank.
    text = f"{mean} (no interval: one seed)" if low is None or high is None else \
        f"{mean} [{low:.{PERCENT_DIGITS}f}, {high:.{PERCENT_DIGITS}f}]"
    label = str(row["label"])
    if verdict is None:
        standing = "not compared (no privacy)" if math.isinf(float(row["epsilon"])) else "not compared"
    else:
        best = str(verdict["best"]).split(", ")
        if best == [label]:
            standing = "best"
        elif label in best:
            standing = "tied best with " + ", ".join(other for other in best if other != label)
        else:
            rank = f"rank {int(ranked['rank'])}, " if ranked is not None else ""
            standing = f"{rank}below {verdict['verdict']}"
    trivial = trivial_metrics(row)
    flag = f" · trivial: {', '.join(metric.removeprefix('test_') for metric in trivial)}" if trivial else ""
    return f"{text} · {standing}{flag}"


def curve_metric(dataset: str, model: str, name: str) -> str:
    """A curve run's metric of one panel: `adult/lr/accuracy_pct`, `adult/lr/epsilon`."""
    return f"{dataset}/{model}/{name}"


def curve_entries(summary: pd.DataFrame, runs: pd.DataFrame) -> list[Entry]:
    """Per dataset, model and label its curve across the finite ε (ε = ∞ has no place on the axis):
    step i holds the i-th smallest ε and the configuration's mean and interval there, in percent."""
    campaign = str(runs["campaign"].iloc[0])
    private = summary[[math.isfinite(float(epsilon)) for epsilon in summary["epsilon"]]]
    runs_of = dict(tuple(runs.groupby(["dataset", "model", "label"])))  # grouped once, not per curve
    colours = mechanism_colours(summary["label"])  # the report's, over every label (ε = ∞ too)
    entries = []
    for (dataset, model, label), rows in private.groupby(["dataset", "model", "label"], sort=True):
        metrics: list[tuple[str, float, int]] = []
        for step, row in enumerate(rows.sort_values("epsilon").to_dict("records")):
            named = {"epsilon": row["epsilon"],
                     **{percent_metric(row["metric"], part): _percent(row[part]) for part in SHOWN_INTERVAL}}
            metrics += _finite(((curve_metric(dataset, model, name), value) for name, value in named.items()), step)
        members = runs_of[(dataset, model, label)]
        shown = {"dataset": str(dataset), "model": str(model), "mechanism": str(rows["mechanism"].iloc[0]),
                 "label": str(label)}
        params = {**shown, "epsilons": ", ".join(param_text(float(e)) for e in sorted(rows["epsilon"]))}
        entries.append(Entry(CURVE, f"curve:{campaign}:" + json.dumps([dataset, model, label]),
                             f"{dataset}/{model}/{label}", params, tuple(metrics),
                             {**shown, RUN_COLOUR_TAG: colours[str(label)]}, campaign,
                             _millis(members["finished_at"].max()), start_ms=_millis(members["started_at"].min())))
    return entries


def campaign_entry(runs: pd.DataFrame, summary: pd.DataFrame, datasets: Mapping[str, Dataset],
                   campaign_key: str) -> Entry:
    """The campaign's own run: what it ran, its counts."""
    campaign = str(runs["campaign"].iloc[0])

    def listed(column: str) -> str:
        values = sorted(set(runs[column]), key=lambda v: (isinstance(v, str), v))
        return ", ".join(param_text(float(v)) if column == "epsilon" else str(v) for v in values)

    params = {"campaign": campaign, "datasets": listed("dataset"), "models": listed("model"),
              "mechanisms": listed("label"), "epsilons": listed("epsilon"), "seeds": listed("seed"),
              "folds": listed("fold")}
    ok = runs["status"] == "ok"
    metrics = _finite([("runs", len(runs)), ("runs_ok", int(ok.sum())), ("configurations", len(summary)),
                       ("runs_unconverged", int(summary["runs_unconverged"].sum()) if "runs_unconverged" in summary
                        else None),
                       ("train_seconds_total", float(runs["train_seconds"].sum()))])
    return Entry(CAMPAIGN, campaign_key, campaign, params, metrics, {"campaign": campaign}, campaign,
                 _millis(runs["finished_at"].max()), start_ms=_millis(runs["started_at"].min()),
                 datasets=tuple(datasets[d] for d in sorted(set(runs["dataset"])) if d in datasets))


def datasets_of(metas: Mapping[str, str | Path]) -> dict[str, Dataset]:
    """The datasets described by their prepared (or feature) meta.json files, by dataset name."""
    found = {}
    for name, meta_path in metas.items():
        meta_path = Path(meta_path)
        meta = json.loads(meta_path.read_text())
        digests = recorded_digests(meta)
        if not digests:
            continue  # nothing to identify it by: not logged rather than logged without a digest
        if len(digests) == 1:  # one data file: its own sha256
            [(data_file, sha256)] = digests.items()
        else:  # several (feature arrays): the sha256 of their records, the directory as the source
            data_file, sha256 = "", hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()
        raw = meta.get("raw_files")
        profile = {"sha256": sha256, "files": digests, "records": meta.get("n"), "features": meta.get("d"),
                   "classes": len(meta["classes"]) if isinstance(meta.get("classes"), list) else None,
                   "source": meta.get("source"), "raw_files": raw if isinstance(raw, (list, str)) else None}
        source = str((meta_path.parent / data_file).resolve())
        found[name] = Dataset(name, sha256[:16], source, json.dumps(profile, sort_keys=True, default=str))
    return found
