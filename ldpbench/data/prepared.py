"""The prepared form of every dataset, in one of two formats, each with a metadata JSON.

* tabular: `data.parquet` (feature columns + `label`) and `meta.json`;
* arrays (images, text, token ids, embeddings; memory-mappable): `features.npy` ([n, ...]: uint8
  images [n, H, W] or [n, C, H, W], int64 token ids [n, L], float32 embeddings [n, d], or UTF-8
  text as fixed-width bytes `|S<w>` [n]), `labels.npy` (int64 [n]; [n, k] 0/1 for multi-label
  sets), optional `clients.npy` (int64 [n], the natural user/writer/role id), optional
  `official_test.npy` (bool [n], True for records of the official test split) and `meta.json`.

`meta.json` is written last in both formats: its presence marks a complete preparation, and it is
the file the workflow tracks. `load_arrays` reads either format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ldpbench.atomic import atomic_path, write_json, write_parquet
from ldpbench.data.download import sha256_of

LABEL_COLUMN = "label"
DATA_FILE = "data.parquet"
META_FILE = "meta.json"
FEATURES_FILE = "features.npy"
LABELS_FILE = "labels.npy"
CLIENTS_FILE = "clients.npy"
OFFICIAL_TEST_FILE = "official_test.npy"
ARRAY_FILES = (FEATURES_FILE, LABELS_FILE, CLIENTS_FILE, OFFICIAL_TEST_FILE)
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
        **dataset.info,
    }
    # The metadata is written last: its presence marks a complete preparation.
    write_json(out_dir / META_FILE, meta)


def load_prepared(prepared_dir: str | Path) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Return (features float32 [n, d], labels int64 [n], metadata) of a prepared dataset."""
    prepared_dir = Path(prepared_dir)
    meta_path = prepared_dir / META_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"prepared dataset metadata '{meta_path}' does not exist")
    meta = json.loads(meta_path.read_text())
    frame = pd.read_parquet(prepared_dir / DATA_FILE)
    names = meta["feature_names"]
    missing = [column for column in [*names, LABEL_COLUMN] if column not in frame.columns]
    if missing:
        raise ValueError(f"'{prepared_dir / DATA_FILE}' lacks columns {missing[:5]}")
    features = frame[names].to_numpy(dtype=np.float32, copy=True)
    labels = frame[LABEL_COLUMN].to_numpy(dtype=np.int64, copy=True)
    if features.shape != (meta["n"], meta["d"]):
        raise ValueError(
            f"'{prepared_dir / DATA_FILE}' holds {features.shape}, metadata says "
            f"({meta['n']}, {meta['d']})"
        )
    return features, labels, meta


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
        files[file_name] = {"sha256": sha256_of(out_dir / file_name), "bytes": (out_dir / file_name).stat().st_size}
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


def read_meta(prepared_dir: str | Path) -> dict[str, Any]:
    meta_path = Path(prepared_dir) / META_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"prepared dataset metadata '{meta_path}' does not exist")
    return json.loads(meta_path.read_text())


def load_arrays(prepared_dir: str | Path, mmap: bool = True) -> PreparedArrays:
    """Either prepared format as arrays; array files are memory-mapped (read-only) when `mmap`.

    Tabular (Parquet) datasets give float32 features [n, d] and clients/official_test None.
    """
    prepared_dir = Path(prepared_dir)
    meta = read_meta(prepared_dir)
    if meta.get("format") != "arrays":
        features, labels, meta = load_prepared(prepared_dir)
        return PreparedArrays(features, labels, None, None, meta)
    mode = "r" if mmap else None

    def load(file_name: str, required: bool) -> np.ndarray | None:
        path = prepared_dir / file_name
        if not path.exists():
            if required or file_name in meta.get("files", {}):
                raise FileNotFoundError(f"prepared dataset file '{path}' is missing")
            return None
        array = np.load(path, mmap_mode=mode, allow_pickle=False)
        if len(array) != meta["n"]:
            raise ValueError(f"'{path}' holds {len(array)} records, metadata says {meta['n']}")
        return array

    features = load(FEATURES_FILE, True)
    if list(features.shape[1:]) != meta["shape"]:
        raise ValueError(f"'{prepared_dir / FEATURES_FILE}' has shape {features.shape}, metadata "
                         f"says [n, {meta['shape']}]")
    return PreparedArrays(features, load(LABELS_FILE, True), load(CLIENTS_FILE, False),
                          load(OFFICIAL_TEST_FILE, False), meta)


def decode_texts(features: np.ndarray) -> list[str]:
    """UTF-8 texts of a text dataset's features (fixed-width bytes)."""
    return [bytes(item).decode("utf-8") for item in features]


def encode_texts(texts: list[str]) -> np.ndarray:
    """Texts as a fixed-width UTF-8 bytes array (memory-mappable, no pickle)."""
    encoded = [text.encode("utf-8") for text in texts]
    if any(b"\x00" in item for item in encoded):
        raise ValueError("texts must not contain NUL characters")
    return np.array(encoded, dtype=f"S{max((len(e) for e in encoded), default=1) or 1}")
