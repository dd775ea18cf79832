"""Live progress in MLflow: a run streams its evaluated rounds to a tracking server while it trains.

With a tracking server (`tracking.uri: http://...`, `tracking.live: true`), each run opens an MLflow
run tagged `ldpbench.level = live` and sends its curve points in batches from a background thread,
every `flush_seconds`, so MLflow's runs page shows the campaign's progress while it runs. The final
`track` step logs every run from the tables (the source of truth) and soft-deletes the live runs.

A run never waits for, or fails because of, the server: the sender works on its own thread, and its
first attempt (importing MLflow and creating the live run) is made at once, while the run trains,
not at the end; a batch that fails stays queued and is sent again at the next flush (at most
`max_pending` points are kept; older ones are dropped first); the server being away is logged once,
and again when it answers. The campaign's experiment is created by the workflow's tracking_store
step, which may still be running when the first runs start (the cells do not wait for it, so that
turning a server on reruns no cell): until it exists the sender asks again every
`EXPERIMENT_POLL_SECONDS`. At the end the run waits for MLflow's import to finish (local work of
seconds on a loaded machine; no server makes it longer), then at most `close_seconds` for
the server: the last batch is retried within that time if the server has answered this run before
(a transient refusal, e.g. its store busy, or the experiment not there yet) and tried once
otherwise (a server that never answered does not hold up every run's end).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass

from ldpbench.results.mlflow_common import (
    BATCH_LIMIT,
    CAMPAIGN_TAG,
    LEVEL_TAG,
    LIVE,
    LIVE_HTTP_ENVIRONMENT,
    quiet_mlflow,
)

log = logging.getLogger("ldpbench")

LIVE_KEY_PREFIX = "live:"
CLOSE_RETRY_SECONDS = 0.5  # the pause between attempts at the last batch of a server that answered before
IMPORT_WAIT_SECONDS = 300.0  # a bound on waiting for MLflow's import, which is local work and ends
EXPERIMENT_POLL_SECONDS = 1.0  # how often a run asks again for an experiment the workflow is creating
# Set by the workflow (tracking.live with a server): JSON of a LiveTarget, inherited by every job.
LIVE_ENV = "LDPBENCH_LIVE_TRACKING"


@dataclass(frozen=True)
class LiveTarget:
    """Where live runs go: the tracking server, the experiment and the campaign."""

    uri: str
    experiment: str
    campaign: str

    def __post_init__(self) -> None:
        if not self.uri.startswith(("http://", "https://")):
            raise ValueError(f"live tracking needs a tracking server (http:// or https://), got '{self.uri}'")


def live_environment(uri: str, experiment: str, campaign: str) -> str:
    """The value of LIVE_ENV for a campaign (checked here, so a bad URI fails before any job)."""
    return json.dumps(asdict(LiveTarget(uri, experiment, campaign)))


def target_from_environment() -> LiveTarget | None:
    """The live target the workflow handed its jobs, or None; a malformed value is logged and ignored."""
    text = os.environ.get(LIVE_ENV)
    if not text:
        return None
    try:
        return LiveTarget(**json.loads(text))
    except (ValueError, TypeError) as error:
        log.warning("%s is not a live tracking target (%s); no live progress", LIVE_ENV, error)
        return None


class LiveRun:
    """One run's live MLflow run: `add` queues curve points, a background thread sends them."""

    def __init__(self, target: LiveTarget, run_id: str, name: str, params: dict[str, str],
                 flush_seconds: float = 10.0, close_seconds: float = 10.0, max_pending: int = 10_000,
                 client_factory=None):
        self.target, self.run_id, self.name, self.params = target, run_id, name, params
        self.flush_seconds, self.close_seconds = flush_seconds, close_seconds
        self.pending: deque[tuple[str, float, int, int]] = deque(maxlen=max_pending)  # (key, value, ms, step)
        self.sent = 0
        self.dropped = 0  # points dropped because `max_pending` were waiting
        self._client_factory = client_factory or _http_client
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._mlflow_run: str | None = None
        self._status = "RUNNING"
        self._away = False  # the last attempt failed (said once, until the server answers again)
        self._answered = False  # some attempt of this run succeeded: a failure at the end is worth retrying
        self._close_deadline = float("inf")
        self._client_made = threading.Event()  # MLflow imported and its client made (or that failed)
        self._thread = threading.Thread(target=self._send_loop, name=f"live-{run_id}", daemon=True)
        self._thread.start()

    def add(self, step: int, metrics: dict[str, float]) -> None:
        """Queue one evaluated round (never blocks on the server)."""
        now = int(time.time() * 1000)
        with self._lock:
            for key, value in metrics.items():
                if self.pending.maxlen is not None and len(self.pending) == self.pending.maxlen:
                    self.dropped += 1
                self.pending.append((key, float(value), now, int(step)))

    def close(self, status: str = "FINISHED") -> None:
        """Send what is queued and end the live run, waiting at most `close_seconds` for the server."""
        self._client_made.wait(IMPORT_WAIT_SECONDS)
        self._status = status
        self._close_deadline = time.monotonic() + self.close_seconds
        self._closing.set()
        self._thread.join(self.close_seconds)
        with self._lock:
            unsent = len(self.pending)
        if self.dropped:
            log.warning("%s: %d live metric values dropped while the server was away (more than %d waited)",
                        self.name, self.dropped, self.pending.maxlen)
        if self._thread.is_alive() or unsent:
            log.warning("%s: %d live metric values not sent to %s (the server is away or slow); the "
                        "campaign's track step logs the whole curve from the tables", self.name, unsent,
                        self.target.uri)

    # -- the sender thread
    def _send_loop(self) -> None:
        client = None
        wait = 0.0  # the first attempt at once, then a flush every flush_seconds, and a last one
        while True:
            closing = self._closing.wait(wait)
            wait = self.flush_seconds
            sent = False
            try:
                try:
                    client = client or self._made_client()
                finally:
                    self._client_made.set()
                self._flush(client, closing)
                sent = self._answered = True
                if self._away:
                    log.info("%s: tracking server %s answers again", self.name, self.target.uri)
                    self._away = False
            except ExperimentNotYet:  # the server answered: the tracking_store step is creating it
                self._answered = True
                wait = min(self.flush_seconds, EXPERIMENT_POLL_SECONDS)
            except Exception as error:  # the server is away, refuses, or times out: try again later
                if not self._away:
                    self._away = True
                    log.warning("%s: live progress to %s failed (%s); the run goes on and retries every "
                                "%g s", self.name, self.target.uri, _one_line(error), self.flush_seconds)
            if not closing:
                continue
            # The last attempt: again while the deadline allows, if this server ever answered.
            if sent or not self._answered or time.monotonic() + CLOSE_RETRY_SECONDS >= self._close_deadline:
                return
            time.sleep(CLOSE_RETRY_SECONDS)

    def _made_client(self):
        """The client, with MLflow's entities imported too: all of MLflow's import (local work, which `close`
        waits for in full) is done before `close_seconds`, the bound on waiting for the server, starts."""
        client = self._client_factory(self.target.uri)
        import mlflow.entities  # noqa: F401 - what _flush builds its batches with

        return client

    def _flush(self, client, closing: bool) -> None:
        from mlflow.entities import Metric, Param

        if self._mlflow_run is None:
            experiment = client.get_experiment_by_name(self.target.experiment)
            if experiment is None:
                raise ExperimentNotYet(f"no experiment '{self.target.experiment}' (the workflow's "
                                       "tracking_store step creates it)")
            tags = {"run_key": LIVE_KEY_PREFIX + self.run_id, LEVEL_TAG: LIVE, CAMPAIGN_TAG: self.target.campaign,
                    "ldpbench.run_id": self.run_id, "mlflow.source.name": "ldpbench"}
            run = client.create_run(experiment.experiment_id, run_name=f"{self.name} (live)", tags=tags)
            self._mlflow_run = run.info.run_id
            client.log_batch(self._mlflow_run, params=[Param(k, v) for k, v in self.params.items()])
        while True:
            with self._lock:
                batch = [self.pending.popleft() for _ in range(min(BATCH_LIMIT, len(self.pending)))]
            if not batch:
                break
            try:
                client.log_batch(self._mlflow_run, metrics=[Metric(k, v, ms, step) for k, v, ms, step in batch])
            except Exception:
                with self._lock:  # first in line at the next flush
                    self.pending.extendleft(reversed(batch))
                raise
            self.sent += len(batch)
        if closing:
            client.set_terminated(self._mlflow_run, self._status)


class ExperimentNotYet(LookupError):
    """The server answers but the campaign's experiment does not exist (yet)."""


def _http_client(uri: str):
    # MLflow retries a failed request 7 times with growing pauses by default; the sender retries at
    # its next flush instead, so one attempt each, bounded in time.
    quiet_mlflow(LIVE_HTTP_ENVIRONMENT)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__
