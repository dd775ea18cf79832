"""FedSel's synthetic data (syn-L / syn-H), after Wangni et al. 2018.

CHOICE (the papers give only C1, C2, d and N; see ../shared/reference/mechanisms.md §2):
x ~ N(0, I_d); a fixed random fraction C2 of the d dimensions is multiplied by C1, which makes those
dimensions (and their gradients) nearly vanish; labels come from a planted linear model
y = 1[w*·x + noise > 0] with w* ~ N(0, I_d) and Gaussian noise whose standard deviation is
`label_noise` times the standard deviation of w*·x. The generator seed is part of the dataset
definition, so every run of a campaign sees the same records.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ldpbench.data.prepared import PreparedDataset
from ldpbench.rng import derive_seed


@dataclass(frozen=True)
class SyntheticSpec:
    dims: int
    records: int
    c1: float  # scale of the skewed dimensions
    c2: float  # fraction of dimensions that are skewed
    label_noise: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dims < 2 or self.records < 2:
            raise ValueError(f"synthetic data needs dims >= 2 and records >= 2, got {self}")
        if not 0.0 < self.c1 <= 1.0 or not 0.0 <= self.c2 <= 1.0:
            raise ValueError(f"synthetic data needs 0 < C1 <= 1 and 0 <= C2 <= 1, got {self}")
        if self.label_noise < 0:
            raise ValueError(f"label_noise must be >= 0, got {self.label_noise}")


def generate(spec: SyntheticSpec) -> PreparedDataset:
    rng = np.random.default_rng(derive_seed("synthetic", spec.dims, spec.records, spec.c1, spec.c2,
                                            spec.label_noise, spec.seed))
    features = rng.standard_normal((spec.records, spec.dims))
    skewed = rng.choice(spec.dims, size=int(round(spec.c2 * spec.dims)), replace=False)
    features[:, skewed] *= spec.c1
    planted = rng.standard_normal(spec.dims)
    score = features @ planted
    noise = rng.standard_normal(spec.records) * spec.label_noise * score.std()
    labels = (score + noise > 0).astype(np.int64)
    return PreparedDataset(
        features=features.astype(np.float32),
        labels=labels,
        feature_names=tuple(f"x{i}" for i in range(spec.dims)),
        classes=("0", "1"),
        info={
            "task": "binary",
            "source": "synthetic (FedSel / Wangni et al. 2018 procedure, ldpbench interpretation)",
            "generator": {
                "dims": spec.dims,
                "records": spec.records,
                "c1": spec.c1,
                "c2": spec.c2,
                "label_noise": spec.label_noise,
                "seed": spec.seed,
                "skewed_dims": sorted(int(i) for i in skewed),
            },
        },
    )
