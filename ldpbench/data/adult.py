"""UCI Adult, one-hot encoded into the 123 binary features of the classic a9a encoding (FedSel).

CHOICE (a9a's exact bin edges are not published with the data): the four continuous attributes
age, fnlwgt, education-num and hours-per-week are cut into 5 bins at the 20/40/60/80 % quantiles of
adult.data; capital-gain and capital-loss into 2 bins (zero / non-zero); every categorical attribute
is one-hot over the value list of adult.names. A missing value ('?') sets no bit of its attribute.
5+8+5+16+5+7+14+6+5+2+2+2+5+41 = 123 features. adult.data and adult.test are concatenated
(32,561 + 16,281 = 48,842 records, as in the FedSel paper); the label is 1 for income >50K.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ldpbench.data.prepared import PreparedDataset

COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week",
    "native-country", "income",
)

CATEGORIES = {
    "workclass": ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
                  "State-gov", "Without-pay", "Never-worked"),
    "education": ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm",
                  "Assoc-voc", "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th",
                  "Doctorate", "5th-6th", "Preschool"),
    "marital-status": ("Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                       "Married-spouse-absent", "Married-AF-spouse"),
    "occupation": ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                   "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                   "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
                   "Armed-Forces"),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative",
                     "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": ("United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
                       "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China",
                       "Cuba", "Iran", "Honduras", "Philippines", "Italy", "Poland", "Jamaica",
                       "Vietnam", "Mexico", "Portugal", "Ireland", "France", "Dominican-Republic",
                       "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia", "Hungary", "Guatemala",
                       "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
                       "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"),
}
QUANTILE_BINNED = ("age", "fnlwgt", "education-num", "hours-per-week")
ZERO_NONZERO = ("capital-gain", "capital-loss")
EXPECTED_RECORDS = {"adult.data": 32_561, "adult.test": 16_281}


def _read(path: Path, skip_first_line: bool, check_counts: bool) -> pd.DataFrame:
    frame = pd.read_csv(
        path, header=None, names=list(COLUMNS), skipinitialspace=True, na_values="?",
        skiprows=1 if skip_first_line else 0, skip_blank_lines=True,
    )
    frame["income"] = frame["income"].str.rstrip(".")
    expected = EXPECTED_RECORDS[path.name]
    if check_counts and len(frame) != expected:
        raise ValueError(f"'{path}' has {len(frame)} records, expected {expected}")
    return frame


def prepare(files: dict[str, Path], check_counts: bool = True) -> PreparedDataset:
    """Encode adult.data + adult.test; `check_counts` asserts the official record counts."""
    train = _read(files["adult.data"], skip_first_line=False, check_counts=check_counts)
    test = _read(files["adult.test"], skip_first_line=True, check_counts=check_counts)
    frame = pd.concat([train, test], ignore_index=True)

    blocks: list[np.ndarray] = []
    names: list[str] = []
    bin_edges: dict[str, list[float]] = {}
    for column in COLUMNS[:-1]:
        values = frame[column]
        if column in CATEGORIES:
            vocabulary = CATEGORIES[column]
            unknown = set(values.dropna().unique()) - set(vocabulary)
            if unknown:
                raise ValueError(f"Adult column '{column}' has values outside adult.names: {unknown}")
            codes = pd.Categorical(values, categories=vocabulary).codes  # -1 for missing
            labels = [f"{column}={value}" for value in vocabulary]
        elif column in QUANTILE_BINNED:
            edges = np.quantile(train[column].to_numpy(float), [0.2, 0.4, 0.6, 0.8])
            bin_edges[column] = edges.tolist()
            codes = np.searchsorted(edges, values.to_numpy(float), side="right")
            labels = [f"{column}=bin{i}" for i in range(5)]
        else:  # zero / non-zero
            codes = (values.to_numpy(float) > 0).astype(np.int64)
            labels = [f"{column}=zero", f"{column}=nonzero"]
        one_hot = np.zeros((len(frame), len(labels)), dtype=np.float32)
        present = np.asarray(codes) >= 0
        one_hot[np.flatnonzero(present), np.asarray(codes)[present]] = 1.0
        blocks.append(one_hot)
        names.extend(labels)

    features = np.concatenate(blocks, axis=1)
    labels = (frame["income"] == ">50K").to_numpy().astype(np.int64)
    return PreparedDataset(
        features=features,
        labels=labels,
        feature_names=tuple(names),
        classes=("<=50K", ">50K"),
        info={
            "task": "binary",
            "source": "UCI Adult (adult.data + adult.test), a9a-style one-hot encoding",
            "bin_edges": bin_edges,
        },
    )
