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
