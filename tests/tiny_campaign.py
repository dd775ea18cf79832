"""A small tuned campaign written file by file, every table built by ldpbench's own writers: what the
column map's tests and the tracking of a tuning sweep read."""

from __future__ import annotations

import json
import math

import yaml

from ldpbench import audit, scorecard, tuning
from ldpbench.atomic import write_parquet
from ldpbench.layout import CURVES, FINAL, LEDGERS, SUMMARIES, TRIAL, run_file
from ldpbench.results import compare, tables
from ldpbench.results.schema import CURVE_SCHEMA, LEDGER_SCHEMA, SUMMARY_SCHEMA

PLAN = json.dumps({"folds": 1, "test_fraction": 0.2, "network_params": {}, "mechanism_params": {},
                   "training": {"epochs": 1}})
# label → (mechanism, ε, test accuracy of seed 0); three seeds each, fold 0.
CONFIGURATIONS = {"PM": ("pm", 1.0, 0.70), "HM": ("hm", 1.0, 0.60), "NP": ("np", math.inf, 0.80)}


def write_run(runs, phase, run_id, label, seed, accuracy, **values) -> dict:
    """A run's summary, curve and ledger files; its manifest entry."""
    mechanism, epsilon, _ = CONFIGURATIONS[label]
    row = {field.name: None for field in SUMMARY_SCHEMA} | {
        "run_id": run_id, "dataset": "syn", "model": "lr", "mechanism": mechanism, "mechanism_params": "{}",
        "epsilon": epsilon, "seed": seed, "fold": 0, "plan": PLAN, "status": "ok", "test_accuracy": accuracy,
        "test_auc": accuracy + 0.05, "test_loss": 0.5, "train_loss": 0.4, "rounds": 10, "rounds_planned": 10,
        "epochs": 1, "clients": 2, "records": 100, "test_records": 20, "dims": 4, "classes": 2,
        "test_majority_accuracy": 0.5, "uplink_bits_total": 640.0, "train_seconds": 1.0, "wall_seconds": 1.5,
        "started_at": "2024-01-01T00:00:00", "finished_at": "2024-01-01T00:00:02", "bits_per_report": 32.0,
        "reports_per_client_max": 10, "stopped_early": False, "trained_together": 1, **values}
    row |= {f"epsilon_{kind}": epsilon for kind in ("per_report", "claimed_per_report", "worst_case_per_report")}
    row |= {f"epsilon_{kind}_client_max": 10 * epsilon for kind in ("claimed", "worst_case")}
    where = ("syn", mechanism, phase, run_id)
    write_parquet(run_file(runs, SUMMARIES, *where), [row], SUMMARY_SCHEMA)
    points = [{field.name: accuracy for field in CURVE_SCHEMA} | {"run_id": run_id, "round": r, "epoch": r}
              for r in range(0, 11, 2)]
    write_parquet(run_file(runs, CURVES, *where), points, CURVE_SCHEMA)
    write_parquet(run_file(runs, LEDGERS, *where), {"client": [0, 1], "reports": [10, 10],
                                                     "epsilon_claimed": [10 * epsilon] * 2,
                                                     "epsilon_worst_case": [10 * epsilon] * 2}, LEDGER_SCHEMA)
    return {"plan": {"dataset": "syn", "mechanism": mechanism}, "run_id": run_id, "cell_id": f"cell-{label}",
            "label": label}


def build_campaign(root) -> None:
    """root/{runs,tables} of a small tuned campaign with every table: runs, curves and summary; PM tuned
    over two points (tuning, selected); comparisons, rankings and verdicts; a scorecard and an audit."""
    runs, tables_dir = root / "runs", root / "tables"
    trials = [write_run(runs, TRIAL, f"trial{point}", "PM", 0, 0.0, validation_auc=0.6 + point / 10)
              | {"point": point, "setting": json.dumps({"learning_rate": rate}), "metric": "validation_auc",
                 "direction": "maximize", "data": "private"}
              for point, rate in enumerate((0.1, 0.3))]
    (root / "trials.json").write_text(json.dumps({"campaign": "tiny", "phase": TRIAL, "runs": trials}))
    final = [write_run(runs, FINAL, f"{label}-{seed}", label, seed, accuracy + seed / 100)
             for label, (_, _, accuracy) in CONFIGURATIONS.items() for seed in range(3)]
    (root / "manifest.json").write_text(json.dumps({"campaign": "tiny", "runs": final}))
    tuning.select_tables(root / "trials.json", runs, tables_dir)
    tables.aggregate(root / "manifest.json", runs, tables_dir, tables_dir / "selected.parquet")
    compare.compare_tables(tables_dir)
    claims = root / "claims.yaml"
    claims.write_text(yaml.safe_dump({"paper": "A paper", "claims": [
        {"id": "np", "source": "Table 1", "dataset": "syn", "model": "lr", "epsilon": math.inf,
         "relation": "value", "mechanisms": ["NP"], "value": 80.0},
        {"id": "order", "source": "Table 1", "dataset": "syn", "model": "lr", "epsilon": 1,
         "relation": "order", "mechanisms": ["PM", "HM"]}]}))
    scorecard.write_scorecard(tables_dir, [str(claims)], tables_dir / "scorecard.parquet")
    audit.write_table(tables_dir / "audit.parquet", [audit.AuditResult(
        "pm", "{}", 1.0, 4, 1.0, 1.0, 0.8, 1000, 3, "random 0", "first coordinate > 0", 0.01, audit.CONSISTENT)])
