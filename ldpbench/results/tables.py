"""Aggregation: the campaign's run files → runs, curves and summary tables (Parquet).

Only the runs of the campaign's manifest are read, each from its own directory, so a stale run
left over from an earlier version of the campaign never leaks into the tables, and every run
appears exactly once. Files are read against the explicit schemas of `schema.py`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ldpbench.errors import LdpbenchError
from ldpbench.layout import CURVES, FINAL, RUN_FILES, SUMMARIES, quarantined_run, run_dir, run_file, table_file
from ldpbench.results.convergence import convergence
from ldpbench.results.schema import ADDED_FIELDS, CURVE_SCHEMA, SUMMARY_SCHEMA, write_table

# What identifies a configuration; the summary aggregates over its seeds (each seed's folds averaged).
CONFIG_COLUMNS = ["dataset", "model", "label", "mechanism", "mechanism_params", "epsilon"]
# Accounting and cost columns, constant within a configuration.
ACCOUNTING_COLUMNS = [
    "epsilon_per_report", "epsilon_claimed_per_report", "epsilon_worst_case_per_report",
    "bits_per_report", "reports_per_client_max", "epsilon_claimed_client_max",
    "epsilon_worst_case_client_max",
]


class CorruptRunFile(LdpbenchError):
    """A run file is missing, unreadable or does not match its schema; `runs` are the manifest entries of
    the runs concerned."""

    def __init__(self, message: str, runs: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.runs = list(runs or [])


def read_checked_table(path: Path, schema: pa.Schema, run_id: str) -> pa.Table:
    """A run file as an Arrow table of exactly `schema` (columns added since it was written as nulls),
    checked to belong to `run_id`; CorruptRunFile naming the file otherwise."""
    try:
        # A run file is a few kB: the plain file reader, unbuffered and on this thread, reads one in
        # a quarter of read_table's time (whose dataset machinery and thread pool are for large data).
        with pq.ParquetFile(path, pre_buffer=False) as run_file:
            table = run_file.read(use_threads=False)
    except (OSError, pa.ArrowException) as error:
        raise CorruptRunFile(f"run file '{path}' cannot be read: {error}") from None
    for name in ADDED_FIELDS & set(schema.names) - set(table.column_names):
        table = table.append_column(schema.field(name), pa.nulls(len(table), schema.field(name).type))
    present = set(table.column_names)
    missing = [name for name in schema.names if name not in present]
    if missing:
        raise CorruptRunFile(f"run file '{path}' lacks columns {missing}")
    if not table.schema.equals(schema, check_metadata=False):  # the current files need no cast
        try:
            table = table.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise CorruptRunFile(f"run file '{path}' does not match its schema: {error}") from None
    run_ids = table.column("run_id").unique().to_pylist()
    if run_ids != [run_id]:
        raise CorruptRunFile(f"run file '{path}' belongs to another run ({set(run_ids)})")
    return table


def load_runs(manifest: list[dict[str, Any]], runs_root: str | Path,
              phase: str = FINAL) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves) of every run in the manifest, read from the store (`phase`), with its label and
    cell attached.

    Every run file is checked; all corrupt ones are reported together (CorruptRunFile listing
    each path, with the manifest entries of their runs in `runs`). The files are gathered as Arrow
    tables and converted to pandas once: a conversion per file took most of the aggregation's time on
    a large campaign.
    """
    summaries, curves, labels, cell_ids, problems, bad_runs = [], [], [], [], [], []
    for entry in manifest:
        plan, run_id = entry["plan"], entry["run_id"]
        where = (plan["dataset"], plan["mechanism"], phase, run_id)
        try:
            summary = read_checked_table(run_file(runs_root, SUMMARIES, *where), SUMMARY_SCHEMA, run_id)
            curve = read_checked_table(run_file(runs_root, CURVES, *where), CURVE_SCHEMA, run_id)
        except CorruptRunFile as error:
            problems.append(str(error))
            bad_runs.append(entry)
            continue
        summaries.append(summary)
        curves.append(curve)
        labels += [entry["label"]] * len(summary)
        cell_ids += [entry["cell_id"]] * len(summary)
    if problems:
        raise CorruptRunFile("\n  ".join([f"{len(problems)} corrupt or missing run file(s):", *problems]),
                             runs=bad_runs)
    if not summaries:
        raise LdpbenchError("the manifest lists no runs to aggregate")
    runs = pa.concat_tables(summaries).to_pandas()
    runs.insert(1, "label", labels)
    runs.insert(2, "cell_id", cell_ids)
    keys = runs[["run_id", "dataset", "model", "label", "mechanism", "epsilon", "seed", "fold"]]
    curve_table = pa.concat_tables(curves).to_pandas().merge(keys, on="run_id", how="left")
    trend = convergence(runs, curve_table)
    runs["final_slope"], runs["converged"] = trend["final_slope"], trend["converged"]
    return runs, curve_table


def quarantine(runs: list[dict[str, Any]], runs_root: str | Path, phase: str = FINAL) -> list[Path]:
    """Move corrupt runs' directories (in every tree of run files) out of the store, so the workflow
    trains them again.

    The moved files stay in <campaign>/quarantine/ for inspection instead of being deleted. The
    caller removes the markers of the cells that held them, so that Snakemake reruns exactly those.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S")
    moved = []
    for entry in runs:
        where = (entry["plan"]["dataset"], entry["plan"]["mechanism"], phase, entry["run_id"])
        for kind in RUN_FILES:
            source = run_dir(runs_root, kind, *where)
            if not source.exists():
                continue
            target = quarantined_run(runs_root, kind, *where, stamp)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
            moved.append(target)
    return moved


# Metrics bounded to [0, 1]: their intervals are computed on the logit scale (see bounded_interval).
BOUNDED_METRICS = frozenset({"test_accuracy", "test_auc", "validation_accuracy", "validation_auc"})
# How far from 0 and 1 a bounded value is moved before its logit (an accuracy of exactly 1 is common).
LOGIT_CLAMP = 1e-6
# The summary's flag of each metric not shown better than a constant predictor (see `trivial`).
TRIVIAL_COLUMNS = {"test_accuracy": "trivial", "test_auc": "auc_trivial"}


def confidence_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, std, low, high): Student-t interval of the mean; NaN bounds with fewer than 2 values."""
    # Imported here, not with the module: Snakemake's own process reads runs through this module to plan
    # a tuned cell, and scipy.stats' import (half a second) there holds up its scheduling of every job.
    from scipy import stats

    values = values[np.isfinite(values)]
    n = len(values)
    if n == 0:
        return (math.nan,) * 4
    mean = float(values.mean())
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    std = float(values.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def bounded_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, std, low, high) of values in [0, 1]: the Student-t interval of the mean of their logits,
    mapped back, so that it never leaves [0, 1] (with three seeds a plain t interval of an AUC reached
    [−0.05, 1.13]). Mean and std are of the values themselves; values of exactly 0 or 1 are moved in by
    LOGIT_CLAMP before the logit. The interval is that of the logit-mean's back-transform: with skewed
    values it is asymmetric about the mean, as the metric's bounds require."""
    from scipy import special  # as in confidence_interval

    values = values[np.isfinite(values)]
    mean, std, _, _ = confidence_interval(values, level)
    if len(values) < 2:
        return mean, std, math.nan, math.nan
    logits = special.logit(np.clip(values, LOGIT_CLAMP, 1 - LOGIT_CLAMP))
    _, _, low, high = confidence_interval(logits, level)
    low, high = float(special.expit(low)), float(special.expit(high))
    # The back-transformed interval is centred on the logits' mean; keep the arithmetic mean inside it.
    return mean, std, min(low, mean), max(high, mean)


def seed_means(runs: pd.DataFrame, metric: str) -> pd.Series:
    """Per seed, the mean of `metric` over its folds (finite values only): the replicates of a
    configuration. Folds of one seed share the seed's randomness and most of their training data, so
    counting them as independent would make every interval and test too narrow."""
    values = runs[["seed", metric]].astype({metric: float})
    values = values[np.isfinite(values[metric])]
    return values.groupby("seed", sort=True)[metric].mean()


def interval_over_seeds(means: pd.Series, metric: str) -> tuple[float, float, float, float]:
    """(mean, std, low, high) of `metric`'s seed means (bounded metrics on the logit scale)."""
    return (bounded_interval if metric in BOUNDED_METRICS else confidence_interval)(means.to_numpy(dtype=float))


def trivial(runs: pd.DataFrame, metric: str, reference: pd.Series | float) -> bool:
    """Whether `metric` is not shown above `reference` (a constant predictor's value: the majority-class
    accuracy per run, or AUC 0.5): the lower end of the 95 % t interval, over seeds, of the fold-mean
    difference is at most 0, or, with one seed, the difference itself is. No finite value: trivial."""
    gap = runs[metric].astype(float) - reference
    differences = seed_means(runs.assign(_gap=gap), "_gap").to_numpy(dtype=float)
    if len(differences) == 0:
        return True
    if len(differences) == 1:
        return bool(differences[0] <= 0)
    _, _, low, _ = confidence_interval(differences)
    return bool(low <= 0)


def trivial_metrics(row: dict) -> list[str]:
    """The metrics (test_accuracy, test_auc) a summary row is flagged trivial in; a flag that is missing
    or null (runs written before the majority rate was recorded) is not set."""
    return [metric for metric, column in TRIVIAL_COLUMNS.items()
            if row.get(column) is not None and not pd.isna(row.get(column)) and bool(row.get(column))]


def summarize(runs: pd.DataFrame, metric: str = "test_accuracy") -> pd.DataFrame:
    """One row per configuration: `metric` (mean, std, 95 % CI as mean/std/ci95_*) and the test
    AUC (auc_*) over the seeds of its ok runs (each seed's folds averaged first: the replicate is the
    seed; `seeds` counts them), with the majority-class rate, the trivial flags, the accounting and costs."""
    rows = []
    for key, group in runs.groupby(CONFIG_COLUMNS, sort=True, dropna=False):
        ok = group[group["status"] == "ok"]
        by_seed = seed_means(ok, metric)
        mean, std, low, high = interval_over_seeds(by_seed, metric)
        auc_mean, auc_std, auc_low, auc_high = interval_over_seeds(seed_means(ok, "test_auc"), "test_auc")
        classes = group["classes"].dropna()
        # Unknown in runs written before the majority rate was recorded (read as nulls).
        majority = ok["test_majority_accuracy"].astype(float) if "test_majority_accuracy" in ok else None
        known_majority = majority is not None and bool(np.isfinite(majority).any())
        row = dict(zip(CONFIG_COLUMNS, key))
        row.update({
            "metric": metric,
            "runs": len(group),
            "runs_ok": len(ok),
            "seeds": len(by_seed),
            "runs_diverged": int((group["status"] == "diverged").sum()),
            # Ok runs whose test accuracy still moved over their last quarter (ldpbench.results.convergence).
            "runs_unconverged": int((~ok["converged"].astype(bool)).sum()) if "converged" in ok else 0,
            "mean": mean, "std": std, "ci95_low": low, "ci95_high": high,
            "auc_mean": auc_mean, "auc_std": auc_std, "auc_ci95_low": auc_low, "auc_ci95_high": auc_high,
            "majority_accuracy": float(seed_means(ok, "test_majority_accuracy").mean()) if known_majority
            else math.nan,
            # Not shown better than a constant predictor: the majority class (accuracy), any (AUC 0.5).
            "trivial": trivial(ok, "test_accuracy", majority) if known_majority else None,
            "auc_trivial": trivial(ok, "test_auc", 0.5),
            "classes": int(classes.iloc[0]) if len(classes) else None,
            "uplink_bits_total_mean": float(group["uplink_bits_total"].mean()),
            "train_seconds_mean": float(group["train_seconds"].mean()),
        })
        row.update(group.iloc[0][ACCOUNTING_COLUMNS].to_dict())
        rows.append(row)
    return pd.DataFrame(rows)


def load_manifest_runs(manifest_path: str | Path, runs_root: str | Path,
                       cell_marker: Callable[[dict[str, Any]], Path] | None = None
                       ) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(manifest, runs, curves) of a manifest's runs (trials.json or manifest.json: its phase's store).

    A corrupt run file fails with its path; the run is quarantined and the marker of its cell
    (`cell_marker` of its manifest entry) removed, so the next run of the workflow trains it again.
    """
    manifest = json.loads(Path(manifest_path).read_text())
    phase = manifest.get("phase", FINAL)
    try:
        runs, curves = load_runs(manifest["runs"], runs_root, phase)
    except CorruptRunFile as error:
        moved = quarantine(error.runs, runs_root, phase)
        if cell_marker is not None:
            for entry in error.runs:
                cell_marker(entry).unlink(missing_ok=True)
        where = "".join(f"\n  moved to {path}" for path in moved)
        raise CorruptRunFile(f"{error}\nThose runs were moved out of the run store:{where}\n"
                             "Run the workflow again to recompute them.") from None
    runs.insert(0, "campaign", manifest["campaign"])
    return manifest, runs, curves


def with_tuning(summary: pd.DataFrame, selected: pd.DataFrame | None) -> pd.DataFrame:
    """The summary with each configuration's selected setting and the privacy spend of its tuning trials
    beside the final run's (ldpbench.tuning); untuned configurations spend nothing on tuning."""
    keys = ["dataset", "model", "label", "epsilon"]
    columns = {"setting": "selected_setting", "tuning_data": "tuning_data",
               "tuning_epsilon_claimed_client_max": "tuning_epsilon_claimed_client_max",
               "tuning_epsilon_worst_case_client_max": "tuning_epsilon_worst_case_client_max"}
    if selected is None or selected.empty:
        selected = pd.DataFrame(columns=keys + list(columns))
    merged = summary.merge(selected[keys + list(columns)].rename(columns=columns), on=keys, how="left")
    merged.insert(merged.columns.get_loc("selected_setting"), "tuned", merged["selected_setting"].notna())
    for kind in ("claimed", "worst_case"):
        spent = merged[f"tuning_epsilon_{kind}_client_max"].astype(float).fillna(0.0)
        merged[f"tuning_epsilon_{kind}_client_max"] = spent
        merged[f"epsilon_{kind}_client_total"] = merged[f"epsilon_{kind}_client_max"] + spent
    merged["tuning_data"] = merged["tuning_data"].astype(object).where(merged["tuned"], None)
    return merged


def aggregate(manifest_path: str | Path, runs_root: str | Path, tables_dir: str | Path,
              selected_path: str | Path | None = None) -> dict[str, int]:
    """Build the tables (with a tuned campaign's selection, `selected_path`, merged into the summary)."""
    from ldpbench.layout import CampaignLayout

    layout = CampaignLayout.at(Path(runs_root).parent)

    def marker(entry: dict[str, Any]) -> Path:
        return layout.cell_marker(entry["plan"]["dataset"], entry["plan"]["mechanism"], entry["cell_id"])

    manifest, runs, curves = load_manifest_runs(manifest_path, runs_root, marker)
    selected = None if selected_path is None else pd.read_parquet(selected_path)
    summary = with_tuning(summarize(runs), selected)
    summary.insert(0, "campaign", manifest["campaign"])
    write_table(table_file(tables_dir, "runs"), "runs", runs)
    write_table(table_file(tables_dir, "curves"), "curves", curves)
    # The summary is the rule's declared output: written last.
    write_table(table_file(tables_dir, "summary"), "summary", summary)
    return {"runs": len(runs), "curve_points": len(curves), "configurations": len(summary)}
