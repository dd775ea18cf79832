"""The MLflow tag names and levels that ldpbench writes (standard library only: the run jobs
that stream live progress import it, and must not pay for the tables' imports)."""

LEVEL_TAG = "ldpbench.level"
CAMPAIGN_TAG = "ldpbench.campaign"
FINGERPRINT_TAG = "ldpbench.fingerprint"
CAMPAIGN, CONFIGURATION, RUN = "campaign", "configuration", "run"
LIVE = "live"  # a run's progress streamed while it trained (results.live); removed by `track`
