"""The column map (ldpbench/results/schema.py): every table a campaign writes follows it, and a writer
that adds a column the map lacks, or drops one it declares, fails naming the table and the column."""

from __future__ import annotations

from dataclasses import fields

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldpbench import audit, layout
from ldpbench.results import tables
from ldpbench.results.schema import TABLES, ColumnMapError, file_problems, write_table

from column_map import assert_tables_follow_column_map
from tiny_campaign import build_campaign


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
