"""What ldpbench's MLflow writers share: tag names, levels, the batch limit, the quiet environment and
how a parameter is written. Standard library only: the run jobs that stream live progress import it
and must not pay for the tables' imports."""

from __future__ import annotations

import os
from typing import Any

LEVEL_TAG = "ldpbench.level"
CAMPAIGN_TAG = "ldpbench.campaign"
FINGERPRINT_TAG = "ldpbench.fingerprint"
CAMPAIGN, CONFIGURATION, RUN = "campaign", "configuration", "run"
LIVE = "live"  # a run's progress streamed while it trained (results.live); removed by `track`
BATCH_LIMIT = 900  # MLflow accepts at most 1000 entities (metrics, params, tags) per log_batch call
# No usage reports from MLflow's client or server (no network here; nothing to report).
QUIET_ENVIRONMENT = {"MLFLOW_ENABLE_TELEMETRY": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}


def quiet_mlflow() -> None:
    """QUIET_ENVIRONMENT in this process, unless the user set those variables."""
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def param_text(value: Any) -> str:
    """A parameter as people type it in a filter: ε 2 is "2" (not "2.0"), ∞ is "inf"."""
    return f"{value:g}" if isinstance(value, float) else str(value)
