"""Train/test splits keyed by the run seed: a hold-out split or one fold of K-fold cross-validation."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import numpy as np

from ldpbench.rng import derive_seed


def train_test_indices(
    records: int, seed: int, folds: int = 0, fold: int = 0, test_fraction: float = 0.2
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test). folds = 0: hold-out with `test_fraction`; folds ≥ 2: fold `fold` is the test set.

    The permutation depends only on (seed, records), so the K folds of one seed partition the data.
    """
    order = np.random.default_rng(derive_seed("split", seed, records)).permutation(records)
    if folds == 0:
        test_size = int(round(test_fraction * records))
        if not 0 < test_size < records:
            raise ValueError(f"test_fraction {test_fraction} leaves an empty train or test set")
        return np.sort(order[test_size:]), np.sort(order[:test_size])
    if folds < 2 or not 0 <= fold < folds:
        raise ValueError(f"fold {fold} of {folds} folds is not valid")
    parts = np.array_split(order, folds)
    test = parts[fold]
    train = np.concatenate([p for i, p in enumerate(parts) if i != fold])
    return np.sort(train), np.sort(test)


def public_indices(records: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(public, rest): a share of the records declared public, the same for every seed and fold.

    Keyed by the record count alone, so every run of a campaign sets aside the same records.
    """
    size = int(round(fraction * records))
    if not 0 < size < records:
        raise ValueError(f"split.public_fraction {fraction} leaves {size} of {records} records public; "
                         "at least one must be public and one private")
    order = np.random.default_rng(derive_seed("public part", records)).permutation(records)
    return np.sort(order[:size]), np.sort(order[size:])


def run_indices(records: int, seed: int, folds: int, fold: int, test_fraction: float,
                public_fraction: float = 0.0, data_part: str = "private") -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test) of one run: its split of the private records, or the public records
    (data_part "public", no test split). Without a public part, exactly `train_test_indices`."""
    if public_fraction == 0:
        return train_test_indices(records, seed, folds, fold, test_fraction)
    public, private = public_indices(records, public_fraction)
    if data_part == "public":
        return public, np.empty(0, dtype=public.dtype)
    train, test = train_test_indices(len(private), seed, folds, fold, test_fraction)
    return private[train], private[test]


def split_digest(data_digests: Mapping[str, str], indices: np.ndarray) -> str | None:
    """Which records of which data a split holds: the first 16 hex digits of the sha256 of the data
    files' digests (meta.json's records) and of the split's record indices, sorted (int64, little
    endian); None for an empty split. Two runs share a digest exactly when they saw the same records."""
    if len(indices) == 0:
        return None
    hasher = hashlib.sha256(json.dumps(dict(sorted(data_digests.items()))).encode())
    hasher.update(np.sort(np.asarray(indices, dtype="<i8")).tobytes())
    return hasher.hexdigest()[:16]
