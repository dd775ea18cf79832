"""Execute one run spec: load the prepared data, split, train, write the run's two Parquet files."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import ldpbench
from ldpbench import mechanisms
from ldpbench.atomic import atomic_path
from ldpbench.campaign import RunSpec
from ldpbench.data.prepared import load_prepared
from ldpbench.data.split import train_test_indices
from ldpbench.fl.engine import RunResult, TrainingConfig, run_fedsgd
from ldpbench.fl.models import create_model
from ldpbench.results.schema import CURVE_FILE, CURVE_SCHEMA, SUMMARY_FILE, SUMMARY_SCHEMA


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def train(spec: RunSpec, prepared_dir: str | Path) -> tuple[RunResult, dict[str, int]]:
    features, labels, meta = load_prepared(prepared_dir)
    train_idx, test_idx = train_test_indices(len(labels), spec.seed, spec.folds, spec.fold,
                                             spec.test_fraction)
    x = torch.from_numpy(features)
    y = torch.from_numpy(labels)
    config = TrainingConfig(**spec.training)
    epsilon_per_report = spec.epsilon_value / config.epochs
    mechanism = mechanisms.create(spec.mechanism, epsilon_per_report, meta["d"], spec.mechanism_params)
    model = create_model(spec.model, config.l2)
    result = run_fedsgd(model, mechanism, x[train_idx], y[train_idx], x[test_idx], y[test_idx],
                        config, spec.seed)
    sizes = {"clients": len(train_idx), "test_records": len(test_idx), "dims": int(meta["d"])}
    return result, sizes


def summary_row(spec: RunSpec, result: RunResult, sizes: dict[str, int], started_at: str,
                wall_seconds: float) -> dict:
    accounting = result.accounting
    reports = result.reports_per_client
    max_reports = int(reports.max()) if len(reports) else 0
    return {
        "run_id": spec.run_id,
        "dataset": spec.dataset,
        "model": spec.model,
        "mechanism": spec.mechanism,
        "mechanism_params": json.dumps(spec.mechanism_params, sort_keys=True),
        "epsilon": spec.epsilon_value,
        "seed": spec.seed,
        "fold": spec.fold,
        "spec": spec.canonical_json(),
        "status": result.status,
        "test_accuracy": result.final["test_accuracy"],
        "test_loss": result.final["test_loss"],
        "train_loss": result.final["train_loss"],
        "rounds": result.final["rounds"],
        "rounds_planned": result.final["rounds_planned"],
        "epochs": spec.training["epochs"],
        **sizes,
        "epsilon_per_report": spec.epsilon_value / spec.training["epochs"],
        "epsilon_claimed_per_report": accounting.epsilon_claimed,
        "epsilon_worst_case_per_report": accounting.epsilon_worst_case,
        "bits_per_report": float(accounting.bits),
        "reports_per_client_max": max_reports,
        # Basic composition over the reports each client sent; the ledger's worst client.
        "epsilon_claimed_client_max": accounting.epsilon_claimed * max_reports,
        "epsilon_worst_case_client_max": accounting.epsilon_worst_case * max_reports,
        "uplink_bits_total": float(accounting.bits) * float(reports.sum()),
        "train_seconds": result.final["train_seconds"],
        "wall_seconds": wall_seconds,
        "started_at": started_at,
        "finished_at": _now(),
        "ldpbench_version": ldpbench.__version__,
        "torch_version": torch.__version__,
    }


def _write(frame: pd.DataFrame, schema: pa.Schema, target: Path) -> None:
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    with atomic_path(target) as tmp:
        pq.write_table(table, tmp)


def execute(spec: RunSpec, prepared_dir: str | Path, out_dir: str | Path) -> dict:
    """Run `spec` and write curve.parquet then summary.parquet (each atomically) into out_dir."""
    torch.set_num_threads(1)  # runs are parallelised by the scheduler, one core each
    started_at, clock = _now(), time.perf_counter()
    result, sizes = train(spec, prepared_dir)
    out_dir = Path(out_dir)
    curve = pd.DataFrame(result.curve)
    curve.insert(0, "run_id", spec.run_id)
    _write(curve[CURVE_SCHEMA.names], CURVE_SCHEMA, out_dir / CURVE_FILE)
    row = summary_row(spec, result, sizes, started_at, time.perf_counter() - clock)
    # The summary is written last: its presence marks a complete run.
    _write(pd.DataFrame([row])[SUMMARY_SCHEMA.names], SUMMARY_SCHEMA, out_dir / SUMMARY_FILE)
    return row

