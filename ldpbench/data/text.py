"""Text datasets: AG News (csv), the SEC contract clauses (user-provided csv) and Shakespeare
(TensorFlow Federated's h5 files; LEAF's json files are read in `leaf.py`)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np

from ldpbench.data.archive import read_compressed
from ldpbench.data.prepared import ArrayDataset, encode_texts
from ldpbench.errors import DatasetCorrupt

AG_NEWS_CLASSES = ("World", "Sports", "Business", "Sci/Tech")

# LEAF's 80-symbol vocabulary (models/utils/language_utils.py: ALL_LETTERS).
LEAF_VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQUENCE_LENGTH = 80
SHAKESPEARE_TFF_CLIENTS = 715
SHAKESPEARE_TFF_SNIPPETS = {"train": 16_068, "test": 2_356}
SHAKESPEARE_TFF_STRIDE = 80


def _csv_rows(path: Path):
    try:
        text = read_compressed(path).decode("utf-8-sig")  # a byte-order mark is not part of the header
    except UnicodeDecodeError as error:
        raise DatasetCorrupt(f"'{path}' is not UTF-8 text: {error}") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        for row in reader:
            yield reader.line_num, row
    except csv.Error as error:
        raise DatasetCorrupt(f"'{path}' line {reader.line_num}: malformed CSV: {error}") from None


def read_ag_news(path: Path, expected: int | None) -> tuple[list[str], np.ndarray]:
    """AG News csv rows "class index (1-4)","title","description" -> (title + ' ' + description).

    The descriptions use a backslash where the source had a line break; it becomes a space.
    """
    texts, labels = [], []
    for line, row in _csv_rows(path):
        if len(row) != 3:
            raise DatasetCorrupt(f"'{path}' line {line}: {len(row)} columns, expected 3 "
                                 "(class index, title, description)")
        if row[0] not in ("1", "2", "3", "4"):
            raise DatasetCorrupt(f"'{path}' line {line}, column 1: class index {row[0]!r} is not 1-4")
        texts.append(f"{row[1]} {row[2]}".replace("\\", " "))
        labels.append(int(row[0]) - 1)
    if expected is not None and len(texts) != expected:
        raise DatasetCorrupt(f"'{path}' holds {len(texts)} articles, expected {expected}")
    return texts, np.array(labels, dtype=np.int64)


def build_ag_news(paths: dict[str, Path], splits: dict[str, int], official_split: bool) -> ArrayDataset:
    """`splits`: official csv file -> expected articles (train.csv 120,000; test.csv 7,600)."""
    texts, labels, test = [], [], []
    for file_name, expected in splits.items():
        t, y = read_ag_news(paths[file_name], expected)
        texts += t
        labels.append(y)
        test.append(np.full(len(y), file_name == "test.csv"))
    return ArrayDataset(encode_texts(texts), np.concatenate(labels), AG_NEWS_CLASSES, "text",
                        official_test=np.concatenate(test) if official_split else None,
                        info={"counts": {name: n for name, n in splits.items()},
                              "text": "title + ' ' + description, backslashes as spaces"})


# ---------------------------------------------------------------------------- SEC clauses
SEC_FILE = "sec_contract_clauses.csv"
SEC_FORMAT = f"""\
The SEC contract-clause set of BitRand is not public. Provide it as '{SEC_FILE}': UTF-8, comma-
separated, RFC 4180 quoting, one header row, one clause per row, columns (any order, no others):
  text    required  the clause text, non-empty
  label   required  integer class index 0..C-1 (BitRand: C = 2); every class must occur
  client  optional  the natural client id (e.g. the filing or contract id), non-empty string
  split   optional  'train' or 'test' (the official split); without it the runs split at random
"""


def build_sec(paths: dict[str, Path]) -> ArrayDataset:
    path = paths[SEC_FILE]
    rows = _csv_rows(path)
    try:
        _, header = next(rows)
    except StopIteration:
        raise DatasetCorrupt(f"'{path}' is empty; expected a header row.\n{SEC_FORMAT}") from None
    allowed = {"text", "label", "client", "split"}
    unknown = [c for c in header if c not in allowed]
    missing = [c for c in ("text", "label") if c not in header]
    if unknown or missing or len(set(header)) != len(header):
        raise DatasetCorrupt(f"'{path}' line 1: header {header} has unknown columns {unknown}, "
                             f"lacks {missing} or repeats a column.\n{SEC_FORMAT}")
    column = {name: header.index(name) for name in header}
    texts, labels, clients, splits = [], [], [], []
    for line, row in rows:
        if len(row) != len(header):
            raise DatasetCorrupt(f"'{path}' line {line}: {len(row)} fields, the header has {len(header)}")
        text = row[column["text"]].strip()
        if not text:
            raise DatasetCorrupt(f"'{path}' line {line}, column 'text': empty clause")
        label = row[column["label"]].strip()
        if not label.isdigit():
            raise DatasetCorrupt(f"'{path}' line {line}, column 'label': {label!r} is not a "
                                 "non-negative integer class index")
        texts.append(text)
        labels.append(int(label))
        if "client" in column:
            client = row[column["client"]].strip()
            if not client:
                raise DatasetCorrupt(f"'{path}' line {line}, column 'client': empty client id")
            clients.append(client)
        if "split" in column:
            split = row[column["split"]].strip()
            if split not in ("train", "test"):
                raise DatasetCorrupt(f"'{path}' line {line}, column 'split': {split!r} is not "
                                     "'train' or 'test'")
            splits.append(split == "test")
    if not texts:
        raise DatasetCorrupt(f"'{path}' has a header but no clauses")
    y = np.array(labels, dtype=np.int64)
    absent = sorted(set(range(int(y.max()) + 1)) - set(labels))
    if absent:
        raise DatasetCorrupt(f"'{path}', column 'label': class indices {absent} never occur; "
                             "labels must be 0..C-1")
    client_ids = None
    if clients:
        names = sorted(set(clients))
        client_ids = np.searchsorted(np.array(names), np.array(clients)).astype(np.int64)
    return ArrayDataset(encode_texts(texts), y, tuple(str(c) for c in range(int(y.max()) + 1)),
                        "text", clients=client_ids,
                        official_test=np.array(splits) if splits else None,
                        info={"counts": {SEC_FILE: len(texts)}})


# ------------------------------------------------------------------------------ Shakespeare
def leaf_text(text: str) -> str:
    """LEAF's cleaning of a role's text: line breaks become spaces, runs of spaces one space."""
    return re.sub(r"  +", " ", text.replace("\n", " "))


def char_windows(text: str, stride: int) -> tuple[list[str], list[str]]:
    """Windows of SEQUENCE_LENGTH characters, each followed by its next character (the label)."""
    starts = range(0, len(text) - SEQUENCE_LENGTH, stride)
    return [text[i:i + SEQUENCE_LENGTH] for i in starts], [text[i + SEQUENCE_LENGTH] for i in starts]


_INDEX = {c: i for i, c in enumerate(LEAF_VOCABULARY)}


def to_ids(strings: list[str], width: int) -> tuple[np.ndarray, int]:
    """Character ids in LEAF's vocabulary; characters outside it become a space (counted)."""
    space = _INDEX[" "]
    out = np.full((len(strings), width), space, dtype=np.int64)
    unknown = 0
    for row, string in enumerate(strings):
        ids = [_INDEX.get(c, -1) for c in string]
        unknown += ids.count(-1)
        out[row, :len(ids)] = [space if i < 0 else i for i in ids]
    return out, unknown


def tokens_dataset(windows: list[str], targets: list[str], clients: list[int],
                   test: list[bool] | None, info: dict) -> ArrayDataset:
    x, unknown_x = to_ids(windows, SEQUENCE_LENGTH)
    y, unknown_y = to_ids(targets, 1)
    return ArrayDataset(x, y[:, 0], tuple(LEAF_VOCABULARY), "tokens",
                        clients=np.array(clients, dtype=np.int64),
                        official_test=None if test is None else np.array(test, dtype=bool),
                        info={**info, "vocabulary": "LEAF ALL_LETTERS (80 symbols)",
                              "sequence_length": SEQUENCE_LENGTH,
                              "characters_outside_vocabulary": unknown_x + unknown_y})


def build_shakespeare_tff(paths: dict[str, Path], expected_clients: int | None = SHAKESPEARE_TFF_CLIENTS,
                          expected_snippets: dict[str, int] | None = None,
                          stride: int = SHAKESPEARE_TFF_STRIDE) -> ArrayDataset:
    """TFF's Shakespeare (h5: examples/<role>/snippets): clients = roles; per role and split, the
    snippets joined by spaces and cleaned as LEAF does, cut into 80-character windows -> next
    character, every `stride` characters (CHOICE: 80, non-overlapping; LEAF slides by 1)."""
    import h5py

    expected_snippets = SHAKESPEARE_TFF_SNIPPETS if expected_snippets is None else expected_snippets
    per_split: dict[str, dict[str, list[str]]] = {}
    for split in ("train", "test"):
        path = paths[f"shakespeare_{split}.h5"]
        try:
            with h5py.File(path, "r") as handle:
                examples = handle["examples"]
                per_split[split] = {
                    role: [s.decode("utf-8") for s in examples[role]["snippets"][()]]
                    for role in examples
                }
        except (OSError, KeyError, UnicodeDecodeError) as error:
            raise DatasetCorrupt(f"'{path}' is not a readable TFF Shakespeare h5 file "
                                 f"(examples/<client>/snippets): {error}") from None
        snippets = sum(len(v) for v in per_split[split].values())
        if expected_snippets and snippets != expected_snippets[split]:
            raise DatasetCorrupt(f"'{path}' holds {snippets} snippets, expected {expected_snippets[split]}")
        if expected_clients is not None and len(per_split[split]) != expected_clients:
            raise DatasetCorrupt(f"'{path}' holds {len(per_split[split])} clients, expected {expected_clients}")
    roles = sorted(set(per_split["train"]) | set(per_split["test"]))
    windows, targets, clients, test = [], [], [], []
    for client, role in enumerate(roles):
        for split in ("train", "test"):
            x, y = char_windows(leaf_text(" ".join(per_split[split].get(role, []))), stride)
            windows += x
            targets += y
            clients += [client] * len(x)
            test += [split == "test"] * len(x)
    counts = {"clients": len(roles), "train_windows": test.count(False), "test_windows": test.count(True),
              **{f"{s}_snippets": sum(len(v) for v in per_split[s].values()) for s in per_split}}
    return tokens_dataset(windows, targets, clients, test,
                          {"counts": counts, "stride": stride, "client_names": roles})
