"""Warm copies of prepared datasets (data.prepared.warm): what the warm worker holds for the jobs it
forks is taken once per process, only while the files are unchanged, and never for a damaged
directory."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from ldpbench.data import prepared
from ldpbench.errors import DatasetCorrupt


@pytest.fixture
def copy_of(syn_s, tmp_path):
    directory = tmp_path / "syn-S"
    shutil.copytree(syn_s, directory)
    yield directory
    prepared._WARM.clear()


def test_a_held_dataset_is_taken_once_and_equals_a_fresh_read(copy_of):
    fresh = prepared.load_arrays(copy_of, mmap=False)
    assert prepared.warm(copy_of)
    held = prepared._WARM[str(copy_of.resolve())][1]
    taken = prepared.load_arrays(copy_of, mmap=False)
    assert taken is held  # the worker's copy, not a second read
    np.testing.assert_array_equal(taken.features, fresh.features)
    np.testing.assert_array_equal(taken.labels, fresh.labels)
    assert taken.meta == fresh.meta
    again = prepared.load_arrays(copy_of, mmap=False)
    assert again is not held  # a second user in the same process reads its own arrays
    np.testing.assert_array_equal(again.features, fresh.features)


def test_a_copy_is_not_taken_once_a_file_of_the_directory_changed(copy_of):
    assert prepared.warm(copy_of)
    data = copy_of / prepared.DATA_FILE
    status = data.stat()
    os.utime(data, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))  # rewritten, as far as we know
    taken = prepared.load_arrays(copy_of, mmap=False)
    assert taken is not None and str(copy_of.resolve()) not in prepared._WARM
    assert prepared.warm(copy_of)  # held again, as the files are now
    stray = copy_of / "extra.npy"
    np.save(stray, np.zeros(3))
    assert prepared._take_warm_copy(copy_of) is None  # a new file in the directory counts as a change


def test_a_damaged_dataset_is_not_held_and_its_job_still_reports_it(copy_of):
    data = copy_of / prepared.DATA_FILE
    data.write_bytes(data.read_bytes()[:-100])
    assert not prepared.warm(copy_of)  # no exception in the worker
    assert not prepared._WARM
    assert (copy_of / prepared.META_FILE).exists()  # moving it aside is the job's, whose log names the damage
    with pytest.raises(DatasetCorrupt, match="data.parquet"):
        prepared.load_arrays(copy_of, mmap=False)


def test_memory_mapped_loads_and_datasets_over_the_limit_are_not_served(copy_of, monkeypatch):
    assert prepared.warm(copy_of)
    assert prepared.load_arrays(copy_of, mmap=True) is not prepared._WARM[str(copy_of.resolve())][1]
    prepared._WARM.clear()
    monkeypatch.setattr(prepared, "WARM_LIMIT_BYTES", 1000)
    assert not prepared.warm(copy_of) and not prepared._WARM


def test_a_copy_passed_through_a_file_keeps_its_arrays_types_and_memory_order(copy_of, tmp_path):
    """The fork server reads a copy in a child, which passes it back through a file (save_copy,
    load_copy): the same values, dtypes, shapes and memory order (torch's kernels may follow strides)."""
    stamp, arrays = prepared.read_copy(copy_of)
    fortran = prepared.PreparedArrays(np.asfortranarray(arrays.features), arrays.labels, None,
                                      np.arange(len(arrays.labels)) % 2 == 0, arrays.meta)
    for original in (arrays, fortran):
        with open(tmp_path / "copy", "w+b") as file:
            prepared.save_copy((stamp, original), file)
            file.seek(0)
            loaded_stamp, loaded = prepared.load_copy(file)
        assert loaded_stamp == stamp and loaded.meta == original.meta
        for name in ("features", "labels", "clients", "official_test"):
            before, after = getattr(original, name), getattr(loaded, name)
            if before is None:
                assert after is None, name
                continue
            np.testing.assert_array_equal(after, before)
            assert (after.dtype, after.shape, after.flags.c_contiguous, after.flags.f_contiguous) == (
                before.dtype, before.shape, before.flags.c_contiguous, before.flags.f_contiguous), name
            assert after.flags.writeable, name
    assert prepared.warm(copy_of, read=lambda directory: (stamp, loaded))
    assert prepared.load_arrays(copy_of, mmap=False) is loaded


def test_a_copy_read_from_files_that_changed_meanwhile_is_not_held(copy_of):
    stamp, arrays = prepared.read_copy(copy_of)
    changed = ((*stamp[0][:3], stamp[0][3] + 1), *stamp[1:])  # one file's mtime moved since the stamp
    assert not prepared.warm(copy_of, read=lambda directory: (changed, arrays))
    assert not prepared._WARM
