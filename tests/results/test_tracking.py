"""MLflow tracking at the function level, on temporary SQLite stores: MLflow follows the runs table
(runs dropped from a campaign are soft-deleted, restored when they return) and store failures
(locked, read-only, not a database) end in one line that names the store."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from ldpbench.errors import LdpbenchError
from ldpbench.results.tracking import track

import fresh_processes

SEEDS = (0, 1)


def write_tables(directory: Path, epsilons: tuple[float, ...], seeds: tuple[int, ...] = SEEDS) -> list[str]:
    """runs/curves/summary tables of a campaign 'c' with one run per (ε, seed); returns the run ids."""
    from ldpbench.results.tables import summarize

    directory.mkdir(parents=True, exist_ok=True)
    plan = json.dumps({"folds": 1, "test_fraction": 0.2, "network_params": {}, "mechanism_params": {},
                       "training": {"epochs": 1}})
    numbers = ("test_accuracy", "test_auc", "test_loss", "train_loss", "train_seconds", "wall_seconds",
               "epsilon_per_report", "epsilon_claimed_per_report", "epsilon_worst_case_per_report",
               "bits_per_report", "epsilon_claimed_client_max", "epsilon_worst_case_client_max",
               "uplink_bits_total")
    runs = [{"campaign": "c", "run_id": f"run-eps{epsilon:g}-seed{seed}", "dataset": "d", "model": "lr",
             "mechanism": "pm", "mechanism_params": "{}", "label": "PM", "epsilon": float(epsilon), "seed": seed,
             "fold": 0, "plan": plan, "status": "ok", "rounds": 2, "classes": 2, "reports_per_client_max": 1,
             **{name: 0.5 for name in numbers}, "test_accuracy": 0.5 + seed / 10,
             "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:01:00+00:00"}
            for epsilon in epsilons for seed in seeds]
    curves = [{"run_id": run["run_id"], "round": step, "test_accuracy": 0.5, "test_loss": 1.0,
               "train_loss": 1.0} for run in runs for step in (1, 2)]
    pd.DataFrame(runs).to_parquet(directory / "runs.parquet")
    pd.DataFrame(curves).to_parquet(directory / "curves.parquet")
    summarize(pd.DataFrame(runs)).to_parquet(directory / "summary.parquet")
    return [run["run_id"] for run in runs]


def track_tables(root: Path, uri: str, epsilons: tuple[float, ...], seeds: tuple[int, ...] = SEEDS,
                 **kwargs) -> tuple[dict, list[str]]:
    run_ids = write_tables(root / "tables", epsilons, seeds)
    (root / "report").mkdir(exist_ok=True)
    result = track(root / "tables", root / "report", uri, "ldpbench/c", root / "artifacts",
                   root / "mlflow.json", **kwargs)
    return result, run_ids


def logged(uri: str, level: str, active_only: bool = True) -> list:
    """The MLflow runs of campaign 'c' at one level (campaign, configuration, run)."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ldpbench/c")
    return client.search_runs([experiment.experiment_id], f"tags.`ldpbench.level` = '{level}'",
                              run_view_type=ViewType.ACTIVE_ONLY if active_only else ViewType.ALL,
                              max_results=1000)


def test_runs_dropped_from_the_campaign_are_deleted_and_restored_when_they_come_back(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first, all_six = track_tables(tmp_path, uri, (1, 2, 4))
    assert first["created"] == 6 and first["configurations"]["created"] == 3

    dropped, four = track_tables(tmp_path, uri, (1, 2))  # ε = 4 removed from the campaign
    assert sorted(run.data.tags["run_key"] for run in logged(uri, "run")) == sorted(four)
    assert dropped["removed"] == 2 and dropped["skipped"] == 4 and dropped["created"] == 0
    assert dropped["configurations"]["removed"] == 1 and dropped["configurations"]["skipped"] == 2
    # Soft-deleted, not purged: still in the store, restorable.
    assert len(logged(uri, "run", active_only=False)) == 6

    back, _ = track_tables(tmp_path, uri, (1, 2, 4))  # ε = 4 re-added
    assert sorted(run.data.tags["run_key"] for run in logged(uri, "run")) == sorted(all_six)
    assert len(logged(uri, "run", active_only=False)) == 6  # restored, not logged a second time
    assert back["restored"] == 2 and back["created"] == 0 and back["removed"] == 0
    assert back["configurations"]["restored"] == 1 and back["configurations"]["created"] == 0
    # The same MLflow run for every key; the campaign run too (it shows ε = 1, 2, 4 again).
    assert back["runs"] == first["runs"] and back["campaign_run_id"] == first["campaign_run_id"]
    restored = [run for run in logged(uri, "run") if run.data.tags["epsilon"] == "4"]
    assert all(run.data.tags["final.test_auc"] == "0.5" for run in restored)


def locked_error():
    """What MLflow raises when SQLite's lock outlasts the busy timeout."""
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    try:
        raise sqlalchemy.exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked"))
    except sqlalchemy.exc.OperationalError as cause:
        try:
            raise MlflowException(str(cause)) from cause
        except MlflowException as error:
            return error


def test_a_locked_store_is_retried_until_it_is_free(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from ldpbench.results.tracking import LockRetry

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    real_create_run = MlflowClient.create_run
    calls = []

    def create_run_locked_twice(self, *args, **kwargs):
        calls.append(len(calls))
        if len(calls) <= 2:
            raise locked_error()
        return real_create_run(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "create_run", create_run_locked_twice)
    result, run_ids = track_tables(tmp_path, uri, (1,), retry=LockRetry(first_pause=0.01, total_seconds=5))
    assert result["created"] == len(run_ids)
    # Two locked attempts, then the campaign run, the one configuration, its curve across ε and each run.
    assert len(calls) == 2 + 1 + 1 + 1 + len(run_ids)


def test_a_store_locked_past_the_limit_fails_naming_the_store(tmp_path, monkeypatch):
    from ldpbench.errors import TrackingStoreError
    from ldpbench.results.tracking import LockRetry, call_store

    attempts = []

    def always_locked():
        attempts.append(1)
        raise locked_error()

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # call_store's error check imports MLflow's and SQLAlchemy's errors at the first error: a second in a
    # process that had not imported MLflow yet, past the 0.1 s below. Imported first, as a track step has.
    import mlflow.exceptions  # noqa: F401
    import sqlalchemy.exc  # noqa: F401

    with pytest.raises(TrackingStoreError) as info:
        call_store(uri, always_locked, retry=LockRetry(first_pause=0.01, total_seconds=0.1))
    message = str(info.value)
    assert uri in message and "database is locked" in message and "\n" not in message
    # Pauses 0.01, 0.02, 0.04 fit in 0.1 s, 0.08 more would not: at most four attempts, at least two.
    assert 2 <= len(attempts) <= 4


@pytest.mark.slow  # SQLite's busy timeout (20 s, set by MLflow) runs out once before the error
def test_a_store_held_locked_by_another_connection_fails_naming_the_store(tmp_path):
    from ldpbench.results.tracking import LockRetry

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    track_tables(tmp_path, uri, (1,))
    holder = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(LdpbenchError, match="database is locked") as info:
            track_tables(tmp_path, uri, (1, 2), retry=LockRetry(first_pause=0.01, total_seconds=0))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert uri in str(info.value)


def track_command(root: Path, uri: str) -> list[str]:
    return [sys.executable, "-m", "ldpbench", "track", "--tables-dir", str(root / "tables"),
            "--report-dir", str(root / "report"), "--uri", uri, "--experiment", "ldpbench/c",
            "--artifact-dir", str(root / "artifacts"), "--marker", str(root / "mlflow.json")]


@pytest.mark.slow  # a fresh `ldpbench track` process, which waits out one busy timeout (5 s)
def test_track_retries_a_locked_store_and_succeeds_once_the_lock_is_released(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    track_tables(tmp_path, uri, (1,))
    write_tables(tmp_path / "tables", (1, 2))
    holder = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    process = subprocess.Popen(track_command(tmp_path, uri), stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in process.stderr:  # the lock is held until `track` says it will retry
            seen.append(line)
            if "is locked; retrying" in line and holder.in_transaction:
                holder.execute("ROLLBACK")
        process.wait(timeout=300)
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        process.kill()
    assert process.returncode == 0, "".join(seen)
    assert any("is locked; retrying" in line for line in seen)
    assert json.loads((tmp_path / "mlflow.json").read_text())["created"] == 2


def test_a_read_only_store_fails_naming_the_store(tmp_path):
    # Tests run as root, where file modes do not stop writes: SQLite's read-only open mode does.
    path = tmp_path / "mlflow.db"
    track_tables(tmp_path, f"sqlite:///{path}", (1,))
    read_only = f"sqlite:///file:{path}?mode=ro&uri=true"
    with pytest.raises(LdpbenchError, match="readonly database") as info:
        track_tables(tmp_path, read_only, (1, 2))
    assert read_only in str(info.value)


def test_track_on_a_file_that_is_not_a_store_prints_one_line_naming_it(tmp_path):
    write_tables(tmp_path / "tables", (1,))
    (tmp_path / "report").mkdir()
    not_a_store = tmp_path / "notes.db"
    not_a_store.write_text("these are notes, not an SQLite database\n")
    result = subprocess.run(track_command(tmp_path, f"sqlite:///{not_a_store}"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"ldpbench track: error: MLflow tracking store sqlite:///{not_a_store}: "
                      "file is not a database"], result.stderr


def test_a_store_path_under_a_file_fails_naming_the_store(tmp_path):
    from ldpbench.results.tracking import resolve_uri

    (tmp_path / "plain-file").write_text("")
    uri = f"sqlite:///{tmp_path / 'plain-file' / 'mlflow.db'}"
    with pytest.raises(LdpbenchError, match="cannot create its directory") as info:
        resolve_uri(uri)
    assert uri in str(info.value)


def test_runs_are_filterable_by_epsilon_as_typed_and_carry_auc_epsilon_and_their_source(tmp_path):
    """What a researcher does first in the UI: filter `params.epsilon = '2'`, chart against ε, see
    AUC, see who logged what from which commit; the experiment opens as model training, not GenAI."""
    from mlflow.tracking import MlflowClient

    from ldpbench.results.tracking import EXPERIMENT_KIND

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_ids = write_tables(tmp_path / "tables", (2.0, 0.5))
    curves = pd.read_parquet(tmp_path / "tables" / "curves.parquet").assign(test_auc=0.75)
    curves.to_parquet(tmp_path / "tables" / "curves.parquet")
    (tmp_path / "manifest.json").write_text(json.dumps({"runs": run_ids}))
    (tmp_path / "report").mkdir()
    result = track(tmp_path / "tables", tmp_path / "report", uri, "ldpbench/c", tmp_path / "artifacts",
                   tmp_path / "mlflow.json")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ldpbench/c")
    assert experiment.tags[EXPERIMENT_KIND[0]] == EXPERIMENT_KIND[1]
    found = client.search_runs([experiment.experiment_id], "params.epsilon = '2'")
    levels = sorted((run.data.tags["ldpbench.level"], run.data.tags["run_key"]) for run in found)
    assert [key for level, key in levels if level == "run"] == sorted(r for r in run_ids if "eps2-" in r)
    assert [level for level, key in levels if level != "run"] == ["configuration"]
    child = next(run for run in found if run.data.tags["ldpbench.level"] == "run")
    assert child.data.tags["final.epsilon_per_report"] == "0.5" and child.data.tags["final.test_auc"] == "0.5"
    assert set(child.data.metrics) == {"test_accuracy", "test_auc", "test_loss", "train_loss"}  # curves only
    assert [m.value for m in client.get_metric_history(child.info.run_id, "test_auc")] == [0.75, 0.75]
    import ldpbench

    assert child.data.tags["ldpbench.version"] == ldpbench.__version__ and "torch.version" in child.data.tags
    assert child.data.tags["mlflow.source.name"] == "ldpbench"
    head = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[2]), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    if len(head) == 40:  # a git checkout (CI's clone is one)
        assert child.data.tags["mlflow.source.git.commit"] == head
    campaign = client.get_run(result["campaign_run_id"])
    assert campaign.data.tags["ldpbench.version"] == ldpbench.__version__
    assert "manifest.json" in {artifact.path for artifact in client.list_artifacts(campaign.info.run_id)}


def test_configurations_are_top_level_runs_with_intervals_verdicts_and_their_runs_under_them(tmp_path):
    """The level the runs page shows first: one run per configuration with the mean and interval
    over its seeds, ε as a number, rank, verdict and audited bound; its runs as children; the
    campaign run with the campaign file; datasets as inputs with their digests."""
    from mlflow.tracking import MlflowClient

    from ldpbench.results.tables import bounded_interval

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_ids = write_tables(tmp_path / "tables", (2.0, 0.5), seeds=(0, 1, 2))
    tables = tmp_path / "tables"
    # Which records each run trained and was tested on (the runner's split digests; no validation split).
    runs_table = pd.read_parquet(tables / "runs.parquet")
    runs_table["training_digest"] = [f"{index:016x}" for index in range(len(runs_table))]
    runs_table["validation_digest"] = None
    runs_table["test_digest"] = [f"{index + 100:016x}" for index in range(len(runs_table))]
    runs_table.assign(records=80, test_records=20).to_parquet(tables / "runs.parquet")
    pd.DataFrame([{"dataset": "d", "model": "lr", "epsilon": eps, "metric": "test_accuracy", "label": "PM",
                   "rank": 1, "group": "a", "top": True, "pareto_epsilon": True, "pareto_bits": False}
                  for eps in (2.0, 0.5)]).to_parquet(tables / "rankings.parquet")
    pd.DataFrame([{"dataset": "d", "model": "lr", "epsilon": 2.0, "metric": "test_accuracy", "best": "PM",
                   "verdict": "PM"}]).to_parquet(tables / "verdicts.parquet")
    pd.DataFrame([{"mechanism": "pm", "params": "{}", "epsilon": 0.5, "audited_lower_bound": 0.48,
                   "verdict": "consistent"}]).to_parquet(tables / "audit.parquet")
    meta = tmp_path / "prepared" / "d" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"n": 100, "d": 4, "classes": ["a", "b"],
                                "files": {"data.parquet": {"sha256": "ab" * 32, "bytes": 10}}}))
    campaign_file = tmp_path / "campaign.yaml"
    campaign_file.write_text("name: c\n")
    (tmp_path / "report").mkdir()
    result = track(tables, tmp_path / "report", uri, "ldpbench/c", tmp_path / "artifacts",
                   tmp_path / "mlflow.json", datasets={"d": meta}, campaign_file=campaign_file)
    client = MlflowClient(tracking_uri=uri)

    configurations = {run.data.params["epsilon"]: run for run in logged(uri, "configuration")}
    assert sorted(configurations) == ["0.5", "2"]
    mean, std, low, high = bounded_interval(pd.Series([0.5, 0.6, 0.7]).to_numpy())
    for configuration in configurations.values():
        assert "mlflow.parentRunId" not in configuration.data.tags  # top level: shown first
        metrics = configuration.data.metrics
        assert metrics["test_accuracy_mean"] == pytest.approx(mean)
        assert (metrics["test_accuracy_ci95_low"], metrics["test_accuracy_ci95_high"]) == pytest.approx((low, high))
        assert metrics["test_auc_mean"] == 0.5 and metrics["runs_ok"] == 3 and metrics["rank"] == 1
        assert configuration.data.tags["trivial"] == "auc"  # AUC 0.5 on every seed: a constant predictor's
        assert metrics["epsilon"] == float(configuration.data.params["epsilon"])
        assert configuration.info.run_name == f"d/lr/PM/eps={configuration.data.params['epsilon']}"
        inputs = configuration.inputs.dataset_inputs
        assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [("d", "ab" * 8)]
        assert [i.tags for i in inputs] == [[]]  # the whole prepared data: no split, no context
    assert configurations["2"].data.metrics["verdict_best"] == 1.0
    assert configurations["2"].data.tags["verdict"] == "PM"
    # At a glance: the interval in percent, rounded, and the verdict's standing, in the description.
    assert configurations["2"].data.metrics["accuracy_pct"] == round(100 * mean, 2)
    assert configurations["2"].data.metrics["accuracy_pct_ci_lower"] == round(100 * low, 2)
    assert configurations["2"].data.tags["mlflow.note.content"] == \
        f"{100 * mean:.2f} % [{100 * low:.2f}, {100 * high:.2f}] · best · trivial: auc"
    assert configurations["0.5"].data.tags["mlflow.note.content"].endswith(" · not compared · trivial: auc")
    assert configurations["0.5"].data.metrics["epsilon_audited_lower_bound"] == 0.48
    assert "verdict_best" not in configurations["0.5"].data.metrics  # no verdict at that ε

    # The curve of PM across ε on (d, lr): step i holds the i-th smallest ε and its accuracy in percent.
    [curve] = logged(uri, "curve")
    assert curve.info.run_name == "d/lr/PM" and "mlflow.parentRunId" not in curve.data.tags
    history = {name: [(point.step, point.value) for point in client.get_metric_history(curve.info.run_id, name)]
               for name in ("d/lr/epsilon", "d/lr/accuracy_pct", "d/lr/accuracy_pct_ci_lower")}
    assert history["d/lr/epsilon"] == [(0, 0.5), (1, 2.0)]
    assert history["d/lr/accuracy_pct"] == [(0, round(100 * mean, 2)), (1, round(100 * mean, 2))]
    assert history["d/lr/accuracy_pct_ci_lower"] == [(0, round(100 * low, 2)), (1, round(100 * low, 2))]
    runs = logged(uri, "run")
    assert sorted(run.data.tags["run_key"] for run in runs) == sorted(run_ids)
    splits = runs_table.set_index("run_id")
    for run in runs:
        configuration = configurations[run.data.params["epsilon"]]
        assert run.data.tags["mlflow.parentRunId"] == configuration.info.run_id
        # Its inputs: the records it trained on and those it was tested on, each with its context.
        inputs = {tag.value: i.dataset for i in client.get_run(run.info.run_id).inputs.dataset_inputs
                  for tag in i.tags if tag.key == "mlflow.data.context"}
        row = splits.loc[run.data.tags["run_key"]]
        assert {context: dataset.digest for context, dataset in inputs.items()} == {
            "training": row["training_digest"], "test": row["test_digest"]}
        assert json.loads(inputs["test"].profile)["split_records"] == 20 and inputs["test"].name == "d"
    campaign = client.get_run(result["campaign_run_id"])
    assert "mlflow.parentRunId" not in campaign.data.tags
    assert campaign.data.params["epsilons"] == "0.5, 2" and campaign.data.metrics["configurations"] == 2
    assert "campaign.yaml" in {artifact.path for artifact in client.list_artifacts(campaign.info.run_id)}
    # The configurations view: MLflow's UI opens it from the experiment tag named in its address.
    experiment = client.get_experiment(result["experiment_id"])
    key = result["configurations_view"].split("viewStateShareKey=")[1].split("&")[0]
    view = json.loads(experiment.tags[f"mlflow.sharedViewState.{key}"])
    assert view["searchFilter"] == "tags.`ldpbench.level` = 'configuration'"
    assert view["selectedColumns"][:4] == ["attributes.`Description`", "metrics.`accuracy_pct`",
                                           "metrics.`accuracy_pct_ci_lower`", "metrics.`accuracy_pct_ci_upper`"]
    assert result["configurations_view"] in experiment.tags["mlflow.note.content"]


def test_a_configuration_that_gains_a_seed_is_logged_again_and_its_runs_move_under_it(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first, _ = track_tables(tmp_path, uri, (2.0,), seeds=(0, 1))
    again, _ = track_tables(tmp_path, uri, (2.0,), seeds=(0, 1))
    assert again["configurations"]["skipped"] == 1 and again["skipped"] == 2 and again["runs"] == first["runs"]

    grown, run_ids = track_tables(tmp_path, uri, (2.0,), seeds=(0, 1, 2))
    assert grown["configurations"] == {**grown["configurations"], "created": 1, "replaced": 1}
    assert grown["created"] == 1 and grown["skipped"] == 2 and grown["reparented"] == 2
    [configuration] = logged(uri, "configuration")
    assert configuration.data.metrics["runs"] == 3
    assert {run.data.tags["mlflow.parentRunId"] for run in logged(uri, "run")} == {configuration.info.run_id}


def test_a_campaign_logged_in_the_old_layout_is_logged_again_in_the_new_one(tmp_path):
    """Before the configuration level, a campaign was one parent run with a child per run, marked
    complete with "1": those are soft-deleted and the campaign logged in today's layout."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("ldpbench/c", artifact_location=(tmp_path / "a").as_uri())
    parent = client.create_run(experiment_id, run_name="c", tags={"run_key": "campaign:c", "campaign": "c"})
    old = [client.create_run(experiment_id, tags={"mlflow.parentRunId": parent.info.run_id, "run_key": key,
                                                  "ldpbench.complete": "1"})
           for key in ("run-eps2-seed0", "run-eps2-seed1")]
    result, run_ids = track_tables(tmp_path, uri, (2.0,))
    assert result["legacy_removed"] == 3 and result["created"] == 2
    for run in (parent, *old):
        assert client.get_run(run.info.run_id).info.lifecycle_stage == "deleted"
    assert sorted(run.data.tags["run_key"] for run in logged(uri, "run")) == sorted(run_ids)


RACE_WAIT_SECONDS = 10.0  # how long a `track` that has searched waits for the other to have searched too


def _racing_track(root: str, uri: str, start, searched, outcomes) -> None:
    """One `track` in its own process. Both start together (`start`); once one has searched the
    store for its run keys it waits until the other has searched too (`searched`, at most
    RACE_WAIT_SECONDS): the window in which two unserialised steps would both find nothing and
    both create every run. A step waiting for the other's lock breaks that wait by its timeout."""
    try:
        from ldpbench.results import tracking

        real_search = tracking._runs_by_key

        def search_then_wait(*args, **kwargs):
            found = real_search(*args, **kwargs)
            try:
                searched.wait(timeout=RACE_WAIT_SECONDS)
            except threading.BrokenBarrierError:  # the other one waits for the lock (or timed out)
                pass
            return found

        tracking._runs_by_key = search_then_wait
        start.wait(timeout=300)
        directory = Path(root)
        tracking.track(directory / "tables", directory / "report", uri, "ldpbench/c", directory / "artifacts",
                       directory / "mlflow.json")
        outcomes.put(None)
    except Exception as error:  # reported to the parent, which fails the test with it
        outcomes.put(f"{type(error).__name__}: {error}")


@pytest.mark.slow  # two fresh processes importing MLflow, and one waits out RACE_WAIT_SECONDS
def test_two_track_steps_at_once_leave_one_run_per_key(tmp_path):
    """Two Snakemake invocations of a campaign (or two campaigns sharing the store) tracking at once:
    both search for the run keys before either creates; one run per key all the same."""
    from ldpbench.results.tracking import init_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_ids = write_tables(tmp_path / "tables", (1, 2))
    (tmp_path / "report").mkdir()
    init_store(uri, "ldpbench/c", tmp_path / "artifacts", tmp_path / "store.json")  # as the workflow does
    context = fresh_processes.context()
    start, searched, outcomes = context.Barrier(2), context.Barrier(2), context.Queue()
    steps = [context.Process(target=_racing_track, args=(str(tmp_path), uri, start, searched, outcomes))
             for _ in range(2)]
    for process in steps:
        process.start()
    results = [outcomes.get(timeout=300) for _ in steps]
    for process in steps:
        process.join(timeout=60)
    assert results == [None, None]

    keys = Counter(run.data.tags["run_key"] for level in ("campaign", "configuration", "run")
                   for run in logged(uri, level))
    assert {key: count for key, count in keys.items() if count > 1} == {}
    assert sorted(key for key in keys if not key.startswith(("campaign:", "configuration:"))) == sorted(run_ids)
    assert len(keys) == len(run_ids) + 2 + 1  # the runs, two configurations, the campaign


def test_a_server_that_answers_but_is_not_mlflow_fails_at_once_naming_it_and_its_answer(tmp_path):
    """`tracking.uri` pointing at some other web server (a wrong port): it answers 404 on /health at
    once, so there is nothing to wait for (the wait for a server that does not answer is 60 s)."""
    from ldpbench.results.tracking import init_store

    from http_fixture import serve_directory

    (tmp_path / "empty").mkdir()
    with serve_directory(tmp_path / "empty") as base:
        started = time.monotonic()
        with pytest.raises(LdpbenchError) as info:
            init_store(base, "ldpbench/c", tmp_path / "artifacts", tmp_path / "store.json")
        elapsed = time.monotonic() - started
    message = str(info.value)
    assert f"'{base}' is not an MLflow tracking server" in message and "HTTP 404" in message, message
    assert elapsed < 10, f"{elapsed:.1f} s before failing"


def _track_without_http_settings(root: Path, uri: str) -> tuple[subprocess.CompletedProcess, float]:
    """`ldpbench track` of the tables under `root` into `uri`, with MLflow's HTTP settings left to
    ldpbench (none inherited from this process); its result and how long it took."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_HTTP_")}
    started = time.monotonic()
    result = subprocess.run(track_command(root, uri), capture_output=True, text=True, timeout=180, env=env)
    return result, time.monotonic() - started


TRACK_FAILS_WITHIN_SECONDS = 60  # starting Python and importing MLflow included (MLflow's own retries: ~4 min)


@pytest.mark.slow  # a fresh `ldpbench track` process
def test_track_fails_fast_naming_the_server_when_the_server_is_gone(tmp_path):
    """The tracking server was killed during the campaign: nothing listens at its address."""
    write_tables(tmp_path / "tables", (1,))
    (tmp_path / "report").mkdir()
    with socket.socket() as probe:  # a port nothing listens on, as a killed server leaves it
        probe.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{probe.getsockname()[1]}"
    result, elapsed = _track_without_http_settings(tmp_path, uri)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"ldpbench track: error: MLflow tracking server at '{uri}' did not answer /health" in result.stderr
    assert elapsed < TRACK_FAILS_WITHIN_SECONDS, f"{elapsed:.0f} s before failing"


@pytest.mark.slow  # a fresh `ldpbench track` process
def test_track_fails_fast_naming_the_server_when_it_dies_after_its_health_check(tmp_path):
    """The server answers `track`'s health check, then dies: MLflow's client gives up on its requests
    after a few seconds of retries, not minutes."""
    from http_fixture import server_gone_after_health

    write_tables(tmp_path / "tables", (1,))
    (tmp_path / "report").mkdir()
    with server_gone_after_health() as uri:
        result, elapsed = _track_without_http_settings(tmp_path, uri)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"ldpbench track: error: MLflow tracking store {uri}: " in result.stderr, result.stderr
    assert elapsed < TRACK_FAILS_WITHIN_SECONDS, f"{elapsed:.0f} s before failing"


def test_bounds_on_mlflows_http_client_leave_a_users_own_setting(monkeypatch):
    from ldpbench.results.mlflow_common import TRACK_HTTP_ENVIRONMENT, quiet_mlflow

    for name in TRACK_HTTP_ENVIRONMENT:  # unset here, restored after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "5")
    quiet_mlflow(TRACK_HTTP_ENVIRONMENT)
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == TRACK_HTTP_ENVIRONMENT["MLFLOW_HTTP_REQUEST_TIMEOUT"]


def test_ui_names_the_store_it_cannot_find(tmp_path, capsys):
    from ldpbench.cli import main

    (tmp_path / "results").mkdir()  # a results directory of a campaign that did not track
    assert main(["ui", str(tmp_path / "results")]) == 2
    assert (f"ldpbench ui: error: no MLflow store at '{tmp_path / 'results' / 'mlflow.db'}'"
            in capsys.readouterr().err)


@pytest.mark.slow  # MLflow's server starts (seconds)
def test_ui_serves_the_store_and_names_each_campaigns_configurations_view(tmp_path, capsys):
    import urllib.request

    from ldpbench.results.tracking import CONFIGURATIONS_VIEW, VIEW_TAG_PREFIX, browse

    track_tables(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", (1,))
    with serving_ui(tmp_path) as (ui, served_at, printed):
        port = int(served_at.rsplit(":", 1)[1])
        assert printed[0].startswith(f"MLflow's UI on {tmp_path / 'mlflow.db'}, at {served_at} (Ctrl-C stops it)")
        experiment, address = printed[1].split(": ", 1)
        experiment_id = address.split("/#/experiments/")[1].split("/")[0]
        assert (experiment.strip(), address.strip()) == (
            "ldpbench/c", f"{served_at}/#/experiments/{experiment_id}/runs?viewStateShareKey={CONFIGURATIONS_VIEW}"
                          "&workflowType=machine_learning")
        assert printed[2].strip() == (f"ldpbench/c, accuracy against ε: {served_at}/#/experiments/{experiment_id}"
                                      "/runs?viewStateShareKey=ldpbench-curves&workflowType=machine_learning"
                                      "&compareRunsMode=CHART")
        with urllib.request.urlopen(f"{served_at}/ajax-api/2.0/mlflow/experiments/get?"
                                    f"experiment_id={experiment_id}", timeout=30) as answer:
            tags = {tag["key"] for tag in json.load(answer)["experiment"]["tags"]}
        assert VIEW_TAG_PREFIX + CONFIGURATIONS_VIEW in tags  # the view the address opens
        # A tracking server's address: its campaigns are named, nothing is served.
        assert browse(served_at, "127.0.0.1", port) == 0
        assert address.strip() in capsys.readouterr().out
    assert ui.returncode == 128 + 15  # SIGTERM: it stopped the server on its way out
    with pytest.raises(OSError):  # the server went with it
        urllib.request.urlopen(f"{served_at}/health", timeout=5)


@contextlib.contextmanager
def serving_ui(directory: Path):
    """`ldpbench ui directory` on a free port: (its process, the address served, its first three lines of
    output: where it serves, then the first campaign's configurations and curves views); terminated on
    the way out."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ui = subprocess.Popen([sys.executable, "-m", "ldpbench", "ui", str(directory), "--port", str(port)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield ui, f"http://127.0.0.1:{port}", [ui.stdout.readline() for _ in range(3)]
    finally:
        ui.terminate()
        ui.wait(timeout=60)


@pytest.mark.slow  # MLflow's server starts, then Chromium renders four pages (a minute)
def test_ui_lands_in_model_training_reading_each_configuration_in_its_first_columns(tmp_path):
    """The address `ldpbench ui` prints, at 1600 x 1000 in Chromium: model training (not GenAI), the
    configurations alone, and, in the first columns after the run's name and times, its description
    (mean and interval in percent, the verdict's standing) then the accuracy in percent, rounded; the
    curves view draws the mechanisms' accuracy against ε, its legend naming them; the tuning run's page
    lists its trials."""
    from mlflow.tracking import MlflowClient

    from browser import chromium_or_skip, render
    from tiny_campaign import build_campaign

    chromium = chromium_or_skip()
    build_campaign(tmp_path)
    (tmp_path / "report").mkdir()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    track(tmp_path / "tables", tmp_path / "report", uri, "ldpbench/tiny", tmp_path / "artifacts",
          tmp_path / "mlflow.json")
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.get_experiment_by_name("ldpbench/tiny").experiment_id
    [sweep] = client.search_runs([experiment_id], "tags.`ldpbench.level` = 'tuning'")
    summary = pd.read_parquet(tmp_path / "tables" / "summary.parquet").set_index("label")
    # What the description must read, from the tables: PM beats HM; NP (ε = ∞) is not compared.
    standing = {"PM": "best", "HM": "rank 2, below PM", "NP": "not compared (no privacy)"}
    expected = {label: f"{100 * row['mean']:.2f} % [{100 * row['ci95_low']:.2f}, {100 * row['ci95_high']:.2f}] · "
                       f"{standing[label]}" for label, row in summary.iterrows()}
    with serving_ui(tmp_path) as (_, served_at, printed), tempfile.TemporaryDirectory() as profile:
        address = printed[1].split(": ", 1)[1].strip()
        view = render(chromium, address, "ui-configurations-1600x1000.png", f"{profile}/view", "1600,1000")
        curves = render(chromium, printed[2].split(": ", 1)[1].strip(), "ui-curves-1600x1000.png", f"{profile}/curves",
                        "1600,1000")
        sweep_page = f"{served_at}/#/experiments/{experiment_id}/runs/{sweep.info.run_id}?workflowType=machine_learning"
        trials = render(chromium, sweep_page, "ui-tuning-run.png", f"{profile}/tuning", "1600,1000")
    # Model training's sidebar (runs, model registry), not GenAI's (judges, prompts).
    assert "Model registry" in view and "Judges" not in view and "Prompts" not in view
    assert all(f"syn/lr/{label}/eps=" in view for label in expected) and "/seed=" not in view
    headers = list(dict.fromkeys(re.findall(r'role="columnheader"[^>]*col-id="([^"]+)"', view)))
    shown = [header for header in headers if header.startswith(("attributes.", "metrics.", "duration"))]
    assert shown[:6] == ["attributes.`Run Name`", "duration", "attributes.`Description`", "metrics.`accuracy_pct`",
                         "metrics.`accuracy_pct_ci_lower`", "metrics.`accuracy_pct_ci_upper`"], shown
    for label, text in expected.items():
        assert text in view, (label, text)
    # Rounded where shown: the bounds of PM's interval in percent to two decimals (68.46, not 0.684612...).
    for bound in ("ci95_low", "ci95_high"):
        assert f">{round(100 * summary.loc['PM', bound], 2):g}<" in view
    # One chart for the one panel (syn, lr): its legend names the two private mechanisms (NP, ε = ∞, has
    # no place on an ε axis).
    assert "Accuracy against ε, per dataset and model" in curves and "syn/lr/accuracy_pct" in curves
    # Its legend: a line per mechanism and metric (mean, interval bounds), drawn in the mechanism's colour.
    colour = {text: stroke for stroke, text in re.findall(
        r'<path d="M0,6h24" style="stroke-width: 3; stroke: ([^;"]+)[^"]*"></path></svg><span[^>]*>([^<]+)</span>',
        curves)}
    for label in ("PM", "HM"):
        lines = [colour.get(f"syn/lr/{label} (syn/lr/accuracy_pct{part})") for part in ("", "_ci_lower", "_ci_upper")]
        assert None not in lines and len(set(lines)) == 1, (label, colour)
    # In the report's colour for that mechanism, which the run carries (not one MLflow hashes from its id).
    from matplotlib.colors import to_rgb

    from ldpbench.results.palette import mechanism_palette

    palette = mechanism_palette(summary.index)
    for label in ("PM", "HM"):
        red, green, blue = (round(255 * part) for part in to_rgb(palette[label]))
        assert colour[f"syn/lr/{label} (syn/lr/accuracy_pct)"] == f"rgb({red}, {green}, {blue})", (label, colour)
    assert colour["syn/lr/PM (syn/lr/accuracy_pct)"] != colour["syn/lr/HM (syn/lr/accuracy_pct)"]
    assert not any(text.startswith("syn/lr/NP") for text in colour)
    # The tuning run's page lists its two trials as child runs.
    assert "syn/lr/PM/eps=1/point=0/seed=0/fold=0" in trials and "syn/lr/PM/eps=1/point=1/seed=0/fold=0" in trials


def test_each_configuration_and_curve_carries_its_mechanisms_colour_from_the_report(tmp_path):
    """MLflow's UI colours a run by a hash of its id into 29 colours unless the run carries a colour, so two
    mechanisms' lines in the curves view shared one colour by chance (about one campaign in 29). Each
    configuration and curve run carries its mechanism's colour in the report's figures: one per label,
    distinct, whatever the run ids."""
    from matplotlib.colors import to_hex

    from ldpbench.results.mlflow_common import CONFIGURATION, CURVE
    from ldpbench.results.palette import RUN_COLOUR_TAG, mechanism_palette
    from ldpbench.results.tracking_entries import configuration_entries, curve_entries

    from tiny_campaign import build_campaign

    build_campaign(tmp_path)
    runs, summary = (pd.read_parquet(tmp_path / "tables" / f"{name}.parquet") for name in ("runs", "summary"))
    palette = {label: to_hex(colour) for label, colour in mechanism_palette(summary["label"]).items()}
    assert sorted(palette) == ["HM", "NP", "PM"] and len(set(palette.values())) == 3
    entries = [*configuration_entries(summary, runs, {}), *curve_entries(summary, runs)]
    assert {(entry.level, entry.tags["label"]) for entry in entries} == {
        *((CONFIGURATION, label) for label in palette), (CURVE, "PM"), (CURVE, "HM")}
    for entry in entries:
        assert entry.tags[RUN_COLOUR_TAG] == palette[entry.tags["label"]], entry.name


def test_the_report_is_attached_to_the_campaign_run_that_track_logged_without_it(tmp_path):
    """The workflow logs the tables while the report is drawn, then attaches the report: `track` without
    a report directory attaches none, `attach_report` puts every file of it under the campaign run's
    report/ and says which in its marker; a second attach of the same report changes nothing."""
    from mlflow.tracking import MlflowClient

    from ldpbench.results.tracking import attach_report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_tables(tmp_path / "tables", (1,))
    result = track(tmp_path / "tables", None, uri, "ldpbench/c", tmp_path / "artifacts", tmp_path / "mlflow.json")
    client = MlflowClient(tracking_uri=uri)
    campaign_id = result["campaign_run_id"]
    assert "report" not in {artifact.path for artifact in client.list_artifacts(campaign_id)}
    report = tmp_path / "report"
    (report / "figures").mkdir(parents=True)
    (report / "index.html").write_text("<html></html>")
    (report / "figures" / "accuracy.svg").write_text("<svg/>")
    for _ in range(2):
        attached = attach_report(report, uri, "ldpbench/c", tmp_path / "mlflow.json", tmp_path / "report.json")
        assert attached == {"campaign_run_id": campaign_id, "report_files": ["figures/accuracy.svg", "index.html"]}
        assert json.loads((tmp_path / "report.json").read_text()) == attached
        assert {artifact.path for artifact in client.list_artifacts(campaign_id, "report")} == {
            "report/index.html", "report/figures"}
        assert [artifact.path for artifact in client.list_artifacts(campaign_id, "report/figures")] == [
            "report/figures/accuracy.svg"]


def test_attaching_a_report_names_a_marker_that_is_no_tracked_campaigns(tmp_path):
    from ldpbench.results.tracking import attach_report

    (tmp_path / "report").mkdir()
    (tmp_path / "mlflow.json").write_text("[]")
    with pytest.raises(LdpbenchError, match=r"mlflow\.json' is not the marker of a tracked campaign"):
        attach_report(tmp_path / "report", f"sqlite:///{tmp_path / 'mlflow.db'}", "ldpbench/c",
                      tmp_path / "mlflow.json", tmp_path / "report.json")
    assert not (tmp_path / "report.json").exists()


def test_a_tuned_configuration_shows_its_sweep_a_tuning_run_with_its_trials_under_it(tmp_path):
    """MLflow's view of the tuning: under the tuned configuration a tuning run (points tried, the setting
    selected and its score), under that one run per trial with its setting as params and its validation
    curve and score as metrics; tracked again, nothing is logged twice."""
    from mlflow.tracking import MlflowClient

    from tiny_campaign import build_campaign

    build_campaign(tmp_path)
    (tmp_path / "report").mkdir()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    arguments = (tmp_path / "tables", tmp_path / "report", uri, "ldpbench/tiny", tmp_path / "artifacts",
                 tmp_path / "mlflow.json")
    first = track(*arguments)
    assert (first["tunings"]["created"], first["trials"]["created"]) == (1, 2)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ldpbench/tiny")

    def level(name: str) -> list:
        return client.search_runs([experiment.experiment_id], f"tags.`ldpbench.level` = '{name}'")

    [configuration] = [run for run in level("configuration") if run.data.params["label"] == "PM"]
    [sweep] = level("tuning")
    assert sweep.data.tags["mlflow.parentRunId"] == configuration.info.run_id
    assert sweep.info.run_name == f"{configuration.info.run_name}/tuning"
    assert (sweep.data.params["points"], sweep.data.params["selected_point"]) == ("2", "1")
    assert sweep.data.params["tuning_metric"] == "validation_auc"
    assert sweep.data.metrics["selected_score"] == pytest.approx(0.7)
    assert sweep.data.tags["mlflow.note.content"] == ('selected point 1 {"learning_rate": 0.3}: validation_auc 0.7 '
                                                      "(mean over the tuning seeds), of 2 points in 2 trial runs "
                                                      "on private data")
    trials = {run.data.params["setting.learning_rate"]: run for run in level("trial")}
    assert sorted(trials) == ["0.1", "0.3"]
    for rate, score in (("0.1", 0.6), ("0.3", 0.7)):
        trial = trials[rate]
        assert trial.data.tags["mlflow.parentRunId"] == sweep.info.run_id
        assert trial.data.metrics["score"] == pytest.approx(score)
        curve = client.get_metric_history(trial.info.run_id, "validation_auc")
        assert [point.step for point in curve] == [0, 2, 4, 6, 8, 10]
        assert [point.value for point in curve] == [0.0] * 6  # the trial's curve file (tiny_campaign.write_run)
    again = track(*arguments)
    assert (again["tunings"]["skipped"], again["trials"]["skipped"]) == (1, 2)
    assert (again["tunings"]["created"], again["trials"]["created"]) == (0, 0)
    # The trial runs are part of the sweep: without their list, tracking names what is missing.
    (tmp_path / "trials.json").unlink()
    with pytest.raises(LdpbenchError, match="trials.json"):
        track(*arguments)


@pytest.mark.parametrize(("label", "verdict", "rank", "flags", "standing"), [
    ("A", {"best": "A", "verdict": "A"}, 1, {}, "best"),
    ("A", {"best": "A, B, C", "verdict": "tie: A, B, C"}, 1, {}, "tied best with B, C"),
    ("C", {"best": "A, B", "verdict": "tie: A, B (trivial: B)"}, 3, {}, "rank 3, below tie: A, B (trivial: B)"),
    ("B", {"best": "A, B", "verdict": "tie: A, B (trivial: B)"}, 1, {"trivial": True},
     "tied best with A · trivial: accuracy"),
    ("A", None, None, {}, "not compared"),
])
def test_a_configurations_description_reads_its_interval_and_where_the_verdict_puts_it(label, verdict, rank, flags,
                                                                                       standing):
    from ldpbench.results.tracking_entries import description

    row = {"label": label, "epsilon": 1.0, "mean": 0.76631176, "ci95_low": 0.75904, "ci95_high": 0.774166, **flags}
    ranked = None if rank is None else {"rank": rank}
    assert description(row, verdict, ranked) == f"76.63 % [75.90, 77.42] · {standing}"


def test_a_configuration_without_a_successful_run_or_an_interval_says_so():
    from ldpbench.results.tracking_entries import description

    one_seed = {"label": "A", "epsilon": 1.0, "mean": 0.5, "ci95_low": float("nan"), "ci95_high": float("nan")}
    assert description(one_seed, None, None) == "50.00 % (no interval: one seed) · not compared"
    assert description({"label": "A", "epsilon": 1.0, "mean": float("nan")}, None, None) == "no successful run"


def test_a_runs_entities_go_in_as_few_batches_as_mlflows_limits_allow():
    """Params, tags and metrics share each log_batch call (a transaction of the store), within MLflow's
    limits: at most 100 params, 100 tags and 1,000 entities a call; each entity logged once, in order."""
    from ldpbench.results.tracking import BATCH_LIMIT, _log_batched

    calls = []

    class Recorder:
        def log_batch(self, run_id, metrics=(), params=(), tags=()):
            calls.append((list(metrics), list(params), list(tags)))

    metrics, params, tags = list(range(2000)), [f"p{i}" for i in range(250)], [f"t{i}" for i in range(130)]
    _log_batched(Recorder(), "run", metrics, params, tags)
    assert all(len(p) <= 100 and len(t) <= 100 and len(m) + len(p) + len(t) <= 1000 for m, p, t in calls)
    assert [sum((call[kind] for call in calls), []) for kind in range(3)] == [metrics, params, tags]
    assert len(calls) == 3  # 2,380 entities: at least 3 calls of 1,000 (MLflow's limit), here of 900
    calls.clear()
    _log_batched(Recorder(), "run", range(100), ["p"], ["t"])
    assert calls == [(list(range(100)), ["p"], ["t"])]
    # The tag that marks a run complete comes with the last of its entities: in the last call where it
    # has room, else in a call after it.
    calls.clear()
    _log_batched(Recorder(), "run", metrics, params, tags, last_tags=["complete"])
    assert len(calls) == 3 and calls[-1][2][-1] == "complete"
    assert [sum((call[kind] for call in calls), []) for kind in range(3)] == [metrics, params, [*tags, "complete"]]
    calls.clear()
    full = list(range(BATCH_LIMIT))
    _log_batched(Recorder(), "run", full, last_tags=["complete"])
    assert calls == [(full, [], []), ([], [], ["complete"])]


def test_a_run_interrupted_before_its_last_call_is_logged_again_whole(tmp_path, monkeypatch):
    """A run is marked complete by a tag in the last call that logs it: interrupted before, the next
    `track` finds it incomplete, soft-deletes it and logs it anew."""
    from ldpbench.results import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logged_batches, log_batched = [], tracking._log_batched

    def interrupted_at_the_third(client, run_id, *args, **kwargs):
        logged_batches.append(run_id)
        if len(logged_batches) == 3:
            raise KeyboardInterrupt
        log_batched(client, run_id, *args, **kwargs)

    monkeypatch.setattr(tracking, "_log_batched", interrupted_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        track_tables(tmp_path, uri, (1.0,))
    monkeypatch.setattr(tracking, "_log_batched", log_batched)
    track_tables(tmp_path, uri, (1.0,))
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ldpbench/c").experiment_id
    deleted = client.search_runs([experiment], run_view_type=ViewType.DELETED_ONLY)
    active = client.search_runs([experiment], run_view_type=ViewType.ACTIVE_ONLY)
    assert [run.info.run_id for run in deleted] == [logged_batches[2]]
    assert tracking.COMPLETE_TAG not in deleted[0].data.tags
    assert all(run.data.tags.get(tracking.COMPLETE_TAG) == tracking.TRACKING_LAYOUT for run in active)
    assert logged_batches[2] not in {run.info.run_id for run in active}


def _store_contents(path: Path) -> tuple[list, dict]:
    """(schema, rows of every table) of a SQLite store, the Default experiment's times left out. Each
    statement of the schema is read as the set of its lines: two builds by MLflow's migrations list a
    table's constraints in different orders."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        schema = sorted(((kind, name, sorted((sql or "").split(", \n")))
                         for kind, name, sql in db.execute("SELECT type, name, sql FROM sqlite_master")), key=repr)
        tables = [name for kind, name, _ in schema if kind == "table"]
        rows = {name: sorted(db.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr) for name in tables}
        columns = [column[1] for column in db.execute("PRAGMA table_info(experiments)")]
    times = [columns.index("creation_time"), columns.index("last_update_time")]
    rows["experiments"] = [tuple(value for index, value in enumerate(row) if index not in times)
                           for row in rows["experiments"]]
    return schema, rows


def test_a_new_store_is_the_installations_empty_store_as_mlflows_migrations_would_build_it(tmp_path, monkeypatch):
    """MLflow's migrations build each installation's empty store once; a new store is a copy of it, equal to
    one the migrations build where it is (in a directory with a space in its name), its Default experiment
    created now. A template that is not as expected is not used."""
    from ldpbench.results import tracking

    copied = tmp_path / "a store" / "mlflow.db"
    copied.parent.mkdir()
    tracking._build_store(copied, copied.parent.as_uri())
    built = _store_contents(copied)
    copied.unlink()
    template, _ = tracking.store_template()
    assert template is not None and template.exists()
    migrations = []
    real_build = tracking._build_store
    monkeypatch.setattr(tracking, "_build_store", lambda *args: migrations.append(args) or real_build(*args))
    before = time.time() * 1000
    tracking._create_sqlite_atomically(copied)
    assert migrations == []
    assert _store_contents(copied) == built
    with contextlib.closing(sqlite3.connect(copied)) as db:
        created = db.execute("SELECT creation_time FROM experiments WHERE experiment_id = 0").fetchone()[0]
    assert created >= before - 1
    # MLflow reads it as its own, its Default experiment's artifacts beside it.
    from mlflow.tracking import MlflowClient

    default = MlflowClient(tracking_uri=f"sqlite:///{copied}").get_experiment("0")
    assert default.artifact_location == f"{copied.parent.as_uri()}/0"
    # A template whose Default experiment is not the one it was built with: the migrations build the store.
    odd = tmp_path / "odd.db"
    shutil.copyfile(template, odd)
    with contextlib.closing(sqlite3.connect(odd)) as db, db:
        db.execute("UPDATE experiments SET artifact_location = 'elsewhere' WHERE experiment_id = 0")
    monkeypatch.setattr(tracking, "store_template", lambda: (odd, "unused"))
    copied.unlink()
    tracking._create_sqlite_atomically(copied)
    assert len(migrations) == 1 and _store_contents(copied) == built


def _synchronous(engine) -> int:
    with engine.connect() as connection:
        return connection.exec_driver_sql("PRAGMA synchronous").scalar()


def test_track_commits_to_a_sqlite_store_without_waiting_for_the_disk_and_syncs_it_before_its_marker(
        tmp_path, monkeypatch):
    """A thousand commits of the default campaign, each waiting for the disk, took seconds: inside `track`
    every statement on the store runs unsynced (PRAGMA synchronous=0), then one fsync of the store comes
    before the marker that says it is logged."""
    import sqlalchemy
    from sqlalchemy import event

    from ldpbench.results import tracking

    store = tmp_path / "mlflow.db"
    settings, order = set(), []

    def seen(connection, cursor, statement, parameters, context, executemany):
        raw = connection.connection.dbapi_connection
        if isinstance(raw, sqlite3.Connection) and not statement.startswith("PRAGMA"):
            settings.add(raw.execute("PRAGMA synchronous").fetchone()[0])

    synced = os.fsync
    monkeypatch.setattr(tracking.os, "fsync", lambda fd: order.append(os.readlink(f"/proc/self/fd/{fd}"))
                        or synced(fd))
    written = tracking.write_json
    monkeypatch.setattr(tracking, "write_json", lambda path, value: order.append(str(path)) or written(path, value))
    event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", seen)
    try:
        track_tables(tmp_path, f"sqlite:///{store}", (1.0,))
    finally:
        event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", seen)
    assert settings == {0}
    assert order == [str(store), str(tmp_path), str(tmp_path / "mlflow.json")]
    assert len(logged(f"sqlite:///{store}", "run")) == len(SEEDS)


def test_only_the_store_being_tracked_commits_unsynced_and_only_while_it_is(tmp_path):
    import sqlalchemy

    from ldpbench.results.tracking import unsynced_commits

    tracked, other = (sqlalchemy.create_engine(f"sqlite:///{tmp_path / name}") for name in ("a.db", "b.db"))
    default = _synchronous(other)
    with unsynced_commits(f"sqlite:///{tmp_path / 'a.db'}"):
        assert (_synchronous(tracked), _synchronous(other)) == (0, default)
    assert (_synchronous(tracked), _synchronous(other)) == (default, default)  # the same pooled connection
    assert default != 0


@pytest.mark.parametrize("store", ["not a database", "locked"])
def test_a_connection_whose_pragma_cannot_be_set_is_left_as_it_is(tmp_path, store):
    """Taken from the pool while another process locks the store, or opened on a file that is no database,
    a connection keeps its setting: raised there, the error failed MLflow's engine creation, which then
    retried for minutes before `track` said what was wrong."""
    import types

    from ldpbench.results import tracking

    path = tmp_path / "mlflow.db"
    holder = None
    if store == "locked":
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN EXCLUSIVE")
    else:
        path.write_text("not a database\n" * 100)
    connection = sqlite3.connect(path, timeout=0.1)
    record = types.SimpleNamespace(info={})
    tracking._note_store_file(connection, record)
    with tracking.unsynced_commits(f"sqlite:///{path}"):
        tracking._set_synchronous(connection, record, None)
    assert not record.info.get("ldpbench.unsynced", False)
    connection.close()
    if holder is not None:
        holder.execute("ROLLBACK")
        holder.close()
