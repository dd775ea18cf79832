"""The run plan: one run (a configuration, a seed and a fold) fully resolved, typed and frozen.

`campaign.expand` builds the plans of a campaign; the manifest and each cell's plan file carry them
serialised; the runner loads them. A plan holds every value that determines a run's numbers, with
every default applied (network, mechanism, training), so its canonical JSON says what ran and its
hash is the run id: the same plan has the same id in every campaign, shard and machine.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from ldpbench import mechanisms
from ldpbench.errors import ConfigError
from ldpbench.fl.network_declarations import NETWORKS, check_gradients, network_parameters
from ldpbench.fl.settings import TrainingSettings

# A campaign sets the network's parameters under `training:`; the plan keeps them with the network.
NETWORK_PARAMS_KEY = "model_params"
DATA_PARTS = ("private", "public")


@dataclass(frozen=True)
class RunPlan:
    dataset: str
    features: str  # the encoder whose features the run trains on ("" = the prepared data)
    model: str  # the network
    network_params: dict[str, Any]  # every parameter of the network, defaults applied
    mechanism: str  # a registered update mechanism or data release
    mechanism_params: dict[str, Any]  # every parameter of the mechanism, defaults applied
    training: TrainingSettings
    epsilon: float | None  # a client's total budget; None for non-private mechanisms
    seed: int
    fold: int
    folds: int  # 0: a hold-out split of test_fraction; K ≥ 2: K-fold cross-validation
    test_fraction: float
    # A seed-independent share of the records set aside as public data (0: none). "private" runs
    # split and train on the other records; "public" runs (tuning trials with `tuning.data: public`)
    # train and validate on the public records only and have no test split.
    public_fraction: float = 0.0
    data_part: str = "private"

    def __post_init__(self) -> None:
        if self.data_part not in DATA_PARTS:
            raise ConfigError(f"a run plan's data_part must be one of {DATA_PARTS}, got {self.data_part!r}")
        if not 0 <= self.public_fraction < 1:
            raise ConfigError(f"split.public_fraction must be in [0, 1), got {self.public_fraction}")
        if self.data_part == "public" and self.public_fraction == 0:
            raise ConfigError("a run on the public data part needs split.public_fraction > 0")
        declaration = NETWORKS.get(self.model)
        check_gradients(self.training.gradients, self.model, declaration.closed_form_gradients,
                        declaration.fused_gradients)

    @classmethod
    def resolve(cls, *, dataset: str, features: str, model: str, mechanism: str, params: dict[str, Any],
                training: dict[str, Any], epsilon: float | None, seed: int, fold: int, folds: int,
                test_fraction: float, public_fraction: float = 0.0, data_part: str = "private") -> RunPlan:
        """The plan of a campaign's values (`training` as a campaign's merged `training:` block)."""
        training = dict(training)
        network = {**network_parameters(model), **training.pop(NETWORK_PARAMS_KEY, {})}
        return cls(dataset=dataset, features=features, model=model, network_params=_plain(network),
                   mechanism=mechanism, mechanism_params=_plain({**mechanisms.parameters(mechanism), **params}),
                   training=TrainingSettings.from_dict(training), epsilon=epsilon, seed=seed, fold=fold,
                   folds=folds, test_fraction=test_fraction, public_fraction=public_fraction, data_part=data_part)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def canonical_json(self) -> str:
        """Sorted keys, no spaces: the form that is hashed and written."""
        return self._canonical

    # Computed once per plan (a plan is frozen, its dicts included): a run asks for its id about 15
    # times, and together those dataclasses.asdict calls were a few percent of a FedSel-grid run.
    @functools.cached_property
    def _canonical(self) -> str:
        return canonical_json(self.to_dict())

    @functools.cached_property
    def run_id(self) -> str:
        return run_id(self.canonical_json())

    @classmethod
    def from_dict(cls, values: Any) -> RunPlan:
        if not isinstance(values, dict):
            raise ConfigError(f"a run plan must be a JSON object, got {type(values).__name__}")
        names = {field.name for field in dataclasses.fields(cls)}
        if set(values) != names:
            raise ConfigError(f"not a valid run plan: missing keys {sorted(names - set(values))}, "
                              f"unknown keys {sorted(set(values) - names)}")
        if not isinstance(values["training"], dict):
            raise ConfigError(f"not a valid run plan: 'training' must be an object, got {values['training']!r}")
        try:
            return cls(**{**values, "training": TrainingSettings.from_dict(values["training"])})
        except TypeError as error:
            raise ConfigError(f"not a valid run plan: {error}") from None

    @classmethod
    def from_json(cls, text: str) -> RunPlan:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"not a valid run plan: {error}") from None
        return cls.from_dict(values)

    @property
    def epsilon_value(self) -> float:
        return math.inf if self.epsilon is None else float(self.epsilon)

    def epsilon_per_report(self, clients: int) -> float:
        """The budget of one report, once the data is partitioned into `clients` (the one place it is set).

        With epsilon_scope "per_report", ε is each report's budget. With "total", ε is split evenly
        over the most reports a client can send, which the mechanism declares: an update mechanism
        one per round taken part in (FedSel: one per epoch, ε' = ε/E), a data release one.
        """
        if self.training.epsilon_scope == "per_report":
            return self.epsilon_value
        participations = self.training.most_rounds_per_client(clients)
        return self.epsilon_value / mechanisms.get(self.mechanism).reports_bound(participations)


def canonical_json(values: Any) -> str:
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


def run_id(canonical: str) -> str:
    """The first 16 hex digits of the sha256 of a plan's canonical JSON."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _plain(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as their JSON form reads back (tuples as lists), so a loaded plan equals the built one."""
    return json.loads(json.dumps(params))
