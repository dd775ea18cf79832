"""The column map (ldpbench/results/schema.py): every table a campaign writes follows it, and a writer
that adds a column the map lacks, or drops one it declares, fails naming the table and the column."""

from __future__ import annotations

import json
import math
from dataclasses import fields

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ldpbench import audit, layout, scorecard, tuning
from ldpbench.atomic import write_parquet
from ldpbench.layout import CURVES, FINAL, LEDGERS, SUMMARIES, TRIAL, run_file
from ldpbench.results import compare, tables
from ldpbench.results.schema import (
    CURVE_SCHEMA,
    LEDGER_SCHEMA,
    SUMMARY_SCHEMA,
    TABLES,
    ColumnMapError,
    file_problems,
    write_table,
)

from column_map import assert_tables_follow_column_map

# label → (mechanism, ε, test accuracy of seed 0); three seeds each, fold 0.
CONFIGURATIONS = {"PM": ("pm", 1.0, 0.70), "HM": ("hm", 1.0, 0.60), "NP": ("np", math.inf, 0.80)}


def write_run(runs, phase, run_id, label, seed, accuracy, **values) -> dict:
    """A run's summary, curve and ledger files; its manifest entry."""
    mechanism, epsilon, _ = CONFIGURATIONS[label]
    row = {field.name: None for field in SUMMARY_SCHEMA} | {
        "run_id": run_id, "dataset": "syn", "model": "lr", "mechanism": mechanism, "mechanism_params": "{}",
        "epsilon": epsilon, "seed": seed, "fold": 0, "plan": "{}", "status": "ok", "test_accuracy": accuracy,
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


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    root = tmp_path_factory.mktemp("campaign")
    build_campaign(root)
    return root


def test_every_table_the_writers_build_follows_the_column_map(campaign):
    assert assert_tables_follow_column_map(campaign) == sorted(TABLES)
    # The tables are not empty: each is checked on rows, not only on its columns' declarations.
    assert all(len(pd.read_parquet(campaign / "tables" / f"{name}.parquet")) for name in TABLES)


def test_a_writer_that_adds_a_column_the_map_lacks_fails_naming_the_table_and_the_column(campaign, monkeypatch,
                                                                                         tmp_path):
    summarize = tables.summarize
    monkeypatch.setattr(tables, "summarize", lambda runs: summarize(runs).assign(novel=1.0))
    with pytest.raises(ColumnMapError, match="table 'summary' has column 'novel', which the column map"):
        tables.aggregate(campaign / "manifest.json", campaign / "runs", tmp_path)
    assert not (tmp_path / "summary.parquet").exists()


def test_a_table_without_a_declared_column_or_with_a_wrong_type_fails_naming_it(campaign, tmp_path):
    verdicts = pd.read_parquet(campaign / "tables" / "verdicts.parquet")
    with pytest.raises(ColumnMapError, match="table 'verdicts' lacks column 'trivial'"):
        write_table(tmp_path / "verdicts.parquet", "verdicts", verdicts.drop(columns="trivial"))
    with pytest.raises(ColumnMapError, match="table 'verdicts' does not fit.*best_mean"):
        write_table(tmp_path / "verdicts.parquet", "verdicts", verdicts.assign(best_mean="high"))
    with pytest.raises(ColumnMapError, match="table 'verdicts' does not fit.*non-nullable"):
        write_table(tmp_path / "verdicts.parquet", "verdicts", verdicts.assign(best=None))
    with pytest.raises(ColumnMapError, match="no campaign table 'verdict'"):
        write_table(tmp_path / "verdict.parquet", "verdict", verdicts)
    assert not list(tmp_path.iterdir())


def test_the_check_of_written_files_finds_order_types_undeclared_columns_and_nulls(campaign, tmp_path):
    rankings = pd.read_parquet(campaign / "tables" / "rankings.parquet")
    declared = TABLES["rankings"]
    cases = {"order": rankings[list(reversed(rankings.columns))],
             "type": rankings.assign(rank=rankings["rank"].astype(float)),
             "undeclared": rankings.assign(extra=1),
             "null": rankings.assign(group=rankings["group"].where(rankings.index != 0))}
    found = {}
    for case, frame in cases.items():
        written = pa.Table.from_pandas(frame, preserve_index=False)
        # pandas writes its strings as large_string; the map's strings are string.
        written = written.cast(pa.schema([pa.field(field.name, pa.string()) if field.type == pa.large_string()
                                          else field for field in written.schema]))
        pq.write_table(written, tmp_path / f"{case}.parquet")
        found[case] = file_problems(tmp_path / f"{case}.parquet", declared)
    assert [len(problems) for problems in found.values()] == [1, 1, 1, 1], found
    assert "not the map's" in found["order"][0]
    assert "column 'rank' is double, the map says int64" in found["type"][0]
    assert "has column 'extra', which the column map" in found["undeclared"][0]
    assert "column 'group' holds nulls" in found["null"][0]
    assert file_problems(campaign / "tables" / "rankings.parquet", declared) == []


def test_the_map_declares_every_table_of_the_layout_and_the_audits_fields_in_order():
    assert set(TABLES) == set(layout.TABLES)
    assert TABLES["audit"].names == [field.name for field in fields(audit.AuditResult)]
    for declared in TABLES.values():
        assert len(set(declared.names)) == len(declared.names), declared.name
        assert all(column.meaning for column in declared.columns), declared.name
