"""LEAF's json files (FEMNIST, Shakespeare), as LEAF's own preprocessing writes them.

LEAF does not host its json: `./preprocess.sh` in LEAF's data/femnist or data/shakespeare builds
it from the raw sources (NIST SD19 by_class.zip/by_write.zip; Project Gutenberg's complete works).
Put the output directory under `data/raw/<dir>/`: either `train/*.json` and `test/*.json` (LEAF's
split, kept as the official split) or `all_data/*.json` (no split). Every file is
{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}};
counts are checked against `num_samples`, and the sha256 of every file is kept in the metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ldpbench.data.download import sha256_of
from ldpbench.data.prepared import ArrayDataset
from ldpbench.data.text import SEQUENCE_LENGTH, tokens_dataset
from ldpbench.errors import DatasetCorrupt, DatasetUnavailable

FEMNIST_CLASSES = tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
LAYOUT = """\
expected LEAF's json output (from LEAF's data/<name>/preprocess.sh) in '{root}': either
train/*.json and test/*.json, or all_data/*.json"""


def leaf_files(root: Path) -> list[tuple[str | None, Path]]:
    """(split or None, json file) in a deterministic order."""
    if (root / "train").is_dir() and (root / "test").is_dir():
        found = [(s, f) for s in ("train", "test") for f in sorted((root / s).glob("*.json"))]
    else:
        found = [(None, f) for f in sorted((root / "all_data").glob("*.json"))]
    if not found:
        raise DatasetUnavailable(LAYOUT.format(root=root))
    return found


def read_leaf(root: Path):
    """Yield (split, user, x list, y list, file) for every user of every file, validated."""
    for split, path in leaf_files(root):
        try:
            content = json.loads(path.read_text(encoding="utf-8-sig"))
            users, counts, data = content["users"], content["num_samples"], content["user_data"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
            raise DatasetCorrupt(f"'{path}' is not a LEAF json file (truncated or malformed): "
                                 f"{type(error).__name__}: {error}") from None
        if len(users) != len(counts):
            raise DatasetCorrupt(f"'{path}': {len(users)} users but {len(counts)} num_samples")
        for user, count in zip(users, counts):
            record = data.get(user)
            if record is None or len(record.get("x", ())) != count or len(record.get("y", ())) != count:
                raise DatasetCorrupt(f"'{path}', user '{user}': num_samples says {count}, "
                                     "user_data holds another number of x/y records")
            yield split, user, record["x"], record["y"], path


def _provenance(root: Path) -> dict:
    return {"leaf_files": [{"file": str(p.relative_to(root)), "sha256": sha256_of(p)}
                           for _, p in leaf_files(root)]}


def build_femnist(paths: dict[str, Path], input_name: str) -> ArrayDataset:
    """FEMNIST: 28x28 images as uint8 (LEAF's x is gray/255, 784 values), 62 classes, clients = writers."""
    root = paths[input_name]
    images, labels, users, test = [], [], [], []
    has_split = False
    for split, user, xs, ys, path in read_leaf(root):
        x = np.asarray(xs, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != 784 or (len(x) and (x.min() < 0 or x.max() > 1)):
            raise DatasetCorrupt(f"'{path}', user '{user}': x must be lists of 784 values in [0, 1]")
        y = np.asarray(ys, dtype=np.int64)
        if len(y) and (y.min() < 0 or y.max() >= len(FEMNIST_CLASSES)):
            raise DatasetCorrupt(f"'{path}', user '{user}': labels must be 0..61")
        images.append(np.rint(x * 255).astype(np.uint8).reshape(-1, 28, 28))
        labels.append(y)
        users += [user] * len(y)
        test += [split == "test"] * len(y)
        has_split = split is not None
    names = sorted(set(users))
    clients = np.searchsorted(np.array(names), np.array(users)).astype(np.int64)
    return ArrayDataset(np.concatenate(images), np.concatenate(labels), FEMNIST_CLASSES, "image",
                        clients=clients, official_test=np.array(test) if has_split else None,
                        info={"counts": {"records": len(users), "writers": len(names)},
                              "pixels": "uint8 = round(255 * LEAF x); LEAF x = gray / 255",
                              **_provenance(root)})


def build_shakespeare_leaf(paths: dict[str, Path], input_name: str) -> ArrayDataset:
    """LEAF Shakespeare: x = 80-character strings, y = the next character; clients = roles."""
    root = paths[input_name]
    windows, targets, users, test = [], [], [], []
    has_split = False
    for split, user, xs, ys, path in read_leaf(root):
        if any(not isinstance(x, str) or len(x) != SEQUENCE_LENGTH for x in xs) or \
                any(not isinstance(y, str) or len(y) != 1 for y in ys):
            raise DatasetCorrupt(f"'{path}', user '{user}': x must be {SEQUENCE_LENGTH}-character "
                                 "strings and y single characters")
        windows += xs
        targets += ys
        users += [user] * len(xs)
        test += [split == "test"] * len(xs)
        has_split = split is not None
    names = sorted(set(users))
    clients = np.searchsorted(np.array(names), np.array(users)).astype(np.int64).tolist()
    return tokens_dataset(windows, targets, clients, test if has_split else None,
                          {"counts": {"records": len(users), "roles": len(names)}, **_provenance(root)})
