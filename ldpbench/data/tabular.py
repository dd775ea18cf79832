"""BANK (UCI Bank Marketing) and KDD99 (10 % file), prepared as in FedSel (32 and 114 features).

FedSel says only "one-hot-encoding every categorical attribute" and gives the dimensions, so the
exact encodings are CHOICEs, picked to reach the paper's dimensions:

BANK (45,211 records of bank-full.csv, label y = "yes"): the 7 numeric attributes (age, balance,
day, duration, campaign, pdays, previous), min-max scaled to [0, 1], plus one-hot of the client
attributes job (12), marital (3), education (4), default, housing, loan (2 each): 7 + 25 = 32.
The campaign-context categoricals contact, month and poutcome are left out (with them d = 51).

KDD99 (kddcup.data_10_percent, 494,021 records): 70,000 records sampled without replacement with a
recorded seed; label 1 for any attack, 0 for "normal."; protocol_type, service and flag one-hot over
the values present in the sample; the 38 numeric attributes log1p-transformed (they are heavy
tailed and non-negative) and min-max scaled; num_outbound_cmds, which is 0 in the whole file, is
dropped. The dimension depends on which rare services the sample holds: seed 0 gives 113
(the paper reports 114; other seeds give 112–115).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from ldpbench.data.archive import open_decompressed, read_zip_member
from ldpbench.data.prepared import PreparedDataset

BANK_RECORDS = 45_211
BANK_NUMERIC = ("age", "balance", "day", "duration", "campaign", "pdays", "previous")
BANK_CATEGORIES = {
    "job": ("admin.", "blue-collar", "entrepreneur", "housemaid", "management", "retired",
            "self-employed", "services", "student", "technician", "unemployed", "unknown"),
    "marital": ("divorced", "married", "single"),
    "education": ("primary", "secondary", "tertiary", "unknown"),
    "default": ("no", "yes"),
    "housing": ("no", "yes"),
    "loan": ("no", "yes"),
}


def _min_max(values: np.ndarray) -> np.ndarray:
    low, high = values.min(), values.max()
    return np.zeros_like(values) if high == low else (values - low) / (high - low)


def _one_hot(values: pd.Series, vocabulary, prefix: str) -> tuple[np.ndarray, list[str]]:
    unknown = set(values.dropna().unique()) - set(vocabulary)
    if unknown:
        raise ValueError(f"column '{prefix}' has unexpected values {sorted(unknown)[:5]}")
    codes = np.asarray(pd.Categorical(values, categories=list(vocabulary)).codes)
    block = np.zeros((len(values), len(vocabulary)), dtype=np.float32)
    block[np.arange(len(values)), codes] = 1.0
    return block, [f"{prefix}={v}" for v in vocabulary]


def read_bank(zip_path: Path) -> pd.DataFrame:
    """bank-full.csv straight from the official zip (read in memory within the unpack limits)."""
    return pd.read_csv(io.BytesIO(read_zip_member(zip_path, "bank-full.csv")), sep=";")


def prepare_bank(files: dict[str, Path], check_counts: bool = True) -> PreparedDataset:
    frame = read_bank(files["bank.zip"])
    if check_counts and len(frame) != BANK_RECORDS:
        raise ValueError(f"bank-full.csv in '{files['bank.zip']}' has {len(frame)} records, expected {BANK_RECORDS}")
    blocks = [np.stack([_min_max(frame[c].to_numpy(float)) for c in BANK_NUMERIC], axis=1).astype(np.float32)]
    names = list(BANK_NUMERIC)
    for column, vocabulary in BANK_CATEGORIES.items():
        block, labels = _one_hot(frame[column], vocabulary, column)
        blocks.append(block)
        names += labels
    return PreparedDataset(
        features=np.concatenate(blocks, axis=1),
        labels=(frame["y"] == "yes").to_numpy().astype(np.int64),
        feature_names=tuple(names),
        classes=("no", "yes"),
        info={"task": "binary", "source": "UCI Bank Marketing, bank-full.csv (FedSel BANK encoding, d = 32)"},
    )


KDD_RECORDS = 494_021
KDD_SAMPLE = 70_000
KDD_CATEGORICAL = {1: "protocol_type", 2: "service", 3: "flag"}
KDD_NAMES = (
    "duration", "protocol_type", "service", "flag", "src_bytes", "dst_bytes", "land",
    "wrong_fragment", "urgent", "hot", "num_failed_logins", "logged_in", "num_compromised",
    "root_shell", "su_attempted", "num_root", "num_file_creations", "num_shells",
    "num_access_files", "num_outbound_cmds", "is_host_login", "is_guest_login", "count",
    "srv_count", "serror_rate", "srv_serror_rate", "rerror_rate", "srv_rerror_rate",
    "same_srv_rate", "diff_srv_rate", "srv_diff_host_rate", "dst_host_count",
    "dst_host_srv_count", "dst_host_same_srv_rate", "dst_host_diff_srv_rate",
    "dst_host_same_src_port_rate", "dst_host_srv_diff_host_rate", "dst_host_serror_rate",
    "dst_host_srv_serror_rate", "dst_host_rerror_rate", "dst_host_srv_rerror_rate", "label",
)
KDD_DROPPED = ("num_outbound_cmds",)  # constant 0 in the whole 10 % file


def prepare_kdd(files: dict[str, Path], sample: int = KDD_SAMPLE, seed: int = 0,
                check_counts: bool = True) -> PreparedDataset:
    with open_decompressed(files["kddcup.data_10_percent.gz"]) as stream:  # within the unpack limits
        frame = pd.read_csv(stream, header=None, names=list(KDD_NAMES))
    if check_counts and len(frame) != KDD_RECORDS:
        raise ValueError(f"'{files['kddcup.data_10_percent.gz']}' has {len(frame)} records, expected {KDD_RECORDS}")
    chosen = np.sort(np.random.default_rng(seed).choice(len(frame), size=min(sample, len(frame)), replace=False))
    frame = frame.iloc[chosen].reset_index(drop=True)
    blocks, names = [], []
    for column in KDD_NAMES[:-1]:
        if column in KDD_DROPPED:
            continue
        if column in KDD_CATEGORICAL.values():
            block, labels = _one_hot(frame[column], sorted(frame[column].unique()), column)
        else:
            block = _min_max(np.log1p(frame[column].to_numpy(float)))[:, None].astype(np.float32)
            labels = [column]
        blocks.append(block)
        names += labels
    return PreparedDataset(
        features=np.concatenate(blocks, axis=1),
        labels=(frame["label"] != "normal.").to_numpy().astype(np.int64),
        feature_names=tuple(names),
        classes=("normal", "attack"),
        info={"task": "binary",
              "source": "KDD Cup 1999, kddcup.data_10_percent (FedSel KDD99 encoding)",
              "sample": {"records": int(len(frame)), "seed": seed, "of": KDD_RECORDS}},
    )
