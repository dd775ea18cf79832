"""MLflow view of a campaign: one parent run per campaign, one child run per ldpbench run.

Everything logged comes from the Parquet tables. Each MLflow run carries a stable `run_key` tag
(the campaign name for the parent, the run_id for a child): re-tracking finds the existing run
instead of creating another, so it neither duplicates runs nor changes their numbers. A child left
without its completion tag (an interrupted tracking step) is deleted and logged again.

MLflow matches the runs table. CHOICE: a child whose run left the table (an ε or seed dropped from
the campaign) is soft-deleted (`MlflowClient.delete_run`): hidden from the UI and from searches, yet
kept in the store, so `mlflow runs restore` or a campaign that brings the run back restores it
(same MLflow run id, nothing logged twice). `mlflow gc` purges soft-deleted runs for good.

Every store call names the store in its error (TrackingStoreError, one line). A locked store
("database is locked": another writer holds SQLite's lock for longer than MLflow's 20 s busy
timeout) is retried with pauses of 1, 2, 4, … s while within 60 s of the first attempt (LockRetry),
then fails naming the store.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from ldpbench.atomic import write_json
from ldpbench.errors import LdpbenchError, TrackingStoreError
from ldpbench.layout import MANIFEST, REPORT_DIR, TABLES, TABLES_DIR, table_file

log = logging.getLogger(__name__)
Result = TypeVar("Result")

PARENT_KEY_PREFIX = "campaign:"
CURVE_METRICS = ("test_accuracy", "test_auc", "test_loss", "train_loss")  # those the curves have
FINAL_METRICS = (
    "test_accuracy", "test_auc", "test_loss", "train_loss", "rounds", "train_seconds", "wall_seconds",
    "epsilon_per_report", "epsilon_claimed_per_report", "epsilon_worst_case_per_report",
    "bits_per_report", "epsilon_claimed_client_max", "epsilon_worst_case_client_max",
    "uplink_bits_total",
)
COMPLETE_TAG = "ldpbench.complete"
# MLflow 3's UI shows an experiment as GenAI or as model training by this experiment tag (its own
# enum, found in the UI's code: genai_development, custom_model_development, ...).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
BATCH_LIMIT = 900  # MLflow accepts at most 1000 metrics per log_batch call
LOCKED_MESSAGES = ("database is locked", "database table is locked")


@dataclass(frozen=True)
class LockRetry:
    """How a locked store is retried: pauses of `first_pause` s, doubling; a new attempt starts
    only within `total_seconds` of the first. An attempt itself waits for the lock up to SQLite's
    busy timeout (5 s when opening the store, 20 s per MLflow session), so a store locked for good
    fails after at most `total_seconds` plus one busy timeout."""

    first_pause: float = 1.0
    total_seconds: float = 60.0


def _store_message(error: BaseException) -> str | None:
    """The database's own message when `error` comes from the tracking store, else None.

    MLflow wraps SQLAlchemy errors in MlflowException, whose message starts with SQLAlchemy's
    multi-line text; the DB-API error at the bottom of the chain says what went wrong in one line.
    """
    import sqlite3

    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    if not isinstance(error, (MlflowException, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, OSError)):
        return None
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.orig is not None:
            return str(seen.orig).splitlines()[0]
        if isinstance(seen, sqlite3.Error):
            return str(seen).splitlines()[0]
        seen = seen.__cause__ or seen.__context__
    message = error.message if isinstance(error, MlflowException) else str(error)
    return (message.splitlines() or [type(error).__name__])[0]


def call_store(uri: str, operation: Callable[..., Result], *args: Any, retry: LockRetry = LockRetry(),
               **kwargs: Any) -> Result:
    """Run one store operation; retry it while the store is locked; raise TrackingStoreError naming
    the store when it fails (or stays locked past `retry.total_seconds`)."""
    started = time.monotonic()
    pause = retry.first_pause
    attempts = 0
    while True:
        attempts += 1
        try:
            return operation(*args, **kwargs)
        except Exception as error:
            message = _store_message(error)
            if message is None:
                raise
            waited = time.monotonic() - started
            locked = any(text in message for text in LOCKED_MESSAGES)
            if not locked or waited + pause > retry.total_seconds:
                detail = f" (still locked after {attempts} attempts over {waited:.0f} s)" if locked else ""
                raise TrackingStoreError(f"MLflow tracking store {uri}: {message}{detail}") from error
            log.warning("MLflow tracking store %s is locked; retrying in %g s", uri, pause)
            time.sleep(pause)
            pause *= 2


class StoreClient:
    """An MlflowClient whose every call goes through `call_store` (named errors, lock retries)."""

    def __init__(self, uri: str, retry: LockRetry = LockRetry()):
        from mlflow.tracking import MlflowClient

        self.uri, self.retry = uri, retry
        # The constructor opens the store (and migrates a new one): its failures are store failures too.
        self._client = call_store(uri, MlflowClient, tracking_uri=uri, retry=retry)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        return lambda *args, **kwargs: call_store(self.uri, method, *args, retry=self.retry, **kwargs)


def resolve_uri(uri: str, base: str | Path = ".") -> str:
    """Make a relative sqlite path absolute (relative to `base`) and create its directory."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str((Path(base) / uri[len(prefix):]).resolve())
    if uri.startswith(prefix):
        try:
            Path(uri[len(prefix):]).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TrackingStoreError(f"MLflow tracking store {uri}: cannot create its directory "
                                     f"({error})") from None
    return uri


def _client(uri: str, retry: LockRetry = LockRetry()) -> StoreClient:
    os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow logs a full traceback for every SQLite error; TrackingStoreError says it in one line.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    return StoreClient(uri, retry)


def _experiment(client, name: str, artifact_dir: Path) -> str:
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        if existing.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:
            client.set_experiment_tag(existing.experiment_id, *EXPERIMENT_KIND)
        return existing.experiment_id
    # The artifact location is explicit: MLflow's default is relative to the creating process.
    return client.create_experiment(name, artifact_location=artifact_dir.resolve().as_uri(),
                                    tags=dict([EXPERIMENT_KIND]))


def _param_text(value: Any) -> str:
    """A parameter as people type it in a filter: ε 2 is "2" (not "2.0"), ∞ is "inf"."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def system_tags() -> dict[str, str]:
    """MLflow's own tags of who logged a run, from what (ldpbench at its git commit), and the versions."""
    import getpass
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    from ldpbench import __version__

    tags = {"mlflow.source.name": "ldpbench", "mlflow.source.type": "LOCAL", "ldpbench.version": __version__}
    try:
        tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        pass
    try:
        tags["torch.version"] = version("torch")
    except PackageNotFoundError:
        pass
    source = os.environ.get("LDPBENCH_SOURCE") or str(Path(__file__).resolve().parents[2])
    try:
        commit = subprocess.run(["git", "-C", source, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    if len(commit) == 40:
        tags["mlflow.source.git.commit"] = commit
    return tags


def _runs_by_key(client, experiment_id: str, filter_string: str) -> dict[str, list[Any]]:
    """Runs matching `filter_string`, soft-deleted ones included, grouped by their run_key tag."""
    from mlflow.entities import ViewType

    found: dict[str, list[Any]] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string,
                                  run_view_type=ViewType.ALL, max_results=1000, page_token=token)
        for run in page:
            key = run.data.tags.get("run_key")
            if key is not None:
                found.setdefault(key, []).append(run)
        token = page.token
        if not token:
            return found


def _is_active(run) -> bool:
    return run.info.lifecycle_stage == "active"


def _is_complete(run) -> bool:
    return run.data.tags.get(COMPLETE_TAG) == "1"


def _preferred(runs: list[Any]) -> Any:
    """The run to keep among those sharing a run_key: complete before incomplete, active before deleted."""
    return max(runs, key=lambda run: (_is_complete(run), _is_active(run)))


def _sync_children(client, experiment_id: str, parent_id: str, wanted: set[str]) -> tuple[dict[str, Any], int]:
    """The parent's children by run_key, one per key, restricted to `wanted`; soft-deletes the others.

    Deleted: active children whose run left the runs table, and active duplicates of a key (two
    tracking steps racing). Returns the kept children and how many runs were deleted.
    """
    found = _runs_by_key(client, experiment_id, f"tags.`mlflow.parentRunId` = '{parent_id}'")
    children: dict[str, Any] = {}
    removed = 0
    for key, candidates in found.items():
        kept = _preferred(candidates)
        if key in wanted:
            children[key] = kept
        for run in candidates:
            if _is_active(run) and (run is not kept or key not in wanted):
                client.delete_run(run.info.run_id)
                removed += 1
    return children, removed


def _log_batched(client, run_id: str, metrics=(), params=(), tags=()) -> None:
    metrics, params, tags = list(metrics), list(params), list(tags)
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start:start + 100])
    for start in range(0, len(tags), 100):
        client.log_batch(run_id, tags=tags[start:start + 100])
    for start in range(0, len(metrics), BATCH_LIMIT):
        client.log_batch(run_id, metrics=metrics[start:start + BATCH_LIMIT])


def _child_payload(row: pd.Series, curve: pd.DataFrame, timestamp: int, system: dict[str, str]):
    from mlflow.entities import Metric, Param, RunTag

    plan = json.loads(row["plan"])
    params = {
        "dataset": row["dataset"], "model": row["model"], "mechanism": row["mechanism"],
        "label": row["label"], "epsilon": row["epsilon"], "seed": row["seed"], "fold": row["fold"],
        "folds": plan["folds"], "test_fraction": plan["test_fraction"],
        **{f"network.{k}": v for k, v in plan["network_params"].items()},
        **{f"mechanism.{k}": v for k, v in plan["mechanism_params"].items()},
        **{f"training.{k}": v for k, v in plan["training"].items()},
    }
    curve_metrics = [name for name in CURVE_METRICS if name in curve.columns]
    metrics = [
        Metric(name, float(value), timestamp, int(step))
        for step, point in zip(curve["round"], curve.itertuples(index=False))
        for name, value in ((m, getattr(point, m)) for m in curve_metrics)
        if math.isfinite(value)
    ]
    metrics += [
        Metric(f"final_{name}", float(row[name]), timestamp, 0)
        for name in FINAL_METRICS if name in row and math.isfinite(float(row[name]))
    ]
    if math.isfinite(float(row["epsilon"])):  # ε as a number too, for the charts' axes
        metrics.append(Metric("epsilon", float(row["epsilon"]), timestamp, 0))
    tags = {**system,
        "run_key": row["run_id"], "ldpbench.run_id": row["run_id"], "mechanism": row["mechanism"],
        "label": row["label"], "dataset": row["dataset"], "epsilon": _param_text(row["epsilon"]),
        "status": row["status"],
        # Tags keep ∞ visible: MLflow metrics cannot store it.
        "epsilon_claimed_per_report": str(row["epsilon_claimed_per_report"]),
        "epsilon_worst_case_per_report": str(row["epsilon_worst_case_per_report"]),
    }
    return ([Param(k, _param_text(v)) for k, v in params.items()], metrics,
            [RunTag(k, str(v)) for k, v in tags.items()])


def track(tables_dir: str | Path, report_dir: str | Path, uri: str, experiment_name: str,
          artifact_dir: str | Path, marker: str | Path, retry: LockRetry = LockRetry()) -> dict[str, Any]:
    """Log the campaign to MLflow idempotently and write `marker` (run_key → MLflow run id).

    Afterwards the parent's active children are exactly the runs table's runs: children of runs
    that left the table are soft-deleted (`removed`), complete children of runs that came back are
    restored (`restored`), not logged again.
    """
    tables_dir = Path(tables_dir)
    runs = pd.read_parquet(table_file(tables_dir, "runs"))
    curves = pd.read_parquet(table_file(tables_dir, "curves"))
    campaign = str(runs["campaign"].iloc[0])
    client = _client(uri, retry)
    experiment_id = _experiment(client, experiment_name, Path(artifact_dir))
    system = system_tags()

    parent_key = PARENT_KEY_PREFIX + campaign
    parents = _runs_by_key(client, experiment_id, f"tags.run_key = '{parent_key}'")
    if parent_key in parents:
        parent = _preferred(parents[parent_key])
        if not _is_active(parent):
            client.restore_run(parent.info.run_id)
        parent_id = parent.info.run_id
    else:
        parent = client.create_run(experiment_id, run_name=campaign,
                                   tags={**system, "run_key": parent_key, "campaign": campaign})
        parent_id = parent.info.run_id

    children, removed = _sync_children(client, experiment_id, parent_id, set(runs["run_id"]))
    created = skipped = replaced = restored = 0
    grouped_curves = dict(tuple(curves.groupby("run_id")))
    mapping: dict[str, str] = {parent_key: parent_id}
    for _, row in runs.iterrows():
        existing = children.get(row["run_id"])
        if existing is not None and _is_complete(existing):
            if _is_active(existing):
                skipped += 1
            else:
                client.restore_run(existing.info.run_id)
                restored += 1
            mapping[row["run_id"]] = existing.info.run_id
            continue
        if existing is not None and _is_active(existing):
            client.delete_run(existing.info.run_id)
            replaced += 1
        # MLflow shows when the run itself ran, not when it was tracked.
        started = int(pd.Timestamp(row["started_at"]).timestamp() * 1000)
        finished = int(pd.Timestamp(row["finished_at"]).timestamp() * 1000)
        child = client.create_run(
            experiment_id,
            start_time=started,
            run_name=f"{row['dataset']}/{row['model']}/{row['label']}/eps={row['epsilon']:g}/seed={row['seed']}/fold={row['fold']}",
            tags={"mlflow.parentRunId": parent_id},
        )
        params, metrics, tags = _child_payload(row, grouped_curves[row["run_id"]], finished, system)
        _log_batched(client, child.info.run_id, metrics, params, tags)
        client.set_terminated(child.info.run_id, "FINISHED" if row["status"] == "ok" else "FAILED",
                              end_time=finished)
        # Set last: a child without it was interrupted mid-logging and is logged again.
        client.set_tag(child.info.run_id, COMPLETE_TAG, "1")
        mapping[row["run_id"]] = child.info.run_id
        created += 1

    from mlflow.entities import RunTag

    client.log_batch(parent_id, tags=[RunTag("runs", str(len(runs))),
                                      RunTag("runs_ok", str(int((runs["status"] == "ok").sum()))),
                                      *(RunTag(key, value) for key, value in system.items())])
    manifest = tables_dir.parent / MANIFEST  # the campaign's run list, every plan in it
    if manifest.exists():
        client.log_artifact(parent_id, str(manifest))
    for table in TABLES:  # a campaign without tuning has no tuning tables
        if table_file(tables_dir, table).exists():
            client.log_artifact(parent_id, str(table_file(tables_dir, table)), artifact_path=TABLES_DIR)
    client.log_artifacts(parent_id, str(report_dir), artifact_path=REPORT_DIR)
    client.set_terminated(parent_id, "FINISHED")

    result = {"experiment_id": experiment_id, "parent_run_id": parent_id, "created": created,
              "skipped": skipped, "replaced": replaced, "restored": restored, "removed": removed,
              "runs": mapping}
    write_json(marker, result)
    return result


def init_store(uri: str, experiment_name: str, artifact_dir: str | Path, marker: str | Path,
               wait_seconds: float = 60.0, retry: LockRetry = LockRetry()) -> dict[str, Any]:
    """Create the tracking store (SQLite schema or a server's experiment) once, before any writer.

    Concurrent first writers to a missing SQLite file race on schema creation and fail; one local
    step that creates it first makes every later writer (tracking, live progress from cluster jobs)
    safe. For an http(s) URI it waits until the server answers /health. Idempotent; writes
    `marker` (URI and experiment id).
    """
    if uri.startswith(("http://", "https://")):
        _wait_for_server(uri, wait_seconds)
    if uri.startswith("sqlite:///"):
        call_store(uri, _create_sqlite_atomically, Path(uri[len("sqlite:///"):]), retry=retry)
    client = _client(uri, retry)
    experiment_id = _experiment(client, experiment_name, Path(artifact_dir))
    result = {"uri": uri, "experiment": experiment_name, "experiment_id": experiment_id}
    write_json(marker, result)
    return result


def _create_sqlite_atomically(path: Path) -> None:
    """Build the SQLite schema in a temporary file and link it into place only when complete.

    MLflow's schema creation runs dozens of migrations; a process killed midway would leave a
    half-migrated store that every later start fails on. Built aside, the store is either absent
    or complete. os.link never replaces a store another process created in the meantime.
    """
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        store = SqlAlchemyStore(f"sqlite:///{tmp}", tmp.parent.as_uri())
        store.engine.dispose()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _wait_for_server(uri: str, wait_seconds: float) -> None:
    deadline = time.monotonic() + wait_seconds
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as error:
            last_error = error
        time.sleep(1)
    raise LdpbenchError(f"MLflow tracking server at '{uri}' did not answer /health within "
                        f"{wait_seconds:g} s ({last_error}); start it with `ldpbench tracking-server`")


def server_command(store: str | Path, host: str, port: int, artifacts: str | Path,
                   workers: int = 1, allowed_hosts: str | None = None) -> list[str]:
    """The `mlflow server` command line for a SQLite store (absolute paths; no shell involved)."""
    store = Path(store).resolve()
    return [sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{store}",
            "--artifacts-destination", Path(artifacts).resolve().as_uri(),
            "--host", host, "--port", str(int(port)), "--workers", str(int(workers)),
            *(["--allowed-hosts", allowed_hosts] if allowed_hosts else [])]
