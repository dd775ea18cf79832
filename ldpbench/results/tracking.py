"""MLflow view of a campaign: a campaign run, one run per configuration, one child run per ldpbench
run under its configuration, and a tuned configuration's sweep under it (the levels: tracking_entries).

Everything logged comes from the Parquet tables (and a tuned campaign's trial run files, for when
each trial ran and its validation curve). Each MLflow run carries a stable `run_key` tag
and a fingerprint of what it shows: re-tracking finds the existing run instead of creating
another, so it neither duplicates runs nor changes their numbers. A run left without its
completion tag (an interrupted tracking step), or whose entry now shows something else (a
configuration that gained a seed), is deleted and logged again; its unchanged children move under
the new run.

MLflow matches the tables. CHOICE: a run whose entry left them (an ε or seed dropped from
the campaign) is soft-deleted (`MlflowClient.delete_run`): hidden from the UI and from searches, yet
kept in the store, so `mlflow runs restore` or a campaign that brings the run back restores it
(same MLflow run id, nothing logged twice). `mlflow gc` purges soft-deleted runs for good.

Two `track` steps of one experiment never interleave (two Snakemake invocations of a campaign, or
campaigns sharing a store): each searches for its run keys and creates what it did not find, so
two at once would both create every run. They take turns on an exclusive lock (track_lock_file).

Every store call names the store in its error (TrackingStoreError, one line). A locked store
("database is locked": another writer holds SQLite's lock for longer than MLflow's 20 s busy
timeout) is retried with pauses of 1, 2, 4, … s while within 60 s of the first attempt (LockRetry),
then fails naming the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from ldpbench.atomic import write_json
from ldpbench.errors import LdpbenchError, TrackingStoreError
from ldpbench.layout import (
    ARTIFACTS_DIR,
    AUDIT_TABLE,
    MANIFEST,
    REPORT_DIR,
    RUNS_DIR,
    TABLES,
    TABLES_DIR,
    TRIALS_MANIFEST,
    table_file,
)
from ldpbench.layout import TRIAL as TRIAL_PHASE
from ldpbench.results.mlflow_common import (
    BATCH_LIMIT,
    CAMPAIGN,
    CAMPAIGN_TAG,
    CONFIGURATION,
    CURVE,
    FINGERPRINT_TAG,
    LEVEL_TAG,
    LIVE,
    PARAMS_TAGS_LIMIT,
    QUIET_ENVIRONMENT,
    RUN,
    TRACK_HTTP_ENVIRONMENT,
    TRIAL,
    TUNING,
    quiet_mlflow,
)
from ldpbench.results.tables import load_runs
from ldpbench.results.tracking_entries import (
    SHOWN_INTERVAL,
    Entry,
    campaign_entry,
    configuration_entries,
    curve_entries,
    curve_metric,
    datasets_of,
    percent_metric,
    run_entries,
    tuning_entries,
)

log = logging.getLogger(__name__)
Result = TypeVar("Result")

PARENT_KEY_PREFIX = "campaign:"
COMPLETE_TAG = "ldpbench.complete"
# COMPLETE_TAG's value: the layout of what is logged (2: configurations at the top level, their runs under
# them; the curve, tuning and trial levels came later without changing where the others are).
# A run logged in another layout counts as incomplete and is logged again.
TRACKING_LAYOUT = "2"
# MLflow 3 records an experiment's kind in this tag (its own enum, found in the UI's code:
# genai_development, custom_model_development, ...). Its UI does not land in model training because of
# it: the GenAI / model-training switch is the UI's, kept in the browser and in the page address's
# `workflowType` (MODEL_TRAINING_MODE), which MLflow's own switch writes: the view's address carries it.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
MODEL_TRAINING_MODE = "workflowType=machine_learning"
NOTE_TAG = "mlflow.note.content"  # the experiment's description in MLflow's UI
EXPERIMENT_NOTE = """An ldpbench campaign. Top-level runs: one per **configuration** (dataset, model, mechanism, ε)
with the mean and 95 % interval of accuracy and AUC over its seeds (folds averaged), claimed, worst-case
and audited ε, bits and the verdict; expand one to see its **runs** (one per seed and fold, with
their curves). The **campaign** run holds the campaign file, manifest, tables and report.
[Configurations only, with their numbers as columns]({view}); [accuracy against ε, one chart per
dataset and model]({curves}). The Parquet tables are the source of truth; this is a view of them."""
# MLflow's UI opens a shared view (search, columns) from the experiment tag VIEW_TAG_PREFIX + key
# when the page's address carries `?viewStateShareKey=<key>`: ldpbench writes one, for configurations.
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
CONFIGURATIONS_VIEW = "ldpbench-configurations"
# The view's columns. MLflow puts the attributes first (name, created, description, duration), then
# the metrics by name, then tags: the description reads the configuration at a glance (mean, interval,
# verdict), and the metrics in percent sort first among the metrics.
VIEW_METRICS = (*(percent_metric("test_accuracy", part) for part in SHOWN_INTERVAL),
                percent_metric("test_auc", "mean"), "epsilon", "epsilon_worst_case_client_total",
                "epsilon_audited_lower_bound", "bits_per_report", "runs_ok", "rank", "verdict_best")
DESCRIPTION_COLUMN = "attributes.`Description`"
# The curves view: the curve runs, as charts, one per dataset and model: each mechanism's mean accuracy
# and its interval bounds against ε, one colour each. (MLflow 3.17 draws a metric x axis linear: the
# chart's log setting did not change it in Chromium, so none is set.)
CURVES_VIEW = "ldpbench-curves"
CURVES_SECTION = "Accuracy against ε, per dataset and model (lines: mean and 95 % interval bounds)"
VIEW_SECTION = "Accuracy against privacy and bits"
VIEW_SCATTERS = (("epsilon", percent_metric("test_accuracy", "mean")), ("epsilon", percent_metric("test_auc", "mean")),
                 ("bits_per_report", percent_metric("test_accuracy", "mean")),
                 ("epsilon", "epsilon_audited_lower_bound"))
LOCKED_MESSAGES = ("database is locked", "database table is locked")
HEALTH_TIMEOUT_SECONDS = 5.0  # one /health request
# `track` waits this long for a tracking server (one that is restarting); `tracking-init`, which
# may run while the server starts, waits 60 s.
TRACK_SERVER_WAIT_SECONDS = 10.0
STARTING_STATUSES = (502, 503, 504)  # a proxy's answers while the server behind it is not up (yet)


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


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite URI (also of SQLite's `file:...?mode=ro` form), else None."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    path = uri[len(prefix):]
    if path.startswith("file:"):
        path = urllib.parse.urlsplit(path).path
    return Path(path) if path and path != ":memory:" else None


# The SQLite stores whose connections in this process commit without waiting for the disk (unsynced_commits).
_UNSYNCED_STORES: set[str] = set()
# Kept in each SQLAlchemy connection record: the database file it opened, and its setting as SQLite gave it.
_STORE_FILE, _SYNCHRONOUS, _UNSYNCED = "ldpbench.store_file", "ldpbench.synchronous", "ldpbench.unsynced"


@contextlib.contextmanager
def unsynced_commits(uri: str) -> Iterator[None]:
    """Inside the block, this process's connections to the SQLite store of `uri` commit without waiting
    for the disk (PRAGMA synchronous=OFF); on the way out one fsync makes all they wrote durable.

    `track` logs a campaign in several commits an entry (MLflow's client commits each call, some calls
    more than once): hundreds for the default campaign, each waiting for writes to reach the disk,
    seconds in all on a busy or network disk. Without those waits a crash of the process still loses
    nothing committed: only the machine's crash or power cut in the middle of the block can damage the
    store, and the store is a view of the campaign's tables, which `track` logs again. Other stores and
    servers are left alone.
    """
    path = _sqlite_file(uri)
    if path is None:
        yield
        return
    import sqlalchemy
    from sqlalchemy import event

    if not event.contains(sqlalchemy.engine.Engine, "checkout", _set_synchronous):
        event.listen(sqlalchemy.engine.Engine, "connect", _note_store_file)
        event.listen(sqlalchemy.engine.Engine, "checkout", _set_synchronous)
    key = os.path.realpath(path)
    _UNSYNCED_STORES.add(key)
    try:
        yield
    finally:
        _UNSYNCED_STORES.discard(key)
        for synced in (path, path.parent):  # the database, and its directory (the journal's removal)
            with contextlib.suppress(OSError):
                descriptor = os.open(synced, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)


def _note_store_file(connection, record) -> None:
    if isinstance(connection, sqlite3.Connection):  # the file is known without reading the database
        files = [row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"]
        record.info[_STORE_FILE] = os.path.realpath(files[0]) if files and files[0] else None


def _set_synchronous(connection, record, proxy) -> None:
    """As a connection is taken from the pool: unsynced while its store is in _UNSYNCED_STORES, else as
    SQLite set it. Reading or setting the pragma reads the database: a store locked by another process,
    or a file that is no database, leaves it as it is (this checkout's statements then wait for the
    lock, or fail, as any would; raised here, MLflow's engine creation retried for minutes)."""
    if _STORE_FILE not in record.info:
        return
    unsynced = record.info[_STORE_FILE] in _UNSYNCED_STORES
    if unsynced == record.info.get(_UNSYNCED, False):
        return
    try:
        if unsynced:
            record.info[_SYNCHRONOUS] = connection.execute("PRAGMA synchronous").fetchone()[0]
            connection.execute("PRAGMA synchronous=0")
        else:
            connection.execute(f"PRAGMA synchronous={int(record.info[_SYNCHRONOUS])}")
    except sqlite3.DatabaseError:  # locked, or not a database: its statements fail as they would have
        return
    record.info[_UNSYNCED] = unsynced


def track_lock_file(uri: str, experiment_name: str, marker: str | Path) -> Path:
    """The lock file that `track` and `tracking-init` hold while they work on one experiment.

    A SQLite store: beside the database, so every campaign and results directory writing to it
    takes turns. A tracking server: ldpbench cannot take a lock on the server's machine; the best
    available is beside the step's marker (results/<campaign>/tracking), which serialises the
    steps of one campaign directory (two Snakemake invocations of it) but not those of another
    results directory or machine tracking the same campaign name into the same server.
    """
    digest = hashlib.sha256(experiment_name.encode()).hexdigest()[:16]
    store = _sqlite_file(uri)
    if store is not None and store.parent.is_dir() and os.access(store.parent, os.W_OK):
        return store.parent / f".{store.name}.{digest}.lock"
    return Path(marker).parent / f".tracking.{digest}.lock"


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` for the block, waiting for whoever holds it.

    The file is created if missing and never removed: a process that removed it would let a third
    lock a new file while a second still holds the old one. The kernel releases the lock when
    its holder exits, killed or not, so a crashed step leaves nothing to clean up.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")
    except OSError as error:
        raise LdpbenchError(f"cannot create the lock file {path} ({what}): {error}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another %s to finish (lock file %s)", what, path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def _client(uri: str, retry: LockRetry = LockRetry()) -> StoreClient:
    quiet_mlflow(TRACK_HTTP_ENVIRONMENT if _is_server(uri) else None)
    # MLflow logs a full traceback for every SQLite error; TrackingStoreError says it in one line.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    return StoreClient(uri, retry)


def configurations_view(experiment_id: str) -> str:
    """The address, below the UI's root, of the experiment's configurations view."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={CONFIGURATIONS_VIEW}&{MODEL_TRAINING_MODE}"


def curves_view(experiment_id: str) -> str:
    """The address, below the UI's root, of the experiment's curves view (its charts)."""
    return (f"#/experiments/{experiment_id}/runs?viewStateShareKey={CURVES_VIEW}&{MODEL_TRAINING_MODE}"
            "&compareRunsMode=CHART")


def campaign_views(uri: str, served_at: str) -> list[tuple[str, str]]:
    """(what, address) of the configurations view, and the curves view, of every ldpbench experiment in
    the store at `uri` (those `track` gave the views), as the UI at `served_at` (http://host:port)
    shows them."""
    experiments = _client(uri).search_experiments(filter_string=f"tags.`{VIEW_TAG_PREFIX + CONFIGURATIONS_VIEW}` != ''")
    base = served_at.rstrip("/")
    views = []
    for experiment in sorted(experiments, key=lambda experiment: experiment.name):
        views.append((experiment.name, f"{base}/{configurations_view(experiment.experiment_id)}"))
        if VIEW_TAG_PREFIX + CURVES_VIEW in experiment.tags:
            views.append((f"{experiment.name}, accuracy against ε", f"{base}/{curves_view(experiment.experiment_id)}"))
    return views


def _view_state() -> str:
    """The configurations view, as MLflow's UI reads a shared view from an experiment tag: the
    search (configurations only, best accuracy first), the columns to show, and a first chart
    section of scatter plots (accuracy and AUC against ε and bits, audited against claimed ε)."""
    metric = "metrics.`{}`".format
    section = "ldpbench-privacy-utility"
    charts = [{"uuid": f"ldpbench-{y}-{x}", "type": "SCATTER", "xaxis": {"key": x, "type": "METRIC"},
               "yaxis": {"key": y, "type": "METRIC"}, "runsCountToCompare": 100, "metricSectionId": section,
               "isGenerated": False, "deleted": False} for x, y in VIEW_SCATTERS]
    return json.dumps({
        "searchFilter": f"tags.`{LEVEL_TAG}` = '{CONFIGURATION}'",
        "orderByKey": metric(percent_metric("test_accuracy", "mean")), "orderByAsc": False,
        "selectedColumns": [DESCRIPTION_COLUMN, *map(metric, VIEW_METRICS), "tags.`verdict`"],
        "runsHiddenMode": "SHOW_ALL",  # the charts show every configuration, not the first 10
        "compareRunSections": [{"uuid": section, "name": VIEW_SECTION, "display": True, "isReordered": False}],
        "compareRunCharts": charts,
        "isAccordionReordered": True,  # keeps this section above the generated ones
    })


def _curves_view_state(panels: list[tuple[str, str]], metric: str) -> str:
    """The curves view: the curve runs, and a line chart per panel (dataset, model) of `metric`'s mean
    and interval bounds in percent against ε."""
    section = "ldpbench-curves"
    charts = [{"uuid": f"ldpbench-curve-{index}", "type": "LINE",
               "metricKey": curve_metric(dataset, model, percent_metric(metric, "mean")),
               "selectedMetricKeys": [curve_metric(dataset, model, percent_metric(metric, part))
                                      for part in SHOWN_INTERVAL],
               "xAxisKey": "metric", "selectedXAxisMetricKey": curve_metric(dataset, model, "epsilon"),
               "useGlobalXaxisKey": False, "scaleType": "linear", "lineSmoothness": 0,
               "useGlobalLineSmoothing": False, "displayPoints": True, "runsCountToCompare": 100,
               "metricSectionId": section, "isGenerated": False, "deleted": False}
              for index, (dataset, model) in enumerate(panels)]
    return json.dumps({
        "searchFilter": f"tags.`{LEVEL_TAG}` = '{CURVE}'",
        "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True,
        "runsHiddenMode": "SHOW_ALL",
        "compareRunSections": [{"uuid": section, "name": CURVES_SECTION, "display": True, "isReordered": False}],
        "compareRunCharts": charts,
        "isAccordionReordered": True,
    })


def _experiment(client, name: str, artifact_dir: Path, curves: str | None = None) -> str:
    """The experiment's id, created if new, with its kind, its views and (unless someone wrote one) its
    note; `curves` is the curves view's state (track knows the panels; tracking-init does not)."""
    existing = client.get_experiment_by_name(name)
    if existing is None:
        # The artifact location is explicit: MLflow's default is relative to the creating process.
        experiment_id = client.create_experiment(name, artifact_location=artifact_dir.resolve().as_uri())
        tags: dict[str, str] = {}
    else:
        experiment_id, tags = existing.experiment_id, existing.tags
    wanted = {EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1], VIEW_TAG_PREFIX + CONFIGURATIONS_VIEW: _view_state()}
    if curves is not None:
        wanted[VIEW_TAG_PREFIX + CURVES_VIEW] = curves
    if NOTE_TAG not in tags:  # a description someone wrote stays
        wanted[NOTE_TAG] = EXPERIMENT_NOTE.format(view=configurations_view(experiment_id),
                                                  curves=curves_view(experiment_id))
    for key, value in wanted.items():
        if tags.get(key) != value:
            client.set_experiment_tag(experiment_id, key, value)
    return experiment_id


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


def _search(client, experiment_id: str, filter_string: str):
    """Every run matching `filter_string`, soft-deleted ones included."""
    from mlflow.entities import ViewType

    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string,
                                  run_view_type=ViewType.ALL, max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def _runs_by_key(client, experiment_id: str, filter_string: str) -> dict[str, list[Any]]:
    """Runs matching `filter_string`, soft-deleted ones included, grouped by their run_key tag."""
    found: dict[str, list[Any]] = {}
    for run in _search(client, experiment_id, filter_string):
        key = run.data.tags.get("run_key")
        if key is not None:
            found.setdefault(key, []).append(run)
    return found


def _is_active(run) -> bool:
    return run.info.lifecycle_stage == "active"


def _is_complete(run) -> bool:
    return run.data.tags.get(COMPLETE_TAG) == TRACKING_LAYOUT


def _retire_legacy(client, experiment_id: str, campaign: str) -> int:
    """Soft-delete what ldpbench logged for `campaign` before the configuration level (one parent
    run, one child per run, no level tags): the campaign is logged again in today's layout."""
    retired = 0
    for parent in _search(client, experiment_id, f"tags.run_key = '{PARENT_KEY_PREFIX}{campaign}'"):
        if LEVEL_TAG in parent.data.tags:
            continue
        children = _search(client, experiment_id, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        for run in [*children, parent]:
            if _is_active(run):
                client.delete_run(run.info.run_id)
                retired += 1
    return retired


def _log_batched(client, run_id: str, metrics=(), params=(), tags=(), last_tags=()) -> None:
    """Log everything in as few calls as MLflow's limits allow (each call is a transaction of the store:
    most runs take one, where params, tags and metrics apart took three); `last_tags` go in the last
    call, once everything else is in."""
    metrics, params, tags, last_tags = list(metrics), list(params), list(tags), list(last_tags)
    batches = []
    while metrics or params or tags:
        params_now, tags_now = params[:PARAMS_TAGS_LIMIT], tags[:PARAMS_TAGS_LIMIT]
        metrics_now = metrics[:BATCH_LIMIT - len(params_now) - len(tags_now)]
        batches.append((metrics_now, params_now, tags_now))
        metrics, params, tags = metrics[len(metrics_now):], params[len(params_now):], tags[len(tags_now):]
    if batches and len(batches[-1][2]) + len(last_tags) <= PARAMS_TAGS_LIMIT \
            and sum(map(len, batches[-1])) + len(last_tags) <= BATCH_LIMIT:
        batches[-1][2].extend(last_tags)  # room in the last call
    elif last_tags:
        batches.append(([], [], last_tags))
    for metrics_now, params_now, tags_now in batches:
        client.log_batch(run_id, metrics=metrics_now, params=params_now, tags=tags_now)


def _sync_entry(client, experiment_id: str, entry: Entry, candidates: list[Any], parent_id: str | None,
                system: dict[str, str], counts: dict[str, int]) -> str:
    """The MLflow run id of `entry`: its complete run with the same fingerprint (restored if it was
    deleted, moved under `parent_id` if it hangs elsewhere), or a new run, the others soft-deleted."""
    from mlflow.entities import Metric, Param, RunTag

    same = [run for run in candidates if _is_complete(run) and run.data.tags.get(FINGERPRINT_TAG) == entry.fingerprint]
    kept = max(same, key=_is_active) if same else None  # an active one before a deleted one
    for run in candidates:  # duplicates (two tracking steps racing), interrupted or outdated runs
        if _is_active(run) and run is not kept:
            client.delete_run(run.info.run_id)
            counts["replaced"] += 1
    if kept is not None:
        if _is_active(kept):
            counts["skipped"] += 1
        else:
            client.restore_run(kept.info.run_id)
            counts["restored"] += 1
        if parent_id is not None and kept.data.tags.get("mlflow.parentRunId") != parent_id:
            client.set_tag(kept.info.run_id, "mlflow.parentRunId", parent_id)
            counts["reparented"] += 1
        return kept.info.run_id
    # The tags (its run key among them) come with the run itself, so that a run interrupted at any later
    # call is found by the next `track`, and COMPLETE_TAG comes in the last call: a run without it was
    # interrupted mid-logging, and is soft-deleted and logged again.
    tags = {**({"mlflow.parentRunId": parent_id} if parent_id else {}), **entry.all_tags(system)}
    run = client.create_run(experiment_id, start_time=entry.start_ms or entry.timestamp_ms, run_name=entry.name,
                            tags=tags)
    run_id = run.info.run_id
    if entry.datasets:
        client.log_inputs(run_id, datasets=[dataset.as_input() for dataset in entry.datasets])
    client.set_terminated(run_id, entry.status, end_time=entry.timestamp_ms)
    _log_batched(client, run_id,
                 [Metric(key, value, entry.timestamp_ms, step) for key, value, step in entry.metrics],
                 [Param(key, value) for key, value in entry.params.items()],
                 last_tags=[RunTag(COMPLETE_TAG, TRACKING_LAYOUT)])
    counts["created"] += 1
    return run_id


def _read_table(tables_dir: Path, table: str) -> pd.DataFrame | None:
    path = table_file(tables_dir, table)
    return pd.read_parquet(path) if path.exists() else None


def track(tables_dir: str | Path, report_dir: str | Path | None, uri: str, experiment_name: str,
          artifact_dir: str | Path, marker: str | Path, retry: LockRetry = LockRetry(),
          datasets: Mapping[str, str | Path] | None = None, campaign_file: str | Path | None = None
          ) -> dict[str, Any]:
    """Log the campaign to MLflow idempotently (see tracking_entries for the levels) and write
    `marker`: the counts per level and run_key → MLflow run id.

    `datasets` maps each dataset name to its prepared meta.json (logged as run inputs with their
    digests); `campaign_file` is the resolved campaign configuration, attached to the campaign run, as
    is the report in `report_dir` where one is given (the workflow attaches it afterwards, by
    attach_report, so that the report is drawn while this logs the tables).
    Afterwards the campaign's active MLflow runs are exactly its entries: runs whose entry left the
    tables are soft-deleted (`removed`), complete runs of entries that came back are restored.
    Everything from the experiment's lookup to the marker happens under the experiment's lock
    (track_lock_file): another `track` of it waits, then finds this one's runs instead of
    creating them a second time.
    """
    tables_dir = Path(tables_dir)
    runs, curves, summary = (pd.read_parquet(table_file(tables_dir, t)) for t in ("runs", "curves", "summary"))
    campaign = str(runs["campaign"].iloc[0])
    described = datasets_of(datasets or {})
    campaign_key = PARENT_KEY_PREFIX + campaign
    entries = [campaign_entry(runs, summary, described, campaign_key),
               *configuration_entries(summary, runs, described, _read_table(tables_dir, "rankings"),
                                      _read_table(tables_dir, "verdicts"), _read_table(tables_dir, AUDIT_TABLE)),
               *curve_entries(summary, runs),
               *_sweeps(tables_dir, summary),
               *run_entries(runs, curves, described)]  # parents before their children
    system = system_tags()
    if _is_server(uri):  # started before the campaign, and maybe gone since: said at once, not after retries
        _wait_for_server(uri, TRACK_SERVER_WAIT_SECONDS)
    _create_missing_sqlite_store(uri, retry)  # as tracking-init does, where `track` runs without it
    with exclusive_lock(track_lock_file(uri, experiment_name, marker), f"tracking of '{experiment_name}'"):
        with unsynced_commits(uri):  # durable before the marker says so
            client = _client(uri, retry)
            panels = sorted(set(zip(summary["dataset"].astype(str), summary["model"].astype(str))))
            curves = _curves_view_state(panels, str(summary["metric"].iloc[0]))
            experiment_id = _experiment(client, experiment_name, Path(artifact_dir), curves)
            retired = _retire_legacy(client, experiment_id, campaign)
            mapping, counts = _sync_campaign(client, experiment_id, campaign, entries, system)
            campaign_id = mapping[campaign_key]
            _attach_files(client, campaign_id, tables_dir, report_dir, campaign_file)
            result = {"experiment_id": experiment_id, "configurations_view": configurations_view(experiment_id),
                      "curves_view": curves_view(experiment_id),
                      "campaign_run_id": campaign_id, **counts[RUN],
                      "configurations": counts[CONFIGURATION], "campaign": counts[CAMPAIGN],
                      "tunings": counts[TUNING], "trials": counts[TRIAL], "curves": counts[CURVE],
                      "live_removed": counts[LIVE]["removed"], "legacy_removed": retired,
                      "runs": mapping}
        write_json(marker, result)
    return result


def _sweeps(tables_dir: Path, summary: pd.DataFrame) -> list[Entry]:
    """A tuned campaign's tuning runs and trials: the tuning tables, with when each trial ran and its
    validation curve from the trials' run files (trials.json and runs/ beside tables/)."""
    selected, tuning = _read_table(tables_dir, "selected"), _read_table(tables_dir, "tuning")
    if selected is None or tuning is None:
        return []
    trials_manifest = tables_dir.parent / TRIALS_MANIFEST
    if not trials_manifest.is_file():
        raise LdpbenchError(f"'{tables_dir}' holds tuning tables but '{trials_manifest}', the list of the "
                            "trial runs whose curves the tuning shows, is missing")
    trial_runs, trial_curves = load_runs(json.loads(trials_manifest.read_text())["runs"],
                                         tables_dir.parent / RUNS_DIR, TRIAL_PHASE)
    return tuning_entries(summary, selected, tuning, trial_runs, trial_curves)


def _sync_campaign(client, experiment_id: str, campaign: str, entries: list[Entry], system: dict[str, str]
                   ) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Find or create each entry's run (run_key → MLflow run id) and soft-delete the campaign's runs
    that are no entry; the counts per level. Only one process may do this at a time: see `track`."""
    found = _runs_by_key(client, experiment_id, f"tags.`{CAMPAIGN_TAG}` = '{campaign}'")
    counts = {level: dict.fromkeys(("created", "skipped", "replaced", "restored", "removed", "reparented"), 0)
              for level in (CAMPAIGN, CONFIGURATION, CURVE, TUNING, TRIAL, RUN, LIVE)}
    mapping: dict[str, str] = {}
    for entry in entries:
        parent_id = mapping.get(entry.parent_key) if entry.parent_key else None
        mapping[entry.key] = _sync_entry(client, experiment_id, entry, found.get(entry.key, []), parent_id,
                                         system, counts[entry.level])
    for key, candidates in found.items():  # entries that left the campaign, and the live runs
        if key in mapping:
            continue
        for run in candidates:
            if _is_active(run):
                client.delete_run(run.info.run_id)
                counts.get(run.data.tags.get(LEVEL_TAG, RUN), counts[RUN])["removed"] += 1
    return mapping, counts


def _attach_files(client, campaign_id: str, tables_dir: Path, report_dir: str | Path | None,
                  campaign_file: str | Path | None) -> None:
    """The campaign's files as artifacts of its run: manifest, campaign file, tables, report (if given)."""
    manifest = tables_dir.parent / MANIFEST  # the campaign's run list, every plan in it
    for path in (manifest, Path(campaign_file) if campaign_file else None):
        if path is not None and path.exists():
            client.log_artifact(campaign_id, str(path))
    for table in TABLES:  # a campaign without tuning has no tuning tables
        if table_file(tables_dir, table).exists():
            client.log_artifact(campaign_id, str(table_file(tables_dir, table)), artifact_path=TABLES_DIR)
    if report_dir is not None:
        client.log_artifacts(campaign_id, str(report_dir), artifact_path=REPORT_DIR)


def attach_report(report_dir: str | Path, uri: str, experiment_name: str, tracking_marker: str | Path,
                  marker: str | Path, retry: LockRetry = LockRetry()) -> dict[str, Any]:
    """Attach the report in `report_dir` to the campaign run that `track` logged (named in its marker,
    `tracking_marker`), under the experiment's lock as `track` works, and write `marker`: the campaign
    run and the files attached. The workflow's report and `track` run side by side; this joins them."""
    report_dir = Path(report_dir)
    try:
        campaign_id = json.loads(Path(tracking_marker).read_text())["campaign_run_id"]
    except (KeyError, TypeError, ValueError) as error:
        raise LdpbenchError(f"'{tracking_marker}' is not the marker of a tracked campaign (a JSON object with "
                            f"'campaign_run_id', as `ldpbench track` writes it): {error!r}") from None
    if not report_dir.is_dir():
        raise LdpbenchError(f"'{report_dir}' is no report directory")
    files = sorted(str(path.relative_to(report_dir)) for path in report_dir.rglob("*") if path.is_file())
    with exclusive_lock(track_lock_file(uri, experiment_name, tracking_marker), f"tracking of '{experiment_name}'"):
        _client(uri, retry).log_artifacts(campaign_id, str(report_dir), artifact_path=REPORT_DIR)
    result = {"campaign_run_id": campaign_id, "report_files": files}
    write_json(marker, result)
    return result


def init_store(uri: str, experiment_name: str, artifact_dir: str | Path, marker: str | Path,
               wait_seconds: float = 60.0, retry: LockRetry = LockRetry()) -> dict[str, Any]:
    """Create the tracking store (SQLite schema or a server's experiment) once, before any writer.

    Concurrent first writers to a missing SQLite file race on schema creation and fail; one local
    step that creates it first makes every later writer (tracking, live progress from cluster jobs)
    safe. For an http(s) URI it waits until the server answers /health (`wait_seconds` at most; a
    server that answers but is not MLflow's fails at once). Idempotent; writes
    `marker` (URI and experiment id).
    """
    if _is_server(uri):
        _wait_for_server(uri, wait_seconds)
    _create_missing_sqlite_store(uri, retry)
    # Two steps creating the experiment at once: one would fail on the name the other just took.
    with exclusive_lock(track_lock_file(uri, experiment_name, marker), f"tracking of '{experiment_name}'"):
        client = _client(uri, retry)
        experiment_id = _experiment(client, experiment_name, Path(artifact_dir))
    result = {"uri": uri, "experiment": experiment_name, "experiment_id": experiment_id}
    write_json(marker, result)
    return result


def _create_missing_sqlite_store(uri: str, retry: LockRetry) -> None:
    """Create the store of a `sqlite:///path` URI if it is missing (not one of SQLite's URI filenames,
    `sqlite:///file:...?mode=ro`, which say how to open a store rather than where to create one, nor an
    in-memory one)."""
    if not uri.startswith("sqlite:///"):
        return
    path = uri[len("sqlite:///"):]
    if path and path != ":memory:" and not path.startswith("file:") and "?" not in path:
        call_store(uri, _create_sqlite_atomically, Path(path), retry=retry)


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
        _new_store(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _build_store(path: Path, artifact_root: str) -> None:
    """An empty store at `path`, built by MLflow's migrations."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(f"sqlite:///{path}", artifact_root)
    store.engine.dispose()


def _new_store(path: Path) -> None:
    """An empty store at `path`, the artifacts of its Default experiment beside it: a copy of this
    installation's empty store (store_template), where MLflow's migrations take seconds of a core for
    each campaign that tracks. The copy is what the migrations would build at `path`: the template's one
    row that depends on where and when it was built, its Default experiment, is rewritten as MLflow writes
    it. A template that does not have that row as expected is not used."""
    template, template_root = store_template()
    artifact_root = path.parent.as_uri()
    if template is not None:
        shutil.copyfile(template, path)
        now = int(time.time() * 1000)
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            rows = db.execute("SELECT artifact_location FROM experiments").fetchall()
            if len(rows) == 1 and rows[0][0] == f"{template_root}/0":
                db.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                           "WHERE experiment_id = 0", (f"{artifact_root}/0", now, now))
                return
        path.unlink()
    _build_store(path, artifact_root)


def store_template() -> tuple[Path | None, str]:
    """(the empty store of this installation's MLflow, SQLAlchemy, Alembic and SQLite, built on first use
    in the package's bytecode directory; None where it cannot be kept there, the artifact root it was
    built with)."""
    import alembic
    import mlflow
    import sqlalchemy

    versions = json.dumps([mlflow.__version__, alembic.__version__, sqlalchemy.__version__, sqlite3.sqlite_version])
    directory = Path(__file__).resolve().parents[1] / "__pycache__"
    template = directory / f"mlflow-empty-store-{hashlib.sha256(versions.encode()).hexdigest()[:16]}.db"
    root = (directory / "mlflow-empty-store-artifacts").as_uri()  # never written to
    if template.exists():
        return template, root
    tmp = template.with_name(f".{template.name}.{os.getpid()}.tmp")
    try:
        directory.mkdir(exist_ok=True)
        tmp.unlink(missing_ok=True)
        tmp.touch()  # OSError where the directory is not writable (an empty file is an empty database)
        _build_store(tmp, root)
        os.replace(tmp, template)
    except OSError as error:
        log.info("the empty MLflow store is not kept in %s (%s): each new store is built by MLflow's migrations",
                 directory, error)
        tmp.unlink(missing_ok=True)
        return None, root
    return template, root


def _wait_for_server(uri: str, wait_seconds: float) -> None:
    """Return once the server at `uri` answers /health with 200, as MLflow's does.

    No answer (connection refused, reset, timed out) or a gateway's 502-504 (a proxy in front of
    a server that is starting) is waited for, until `wait_seconds` have passed. Any other answer
    comes from a server that is up and is not MLflow's (a wrong port or path): it fails at once.
    """
    health = uri.rstrip("/") + "/health"
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            with urllib.request.urlopen(health, timeout=HEALTH_TIMEOUT_SECONDS) as response:
                status, reason = response.status, response.reason
        except urllib.error.HTTPError as error:  # an answer, not a failure to get one
            status, reason = error.code, error.reason
        except (urllib.error.URLError, OSError) as error:
            status, reason = None, getattr(error, "reason", None) or error
        if status == 200:
            return
        if status is not None and status not in STARTING_STATUSES:
            raise LdpbenchError(f"'{uri}' is not an MLflow tracking server: it answered HTTP {status} "
                                f"({reason}) on /health, where MLflow answers 200; check tracking.uri")
        if time.monotonic() + 1 >= deadline:
            break
        time.sleep(1)
    answer = f"HTTP {status} ({reason})" if status is not None else reason
    raise LdpbenchError(f"MLflow tracking server at '{uri}' did not answer /health within "
                        f"{wait_seconds:g} s ({answer}); start it with `ldpbench tracking-server`")


def server_environment() -> dict[str, str]:
    """The environment of `mlflow server`: quiet, and without the background job runner, which would
    start extra worker processes next to the server."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **QUIET_ENVIRONMENT}


def browse(target: str | Path, host: str, port: int, open_browser: bool = False) -> int:
    """`ldpbench ui`: print (and open) the configurations and curves views of every campaign in `target`, a
    results directory (its mlflow.db), a SQLite store or a tracking server's address. A SQLite store is
    served by MLflow's UI until Ctrl-C (`mlflow server` on host:port); a server is only named."""
    import signal
    import socket
    import subprocess
    import webbrowser

    target = str(target)
    if _is_server(target):
        views = campaign_views(target, target)
        _print_views(views, f"the tracking server {target}")
        if open_browser and views:
            webbrowser.open(views[0][1])
        return 0
    store = Path(target) / "mlflow.db" if Path(target).is_dir() else Path(target)
    if not store.is_file():
        raise LdpbenchError(f"no MLflow store at '{store}': give a campaign's results directory (holding "
                            "mlflow.db), the store's SQLite file, or a tracking server's http:// address")
    served_at = f"http://{host}:{port}"
    views = campaign_views(f"sqlite:///{store.resolve()}", served_at)
    with socket.socket() as probe:
        if probe.connect_ex((host, port)) == 0:
            raise LdpbenchError(f"{host}:{port} is taken by another program: pass --port")
    # The server's own lines on stderr: stdout holds the addresses alone.
    process = subprocess.Popen(server_command(store, host, port, store.parent / ARTIFACTS_DIR),
                               env=server_environment(), stdout=sys.stderr)
    # A kill (SIGTERM) ends the server too, as Ctrl-C does: through the `finally` below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        _wait_for_server(served_at, 120)
        _print_views(views, f"MLflow's UI on {store}, at {served_at} (Ctrl-C stops it)")
        if open_browser and views:
            webbrowser.open(views[0][1])
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=60)


def _print_views(views: list[tuple[str, str]], where: str) -> None:
    if not views:
        print(f"{where}: no ldpbench campaign tracked there yet (a campaign's track step logs one)", flush=True)
        return
    print(f"{where}; the configurations of each campaign, and its accuracy against ε:", flush=True)
    for what, address in views:
        print(f"  {what}: {address}", flush=True)


def server_command(store: str | Path, host: str, port: int, artifacts: str | Path,
                   workers: int = 1, allowed_hosts: str | None = None) -> list[str]:
    """The `mlflow server` command line for a SQLite store (absolute paths; no shell involved)."""
    store = Path(store).resolve()
    return [sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{store}",
            "--artifacts-destination", Path(artifacts).resolve().as_uri(),
            "--host", host, "--port", str(int(port)), "--workers", str(int(workers)),
            *(["--allowed-hosts", allowed_hosts] if allowed_hosts else [])]
