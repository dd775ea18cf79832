"""Atomic file writes: write to a temporary file in the target directory, then rename.

A reader (or Snakemake after a crash) therefore sees either the previous file or the complete new
one, never a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to `target`; rename it onto `target` if the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp creates mode 0600; give the result the mode a plain open() would (umask applied),
        # so collaborators on a shared file system can read it.
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_text(target: str | os.PathLike[str], text: str) -> None:
    write_bytes(target, text.encode("utf-8"))


def write_json(target: str | os.PathLike[str], obj: Any) -> None:
    write_text(target, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


def _check_names(target: str | os.PathLike[str], names: Any, schema: Any) -> None:
    """KeyError naming the file and the columns when rows or columns hold one its schema does not declare
    (such a column would otherwise be dropped unseen; a missing one fails on its lookup)."""
    undeclared = sorted(set(names) - set(schema.names))
    if undeclared:
        raise KeyError(f"'{target}': columns {undeclared} are not in its schema")


# A column's dictionary page is kept to this size: a column of repeated values (one-hot features, labels,
# names) keeps its dictionary, and one of distinct values (real-valued features) turns to plain encoding
# as soon as it fills the page, instead of after arrow's default 1 MiB, which took most of the time of
# writing a prepared synthetic set (and made its file half as large again).
DICTIONARY_PAGE_BYTES = 16 * 1024


def write_parquet(target: str | os.PathLike[str], frame: Any, schema: Any = None, dictionary: bool = True) -> None:
    """Write a table to Parquet atomically: a pandas DataFrame (cast to the Arrow `schema` when given),
    or, with a `schema`, rows (a list of dicts) or columns (a dict of sequences) holding each of its
    fields and no other (a KeyError names the column). The last two skip pandas' conversion, most of the
    cost of writing a run's small files. `dictionary=False` encodes every column plainly, for files whose
    values do not repeat (a ledger's 48,000 clients: a third of the time, and a smaller file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(frame, (list, dict)):
        _check_names(target, {name for row in frame for name in row} if isinstance(frame, list) else frame, schema)
    if isinstance(frame, list):  # rows
        frame = {name: [row[name] for row in frame] for name in schema.names}
    if isinstance(frame, dict):  # columns; from_pandas=True writes NaN as null, as pandas' conversion does
        table = pa.Table.from_arrays([pa.array(frame[field.name], field.type, from_pandas=True)
                                      for field in schema], schema=schema)
    else:
        table = pa.Table.from_pandas(frame if schema is None else frame[schema.names], schema=schema,
                                     preserve_index=False)
    with atomic_path(target) as tmp:
        pq.write_table(table, tmp, use_dictionary=dictionary, dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES)
