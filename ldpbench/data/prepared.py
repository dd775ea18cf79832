"""The prepared form of every dataset: a Parquet table plus a small metadata JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ldpbench.atomic import write_json, write_parquet
from ldpbench.data.download import sha256_of

LABEL_COLUMN = "label"
DATA_FILE = "data.parquet"
META_FILE = "meta.json"


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
