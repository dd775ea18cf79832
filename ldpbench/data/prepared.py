"""The prepared form of every dataset, in one of two formats, each with a metadata JSON.

* tabular: `data.parquet` (feature columns + `label`) and `meta.json`;
* arrays (images, text, token ids, embeddings; memory-mappable): `features.npy` ([n, ...]: uint8
  images [n, H, W] or [n, C, H, W], int64 token ids [n, L], float32 embeddings [n, d], or UTF-8
  text as fixed-width bytes `|S<w>` [n]), `labels.npy` (int64 [n]; [n, k] 0/1 for multi-label
  sets), optional `clients.npy` (int64 [n], the natural user/writer/role id), optional
  `official_test.npy` (bool [n], True for records of the official test split) and `meta.json`.

`meta.json` is written last in both formats: its presence marks a complete preparation, and it is
the file the workflow tracks. It records the sha256 and size of every data file (`files`), and
`load_arrays` (which reads either format) checks each file it reads against them. A damaged
directory is refused naming the file, and its `meta.json` is moved aside to `meta.json.damaged`,
so that the workflow's next run prepares (or extracts) it again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd

from ldpbench.atomic import atomic_path, write_json, write_parquet
from ldpbench.data.download import sha256_of
from ldpbench.errors import DatasetCorrupt, DatasetUnavailable

log = logging.getLogger("ldpbench")

LABEL_COLUMN = "label"
DATA_FILE = "data.parquet"
META_FILE = "meta.json"
FEATURES_FILE = "features.npy"
LABELS_FILE = "labels.npy"
CLIENTS_FILE = "clients.npy"
OFFICIAL_TEST_FILE = "official_test.npy"
ARRAY_FILES = (FEATURES_FILE, LABELS_FILE, CLIENTS_FILE, OFFICIAL_TEST_FILE)
DAMAGED_SUFFIX = ".damaged"  # meta.json of a damaged directory is renamed meta.json.damaged
KINDS = ("image", "text", "tokens", "embedding")


@dataclass(frozen=True)
class PreparedDataset:
    """Features [n, d] float32 and integer class labels [n]."""

    features: np.ndarray
    labels: np.ndarray
    feature_names: tuple[str, ...]
    classes: tuple[str, ...]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, d = self.features.shape
        if self.labels.shape != (n,):
            raise ValueError(f"labels have shape {self.labels.shape}, expected ({n},)")
        if len(self.feature_names) != d:
            raise ValueError(f"{len(self.feature_names)} feature names for {d} features")


def save_prepared(dataset: PreparedDataset, out_dir: str | Path, name: str) -> None:
    out_dir = Path(out_dir)
    for stale in (META_FILE, *ARRAY_FILES):  # an earlier array-format preparation
        (out_dir / stale).unlink(missing_ok=True)
    frame = pd.DataFrame(dataset.features.astype(np.float32), columns=list(dataset.feature_names))
    frame[LABEL_COLUMN] = dataset.labels.astype(np.int64)
    write_parquet(out_dir / DATA_FILE, frame)
    n, d = dataset.features.shape
    meta = {
        "name": name,
        "n": int(n),
        "d": int(d),
        "classes": list(dataset.classes),
        "class_counts": np.bincount(dataset.labels, minlength=len(dataset.classes)).tolist(),
        "feature_names": list(dataset.feature_names),
        "data_sha256": sha256_of(out_dir / DATA_FILE),
        "files": {DATA_FILE: _file_record(out_dir / DATA_FILE)},
        **dataset.info,
    }
    # The metadata is written last: its presence marks a complete preparation.
    write_json(out_dir / META_FILE, meta)


def load_prepared(prepared_dir: str | Path, move_aside: bool = True
                  ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Return (features float32 [n, d], labels int64 [n], metadata) of a prepared tabular dataset.

    data.parquet is checked against its digest in meta.json first (see `load_arrays`).
    """
    prepared_dir = Path(prepared_dir)
    meta = read_meta(prepared_dir, move_aside)
    with _moved_aside_when_damaged(prepared_dir, move_aside):
        path = verified_file(prepared_dir, DATA_FILE, meta)
        frame = pd.read_parquet(path)
        names = meta["feature_names"]
        missing = [column for column in [*names, LABEL_COLUMN] if column not in frame.columns]
        if missing:
            raise DatasetCorrupt(f"'{path}' lacks columns {missing[:5]}")
        features = frame[names].to_numpy(dtype=np.float32, copy=True)
        labels = frame[LABEL_COLUMN].to_numpy(dtype=np.int64, copy=True)
        if features.shape != (meta["n"], meta["d"]):
            raise DatasetCorrupt(f"'{path}' holds {features.shape}, metadata says ({meta['n']}, {meta['d']})")
        _check_labels(labels, meta, path)
    return features, labels, meta


# ------------------------------------------------------------------------------ verification
def _file_record(path: Path) -> dict[str, Any]:
    """What meta.json records of a data file: its sha256 and size."""
    return {"sha256": sha256_of(path), "bytes": path.stat().st_size}


# (resolved path, inode, size, mtime_ns) -> sha256: a file is hashed once per process while unchanged.
_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def cached_sha256(path: Path) -> str:
    status = path.stat()
    key = (str(path.resolve()), status.st_ino, status.st_size, status.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_of(path)
    return _DIGESTS[key]


def _recorded(meta: dict[str, Any], file_name: str) -> dict[str, Any] | None:
    """The digest (and size) meta.json records for `file_name`, or None if it lists no such file."""
    record = meta.get("files", {}).get(file_name)
    if record is None and file_name == DATA_FILE and "data_sha256" in meta:
        record = {"sha256": meta["data_sha256"]}  # written before sizes were recorded
    return record if isinstance(record, dict) and isinstance(record.get("sha256"), str) else None


def recorded_digests(meta: dict[str, Any]) -> dict[str, str]:
    """Every data file meta.json records, with its sha256, by name (the older single record too)."""
    names = sorted(set(meta.get("files") or {}) | ({DATA_FILE} if "data_sha256" in meta else set()))
    return {name: record["sha256"] for name in names if (record := _recorded(meta, name)) is not None}


def verified_file(prepared_dir: Path, file_name: str, meta: dict[str, Any]) -> Path:
    """The path of a data file listed in meta.json, once its size and sha256 match the record."""
    path = prepared_dir / file_name
    meta_path = prepared_dir / META_FILE
    record = _recorded(meta, file_name)
    if record is None:
        raise DatasetCorrupt(f"'{meta_path}' records no digest of '{file_name}', so '{path}' cannot be "
                             "verified")
    if not path.is_file():
        raise DatasetCorrupt(f"prepared data file '{path}' is missing (listed in '{meta_path}')")
    size = path.stat().st_size
    if "bytes" in record and size != record["bytes"]:
        raise DatasetCorrupt(f"prepared data file '{path}' holds {size} bytes, '{meta_path}' records "
                             f"{record['bytes']} (truncated or overwritten)")
    actual = cached_sha256(path)
    if actual != record["sha256"]:
        raise DatasetCorrupt(f"prepared data file '{path}' has sha256 {actual}, '{meta_path}' records "
                             f"{record['sha256']} (damaged or modified since it was prepared)")
    return path


def _move_meta_aside(prepared_dir: Path) -> str:
    """Rename meta.json to meta.json.damaged; say what that means for the next workflow run."""
    meta_path = prepared_dir / META_FILE
    aside = meta_path.with_name(META_FILE + DAMAGED_SUFFIX)
    try:
        os.replace(meta_path, aside)
    except FileNotFoundError:  # a concurrent job found the damage first
        pass
    except OSError as error:
        return (f"; moving '{meta_path}' aside failed ({error}): delete '{prepared_dir}' so that the "
                "next `snakemake` run rebuilds it")
    return (f"; '{meta_path}' was moved aside to '{aside.name}', so the next `snakemake` run rebuilds "
            "this directory (prepares or extracts it again)")


@contextlib.contextmanager
def _moved_aside_when_damaged(prepared_dir: Path, enabled: bool = True) -> Iterator[None]:
    """Re-raise DatasetCorrupt with meta.json moved aside, so that the workflow redoes the directory."""
    try:
        yield
    except DatasetCorrupt as error:
        if not enabled:
            raise
        raise DatasetCorrupt(f"{error}{_move_meta_aside(prepared_dir)}") from None


# ------------------------------------------------------------------------------ array format
@dataclass(frozen=True)
class ArrayDataset:
    """A dataset in the array format, before it is written (see the module docstring)."""

    features: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    kind: str  # one of KINDS
    clients: np.ndarray | None = None
    official_test: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.features)
        if self.kind not in KINDS:
            raise ValueError(f"kind '{self.kind}' is not one of {KINDS}")
        if self.labels.shape[:1] != (n,) or self.labels.ndim not in (1, 2):
            raise ValueError(f"labels have shape {self.labels.shape}, expected ({n},) or ({n}, k)")
        for name, array in (("clients", self.clients), ("official_test", self.official_test)):
            if array is not None and array.shape != (n,):
                raise ValueError(f"{name} have shape {array.shape}, expected ({n},)")


def _save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)


def _class_counts(labels: np.ndarray, classes: tuple[str, ...]) -> list[int]:
    if labels.ndim == 2:  # multi-label: positives per class
        return labels.sum(axis=0).astype(int).tolist()
    return np.bincount(labels, minlength=len(classes)).tolist()


def save_arrays(dataset: ArrayDataset, out_dir: str | Path, name: str) -> dict[str, Any]:
    """Write the array format (every file atomically, meta.json last); return the metadata."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILE).unlink(missing_ok=True)  # incomplete until the new metadata is written
    (out_dir / DATA_FILE).unlink(missing_ok=True)  # a stale tabular preparation
    arrays = {
        FEATURES_FILE: dataset.features,
        LABELS_FILE: dataset.labels.astype(np.int64),
        CLIENTS_FILE: None if dataset.clients is None else dataset.clients.astype(np.int64),
        OFFICIAL_TEST_FILE: None if dataset.official_test is None else dataset.official_test.astype(bool),
    }
    files = {}
    for file_name, array in arrays.items():
        if array is None:
            (out_dir / file_name).unlink(missing_ok=True)
            continue
        _save_npy(out_dir / file_name, array)
        files[file_name] = _file_record(out_dir / file_name)
    features = dataset.features
    meta = {
        "name": name,
        "format": "arrays",
        "kind": dataset.kind,
        "n": int(len(features)),
        "shape": list(features.shape[1:]),
        "dtype": features.dtype.str,
        "classes": list(dataset.classes),
        "task": "multilabel" if dataset.labels.ndim == 2 else "multiclass",
        "class_counts": _class_counts(dataset.labels, dataset.classes),
        "n_clients": None if dataset.clients is None else int(len(np.unique(dataset.clients))),
        "n_official_test": None if dataset.official_test is None else int(dataset.official_test.sum()),
        "files": files,
        **dataset.info,
    }
    write_json(out_dir / META_FILE, meta)
    return meta


@dataclass(frozen=True)
class PreparedArrays:
    features: np.ndarray  # [n, *shape]
    labels: np.ndarray  # [n] int64 ([n, k] 0/1 for multi-label sets)
    clients: np.ndarray | None  # [n] int64 natural client ids, when the dataset has them
    official_test: np.ndarray | None  # [n] bool, when the dataset ships an official split
    meta: dict


# Keys a run or the feature extraction reads, per format.
_REQUIRED_KEYS = {"arrays": ("n", "shape", "classes", "files"),
                  "tabular": ("n", "d", "classes", "feature_names")}


def read_meta(prepared_dir: str | Path, move_aside: bool = True) -> dict[str, Any]:
    """meta.json of a prepared directory; DatasetCorrupt naming it (moved aside) when it is damaged."""
    prepared_dir = Path(prepared_dir)
    meta_path = prepared_dir / META_FILE
    if not meta_path.exists():
        raise DatasetUnavailable(f"prepared dataset metadata '{meta_path}' does not exist")
    with _moved_aside_when_damaged(prepared_dir, move_aside):
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise DatasetCorrupt(f"prepared dataset metadata '{meta_path}' is not valid JSON "
                                 f"(truncated or damaged): {error}") from None
        if not isinstance(meta, dict):
            raise DatasetCorrupt(f"prepared dataset metadata '{meta_path}' is not a JSON object")
        required = _REQUIRED_KEYS["arrays" if meta.get("format") == "arrays" else "tabular"]
        missing = [key for key in required if key not in meta]
        if missing or not isinstance(meta.get("files", {}), dict):
            raise DatasetCorrupt(f"prepared dataset metadata '{meta_path}' lacks the keys {missing} or its "
                                 f"'files' is not an object (expected the keys {list(required)})")
    return meta


def load_arrays(prepared_dir: str | Path, mmap: bool = True, move_aside: bool = True) -> PreparedArrays:
    """Either prepared format as arrays; array files are memory-mapped (read-only) when `mmap`.

    Every file read is first checked against the size and sha256 meta.json records (each file is
    hashed once per process while its size and mtime stay the same). A damaged file raises
    DatasetCorrupt naming it, and meta.json is moved aside so that the workflow redoes the directory.
    Tabular (Parquet) datasets give float32 features [n, d] and clients/official_test None.
    With `move_aside=False` a damaged directory only raises (the warm worker's check leaves moving
    it aside to the job). In a process forked by the fork server, the first in-memory load of a
    directory the server holds (see `warm`) takes the server's verified copy instead of reading the
    files again.
    """
    prepared_dir = Path(prepared_dir)
    if not mmap:
        held = _take_warm_copy(prepared_dir)
        if held is not None:
            return held
    meta = read_meta(prepared_dir, move_aside)
    if meta.get("format") != "arrays":
        features, labels, meta = load_prepared(prepared_dir, move_aside)
        return PreparedArrays(features, labels, None, None, meta)
    mode = "r" if mmap else None

    def load(file_name: str, required: bool) -> np.ndarray | None:
        # Only files meta.json lists are read: an unlisted stray file has no digest to check.
        if not required and file_name not in meta["files"]:
            return None
        path = verified_file(prepared_dir, file_name, meta)
        array = np.load(path, mmap_mode=mode, allow_pickle=False)
        if len(array) != meta["n"]:
            raise DatasetCorrupt(f"'{path}' holds {len(array)} records, metadata says {meta['n']}")
        return array

    with _moved_aside_when_damaged(prepared_dir, move_aside):
        features = load(FEATURES_FILE, True)
        if list(features.shape[1:]) != meta["shape"]:
            raise DatasetCorrupt(f"'{prepared_dir / FEATURES_FILE}' has shape {features.shape}, metadata "
                                 f"says [n, {meta['shape']}]")
        labels = load(LABELS_FILE, True)
        _check_labels(labels, meta, prepared_dir / LABELS_FILE)
        return PreparedArrays(features, labels, load(CLIENTS_FILE, False), load(OFFICIAL_TEST_FILE, False),
                              meta)


# ------------------------------------------------------------------------------ warm copies
# The fork server (ldpbench.launch.fork_server) forks every job of a local campaign; each cell's job
# hashed and decoded its dataset again (a fraction of a second for a small Parquet file in a fresh
# process; image arrays and feature caches cost more), the same bytes for every cell. The server holds
# each dataset once (`warm`) and the processes it forks take that copy: fork gives each its own
# copy-on-write memory, so nothing a job does to the arrays reaches the server or another job, and a
# process takes the copy once (a second load in it reads the files), so two users in one process never
# share arrays. A copy is used only while every file of the directory keeps the inode, size and
# modification time it had when it was loaded and verified.
WARM_LIMIT_BYTES = 2 << 30  # the most array memory a server holds; datasets beyond it load as usual
HeldCopy = tuple[tuple, PreparedArrays]  # the directory's stamp (_directory_stamp) and its arrays
_WARM: dict[str, HeldCopy] = {}
_ARRAY_FIELDS = ("features", "labels", "clients", "official_test")


def _directory_stamp(prepared_dir: Path) -> tuple:
    """Each file of the directory by name, inode, size and modification time."""
    stamp = []
    for entry in os.scandir(prepared_dir):
        if entry.is_file():
            status = entry.stat()
            stamp.append((entry.name, status.st_ino, status.st_size, status.st_mtime_ns))
    return tuple(sorted(stamp))


def _array_bytes(arrays: PreparedArrays) -> int:
    return sum(a.nbytes for a in (arrays.features, arrays.labels, arrays.clients, arrays.official_test)
               if a is not None)


def warm(prepared_dir: str | Path, read: Callable[[Path], HeldCopy | None] | None = None) -> bool:
    """Load and verify a prepared dataset in memory for the processes this one forks (the fork
    server). True when a copy is held; False when it is not (over WARM_LIMIT_BYTES, missing, damaged
    or changed while read: the job that loads it then reports that, as it would have).

    `read` reads the copy (default `read_copy`, in this process); the fork server reads it in a
    throwaway child, as reading Parquet starts Arrow's thread pools, and the server forks only while it
    runs a single thread.
    """
    prepared_dir = Path(prepared_dir).resolve()
    key = str(prepared_dir)
    try:
        stamp = _directory_stamp(prepared_dir)
    except OSError:
        return False
    if key in _WARM and _WARM[key][0] == stamp:
        return True
    _WARM.pop(key, None)
    copy = (read or read_copy)(prepared_dir)
    if copy is None or copy[0] != stamp:  # missing, damaged, or rewritten since the stamp above
        return False
    if _array_bytes(copy[1]) + sum(_array_bytes(held) for _, held in _WARM.values()) > WARM_LIMIT_BYTES:
        return False
    _WARM[key] = copy
    return True


def read_copy(prepared_dir: Path) -> HeldCopy | None:
    """`prepared_dir` read and verified in memory, with the stamp its files kept while it was read; None
    where it is missing, damaged or was rewritten meanwhile (moving a damaged one aside is its job's)."""
    try:
        stamp = _directory_stamp(prepared_dir)
        arrays = load_arrays(prepared_dir, mmap=False, move_aside=False)
        if _directory_stamp(prepared_dir) != stamp:
            return None
    except (OSError, DatasetCorrupt, DatasetUnavailable, ValueError, KeyError):
        return None
    return stamp, arrays


def save_copy(copy: HeldCopy, out: BinaryIO) -> None:
    """Write a held copy to `out` (read back by `load_copy`): a length-prefixed JSON header with the
    stamp and metadata, then each array in .npy format, which keeps its dtype, shape and memory order."""
    stamp, arrays = copy
    present = [name for name in _ARRAY_FIELDS if getattr(arrays, name) is not None]
    header = json.dumps({"stamp": stamp, "meta": arrays.meta, "arrays": present}).encode()
    out.write(len(header).to_bytes(8, "little"))
    out.write(header)
    for name in present:
        np.lib.format.write_array(out, getattr(arrays, name), allow_pickle=False)


def load_copy(source: BinaryIO) -> HeldCopy:
    """A held copy that `save_copy` wrote, its arrays in this process's memory."""
    header = json.loads(source.read(int.from_bytes(source.read(8), "little")))
    arrays = {name: np.lib.format.read_array(source, allow_pickle=False) for name in header["arrays"]}
    stamp = tuple(tuple(entry) for entry in header["stamp"])
    return stamp, PreparedArrays(arrays["features"], arrays["labels"], arrays.get("clients"),
                                 arrays.get("official_test"), header["meta"])


def _take_warm_copy(prepared_dir: Path) -> PreparedArrays | None:
    if not _WARM:
        return None
    try:
        held = _WARM.pop(str(prepared_dir.resolve()), None)
        if held is None or held[0] != _directory_stamp(prepared_dir):
            return None
    except OSError:
        return None
    log.info("%s: in memory from the warm worker (read and verified there, files unchanged since)", prepared_dir)
    return held[1]


def _check_labels(labels: np.ndarray, meta: dict[str, Any], path: Path) -> None:
    """Labels must index meta.json's classes (meta.json itself has no digest: it holds them)."""
    classes = len(meta["classes"])
    meta_path = path.with_name(META_FILE)
    if labels.ndim == 2 and labels.shape[1] != classes:
        raise DatasetCorrupt(f"'{path}' has {labels.shape[1]} label columns, '{meta_path}' lists "
                             f"{classes} classes")
    if labels.ndim == 1 and len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise DatasetCorrupt(f"'{path}' has labels in [{labels.min()}, {labels.max()}], '{meta_path}' lists "
                             f"{classes} classes")


def decode_texts(features: np.ndarray) -> list[str]:
    """UTF-8 texts of a text dataset's features (fixed-width bytes)."""
    return [bytes(item).decode("utf-8") for item in features]


def encode_texts(texts: list[str]) -> np.ndarray:
    """Texts as a fixed-width UTF-8 bytes array (memory-mappable, no pickle)."""
    encoded = [text.encode("utf-8") for text in texts]
    if any(b"\x00" in item for item in encoded):
        raise ValueError("texts must not contain NUL characters")
    return np.array(encoded, dtype=f"S{max((len(e) for e in encoded), default=1) or 1}")
