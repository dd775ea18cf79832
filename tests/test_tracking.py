"""MLflow tracking at the function level, on temporary SQLite stores: MLflow follows the runs table
(runs dropped from a campaign are soft-deleted, restored when they return)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ldpbench.results.tracking import track

SEEDS = (0, 1)


def write_tables(directory: Path, epsilons: tuple[float, ...]) -> list[str]:
    """runs/curves/summary tables of a campaign 'c' with one run per (ε, seed); returns the run ids."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = json.dumps({"folds": 1, "test_fraction": 0.2, "mechanism_params": {}, "training": {"epochs": 1}})
    numbers = ("test_accuracy", "test_loss", "train_loss", "train_seconds", "wall_seconds",
               "epsilon_per_report", "epsilon_claimed_per_report", "epsilon_worst_case_per_report",
               "bits_per_report", "epsilon_claimed_client_max", "epsilon_worst_case_client_max",
               "uplink_bits_total")
    runs = [{"campaign": "c", "run_id": f"run-eps{epsilon:g}-seed{seed}", "dataset": "d", "model": "lr",
             "mechanism": "pm", "label": "PM", "epsilon": float(epsilon), "seed": seed, "fold": 0,
             "spec": spec, "status": "ok", "rounds": 2, **{name: 0.5 for name in numbers},
             "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:01:00+00:00"}
            for epsilon in epsilons for seed in SEEDS]
    curves = [{"run_id": run["run_id"], "round": step, "test_accuracy": 0.5, "test_loss": 1.0,
               "train_loss": 1.0} for run in runs for step in (1, 2)]
    pd.DataFrame(runs).to_parquet(directory / "runs.parquet")
    pd.DataFrame(curves).to_parquet(directory / "curves.parquet")
    pd.DataFrame({"epsilon": list(epsilons)}).to_parquet(directory / "summary.parquet")
    return [run["run_id"] for run in runs]


def track_tables(root: Path, uri: str, epsilons: tuple[float, ...], **kwargs) -> tuple[dict, list[str]]:
    run_ids = write_tables(root / "tables", epsilons)
    (root / "report").mkdir(exist_ok=True)
    result = track(root / "tables", root / "report", uri, "ldpbench/c", root / "artifacts",
                   root / "mlflow.json", **kwargs)
    return result, run_ids


def children_of(uri: str, parent_id: str, active_only: bool) -> list:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ldpbench/c")
    return client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'",
                              run_view_type=ViewType.ACTIVE_ONLY if active_only else ViewType.ALL,
                              max_results=1000)


def test_runs_dropped_from_the_campaign_are_deleted_and_restored_when_they_come_back(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first, all_six = track_tables(tmp_path, uri, (1, 2, 4))
    assert first["created"] == 6

    dropped, four = track_tables(tmp_path, uri, (1, 2))  # ε = 4 removed from the campaign
    assert dropped["parent_run_id"] == first["parent_run_id"]
    active = children_of(uri, first["parent_run_id"], active_only=True)
    assert sorted(run.data.tags["run_key"] for run in active) == sorted(four)
    assert dropped["removed"] == 2 and dropped["skipped"] == 4 and dropped["created"] == 0
    # Soft-deleted, not purged: still in the store, restorable.
    assert len(children_of(uri, first["parent_run_id"], active_only=False)) == 6

    back, _ = track_tables(tmp_path, uri, (1, 2, 4))  # ε = 4 re-added
    active = children_of(uri, first["parent_run_id"], active_only=True)
    assert sorted(run.data.tags["run_key"] for run in active) == sorted(all_six)
    everything = children_of(uri, first["parent_run_id"], active_only=False)
    assert len(everything) == 6  # restored, not logged a second time
    assert back["restored"] == 2 and back["created"] == 0 and back["removed"] == 0
    assert back["runs"] == first["runs"]  # the same MLflow run for every run_key
    restored = [run for run in active if run.data.tags["epsilon"] == "4.0"]
    assert all(run.data.metrics["final_test_accuracy"] == 0.5 for run in restored)
