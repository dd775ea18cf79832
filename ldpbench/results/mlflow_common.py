"""What ldpbench's MLflow writers share: tag names, levels, the batch limit, the quiet environment and
how a parameter is written. Standard library only: the run jobs that stream live progress import it
and must not pay for the tables' imports."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

LEVEL_TAG = "ldpbench.level"
CAMPAIGN_TAG = "ldpbench.campaign"
FINGERPRINT_TAG = "ldpbench.fingerprint"
CAMPAIGN, CONFIGURATION, RUN = "campaign", "configuration", "run"
# A tuned configuration's sweep: its tuning run (under the configuration) and the trials under that.
TUNING, TRIAL = "tuning", "trial"
CURVE = "curve"  # a mechanism's accuracy against ε on one dataset and model, for the curves view's charts
LIVE = "live"  # a run's progress streamed while it trained (results.live); removed by `track`
BATCH_LIMIT = 900  # MLflow accepts at most 1000 entities (metrics, params, tags) per log_batch call
PARAMS_TAGS_LIMIT = 100  # ... of which at most 100 params and 100 tags
# No usage reports from MLflow's client or server (no network here; nothing to report).
QUIET_ENVIRONMENT = {"MLFLOW_ENABLE_TELEMETRY": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
# MLflow's HTTP client retries a failed request 7 times, pausing 4, 8, ... up to 120 s (about 4 min in
# all), and waits up to 120 s for each answer: a tracking server that is gone held `track` for minutes
# before it failed. `track` and `tracking-init` retry twice (pauses of 0 and 2 s, plus up to 1 s of
# jitter) and wait 30 s for an answer, so a request to a server that is gone fails within seconds;
# MLflow reads these variables at every request.
TRACK_HTTP_ENVIRONMENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                          "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
# Live progress makes one attempt per request, bounded in time: its sender retries at the next flush.
LIVE_HTTP_ENVIRONMENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def quiet_mlflow(http: Mapping[str, str] | None = None) -> None:
    """QUIET_ENVIRONMENT, and `http` (bounds on MLflow's HTTP client), in this process, unless the
    user set those variables: a user's own setting wins."""
    for key, value in {**QUIET_ENVIRONMENT, **(http or {})}.items():
        os.environ.setdefault(key, value)


def param_text(value: Any) -> str:
    """A parameter as people type it in a filter: ε 2 is "2" (not "2.0"), ∞ is "inf"."""
    return f"{value:g}" if isinstance(value, float) else str(value)
