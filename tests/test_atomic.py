"""Atomic writes: a crash leaves the previous file, and results get ordinary permissions."""

import os

import pytest

from ldpbench.atomic import atomic_path, write_text


def test_failed_write_leaves_previous_file_untouched(tmp_path):
    target = tmp_path / "table.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]  # no temporary file left


def test_atomic_writes_get_ordinary_permissions(tmp_path):
    write_text(tmp_path / "result.txt", "x")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "result.txt").stat().st_mode & 0o777 == 0o666 & ~mask


def test_parquet_from_rows_or_columns_holds_what_a_dataframe_gives(tmp_path):
    """The run files are written from rows and columns, not DataFrames: the same column types and
    values, NaN written as null as pandas writes it, and a missing field is an error naming it."""
    import math

    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ldpbench.atomic import write_parquet

    schema = pa.schema([pa.field("run_id", pa.string(), nullable=False), pa.field("round", pa.int64()),
                        pa.field("loss", pa.float64()), pa.field("note", pa.string()),
                        pa.field("stopped", pa.bool_())])
    rows = [{"run_id": "a", "round": 0, "loss": 0.5, "note": None, "stopped": False},
            {"run_id": "a", "round": 10, "loss": math.nan, "note": "x", "stopped": True}]
    columns = {name: [row[name] for row in rows] for name in schema.names}
    write_parquet(tmp_path / "frame.parquet", pd.DataFrame(rows), schema)
    write_parquet(tmp_path / "rows.parquet", rows, schema, dictionary=False)
    write_parquet(tmp_path / "columns.parquet", columns, schema)
    expected = pq.read_table(tmp_path / "frame.parquet")
    assert expected["loss"].null_count == 1
    for name in ("rows", "columns"):
        table = pq.read_table(tmp_path / f"{name}.parquet")
        assert table.schema.equals(expected.schema, check_metadata=False)
        assert table.equals(expected.replace_schema_metadata(table.schema.metadata))
    with pytest.raises(KeyError, match="note"):
        write_parquet(tmp_path / "missing.parquet", [{k: v for k, v in rows[0].items() if k != "note"}], schema)
    assert not (tmp_path / "missing.parquet").exists()
    # A column the schema lacks is an error too, not a column dropped unseen.
    for extra in ([rows[0] | {"novel": 1}], columns | {"novel": [1, 2]}):
        with pytest.raises(KeyError, match=r"extra.parquet.*\['novel'\] are not in its schema"):
            write_parquet(tmp_path / "extra.parquet", extra, schema)
    assert not (tmp_path / "extra.parquet").exists()


def test_a_column_of_distinct_values_is_not_held_in_a_large_dictionary_and_repeated_values_keep_theirs(tmp_path):
    """Arrow builds a column's dictionary up to 1 MiB before it falls back to plain values: for a prepared
    set's real-valued features that was most of the time of writing it. Dictionaries stop at
    DICTIONARY_PAGE_BYTES; columns of few values (one-hot features, labels) keep theirs."""
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    from ldpbench.atomic import DICTIONARY_PAGE_BYTES, write_parquet

    rows = 60_000
    generator = np.random.default_rng(0)
    frame = pd.DataFrame({"feature": generator.standard_normal(rows).astype(np.float32),
                          "one_hot": generator.integers(0, 2, rows).astype(np.float32),
                          "label": generator.integers(0, 2, rows)})
    write_parquet(tmp_path / "data.parquet", frame)
    group = pq.ParquetFile(tmp_path / "data.parquet").metadata.row_group(0)
    dictionary_bytes = {}
    for index in range(group.num_columns):
        column = group.column(index)
        dictionary_bytes[column.path_in_schema] = (column.data_page_offset - column.dictionary_page_offset
                                                   if column.has_dictionary_page else 0)
    assert 0 < dictionary_bytes["feature"] <= 2 * DICTIONARY_PAGE_BYTES
    assert dictionary_bytes["one_hot"] > 0 and dictionary_bytes["label"] > 0
    assert pd.read_parquet(tmp_path / "data.parquet").equals(frame)
