"""Explicit Arrow schemas of the per-run files and the campaign tables.

The run files are the source of truth: every later table, figure and MLflow run is derived from
them, and they are read back against these schemas (a missing column or wrong type is an error
that names the file).
"""

from __future__ import annotations

import pyarrow as pa

RUN_KEY_FIELDS = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("dataset", pa.string(), nullable=False),
    pa.field("model", pa.string(), nullable=False),
    pa.field("mechanism", pa.string(), nullable=False),
    pa.field("mechanism_params", pa.string(), nullable=False),  # canonical JSON
    pa.field("epsilon", pa.float64(), nullable=False),  # inf for non-private mechanisms
    pa.field("seed", pa.int64(), nullable=False),
    pa.field("fold", pa.int64(), nullable=False),
]

SUMMARY_SCHEMA = pa.schema(RUN_KEY_FIELDS + [
    pa.field("plan", pa.string(), nullable=False),  # the canonical run plan JSON (RunPlan.canonical_json)
    pa.field("status", pa.string(), nullable=False),
    pa.field("test_accuracy", pa.float64()),
    pa.field("test_auc", pa.float64()),  # binary ROC AUC, or macro one-vs-rest for multiclass
    pa.field("test_loss", pa.float64()),
    pa.field("train_loss", pa.float64()),
    pa.field("rounds", pa.int64()),
    pa.field("rounds_planned", pa.int64()),
    pa.field("epochs", pa.int64()),
    pa.field("clients", pa.int64()),
    pa.field("records", pa.int64()),  # training records (clients may hold several)
    pa.field("test_records", pa.int64()),
    pa.field("dims", pa.int64()),
    pa.field("epsilon_per_report", pa.float64()),
    pa.field("epsilon_claimed_per_report", pa.float64()),
    pa.field("epsilon_worst_case_per_report", pa.float64()),
    pa.field("delta_claimed_per_report", pa.float64()),  # δ of an (ε, δ) claim; 0 for pure ε
    pa.field("bits_per_report", pa.float64()),
    pa.field("reports_per_client_max", pa.int64()),
    pa.field("epsilon_claimed_client_max", pa.float64()),
    pa.field("epsilon_worst_case_client_max", pa.float64()),
    pa.field("uplink_bits_total", pa.float64()),
    pa.field("train_seconds", pa.float64()),
    pa.field("wall_seconds", pa.float64()),
    pa.field("started_at", pa.string()),
    pa.field("finished_at", pa.string()),
    pa.field("ldpbench_version", pa.string()),
    pa.field("torch_version", pa.string()),
    # Added after the first campaigns ran: files without them are read with nulls (ADDED_FIELDS).
    pa.field("classes", pa.int64()),  # the task's classes (the random-guess reference is 1/classes)
    pa.field("features_provenance", pa.string()),  # JSON: encoder, weights and their hash, pooling
    # Added with validation clients and early stopping: NaN without validation clients.
    pa.field("validation_accuracy", pa.float64()),
    pa.field("validation_auc", pa.float64()),
    pa.field("validation_loss", pa.float64()),
    pa.field("validation_records", pa.int64()),
    pa.field("stopped_early", pa.bool_()),  # the plateau stop (training.stop) ended the run
    # Added with closed-form gradients: "closed-form" or "vmap" (training.gradients).
    pa.field("gradients", pa.string()),
    # Added with runs trained together: how many runs of its cell trained round by round
    # with this one, itself included (1: alone); train_seconds is then the group's time ÷ that count.
    pa.field("trained_together", pa.int64()),
    # Added with the trivial-model flags: the test accuracy of always predicting the training
    # split's majority class; a result whose interval holds it is no better than a constant.
    pa.field("test_majority_accuracy", pa.float64()),
])

# Columns a run file written by an earlier version may lack; they are read as nulls.
ADDED_FIELDS = frozenset({"classes", "features_provenance", "validation_accuracy", "validation_auc",
                          "validation_loss", "validation_records", "stopped_early", "gradients",
                          "trained_together", "test_majority_accuracy"})

CURVE_SCHEMA = pa.schema([
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("round", pa.int64(), nullable=False),
    pa.field("epoch", pa.int64(), nullable=False),
    pa.field("test_accuracy", pa.float64()),
    pa.field("test_auc", pa.float64()),
    pa.field("test_loss", pa.float64()),
    pa.field("train_loss", pa.float64()),
    pa.field("validation_accuracy", pa.float64()),
    pa.field("validation_auc", pa.float64()),
    pa.field("validation_loss", pa.float64()),
])

LEDGER_SCHEMA = pa.schema([
    pa.field("client", pa.int64(), nullable=False),  # index in the run's partition into clients
    pa.field("reports", pa.int64(), nullable=False),
    pa.field("epsilon_claimed", pa.float64(), nullable=False),
    pa.field("epsilon_worst_case", pa.float64(), nullable=False),
])
