"""Tuning: a search space per mechanism entry, trials scored on validation clients, and the selection.

A campaign's `tuning:` section (overridable per mechanism entry, key by key) names a search space over
training settings (`learning_rate`, `rounds`, ...) and mechanism parameters (`params.mu`), searched as
a grid or as a seeded random sample. For every configuration (dataset, model, mechanism entry, ε) of
a tuned entry, each point of the space is a **trial**: an ordinary run plan with the point applied and
`training.validation_fraction` set, run at every tuning seed (fold 0 of the campaign's split). Its
score is its final validation metric, computed on validation clients carved from its training split
(or, with `data: public`, on the public part of the data), so the selection never reads a test split.
The **selection** picks, per (dataset, model, label, ε), the point with the best mean score over the
tuning seeds (a diverged or NaN trial scores worst; ties go to the earliest point), and the final runs
use it at the campaign's seeds and folds.

Privacy cost. Every trial on private data spends budget from the same population of clients as the
final runs (Papernot & Steinke, ICLR 2022, show that tuning itself leaks). The selection charges each
tuned configuration the sum, over its trial runs, of each trial's largest per-client spend: basic
composition, an upper bound on any one client's tuning spend (attained by a client that trained in
every trial). With `data: public` the trials train and validate on a disjoint split declared public
(`split.public_fraction`), an assumption the report states, and nothing is charged.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ldpbench.errors import ConfigError
from ldpbench.fl.settings import TrainingSettings

PARAMS_PREFIX = "params."
METRICS = ("validation_accuracy", "validation_auc", "validation_loss")
# Training settings that describe how a run is computed or observed rather than what it learns.
UNTUNABLE = {"validation_fraction", "stop", "device", "checkpoint_every", "chunk_clients", "block_records",
             "eval_every", "eval_train_records", "partition", "algorithm", "sampler", "epsilon_scope"}
TUNABLE_TRAINING = tuple(f.name for f in fields(TrainingSettings) if f.name not in UNTUNABLE)


@dataclass(frozen=True)
class TuningSpec:
    """The tuning of one mechanism entry: its campaign-wide `tuning:` keys with the entry's over them."""

    space: dict[str, Any]  # key -> list of values (grid or random choice) or {low, high, log, integer}
    method: str = "grid"
    samples: int = 10  # random: points drawn
    sample_seed: int = 0
    # Validation AUC, not accuracy: on an imbalanced set accuracy rewards the constant majority
    # predictor (76 % on Adult), AUC gives any constant 0.5 whatever the balance.
    metric: str = "validation_auc"
    direction: str = ""  # maximize or minimize; "" = from the metric (a loss is minimised)
    seeds: tuple[int, ...] = ()
    validation_fraction: float = 0.2
    data: str = "private"  # private: trials train and validate on the training clients; public: the public part

    @property
    def minimise(self) -> bool:
        return (self.direction or ("minimize" if self.metric.endswith("_loss") else "maximize")) == "minimize"

    def points(self) -> list[dict[str, Any]]:
        """The points of the space in a fixed order: the grid (last key fastest) or the seeded sample."""
        keys = list(self.space)
        if self.method == "grid":
            grid = [[]]
            for key in keys:
                grid = [[*point, value] for point in grid for value in self.space[key]]
            points = [dict(zip(keys, point)) for point in grid]
        else:
            rng = np.random.default_rng([self.sample_seed, 20151])
            points = [{key: _draw(self.space[key], rng) for key in keys} for _ in range(self.samples)]
        # A point drawn (or listed) twice is one trial: the first keeps its place.
        unique = {setting_json(point): point for point in reversed(points)}
        return sorted(unique.values(), key=lambda point: points.index(point))


def _draw(values: Any, rng: np.random.Generator) -> Any:
    if isinstance(values, list):
        return values[int(rng.integers(len(values)))]
    low, high = float(values["low"]), float(values["high"])
    if values.get("log", False):
        value = math.exp(rng.uniform(math.log(low), math.log(high)))
    else:
        value = rng.uniform(low, high)
    return int(round(value)) if values.get("integer", False) else float(value)


def spec_for(config: dict[str, Any], entry: dict[str, Any]) -> TuningSpec | None:
    """The tuning of a mechanism entry, or None when it is not tuned (no section, or an empty space)."""
    merged = {**(config.get("tuning") or {}), **(entry.get("tuning") or {})}
    if not merged.get("space"):
        return None
    seeds = tuple(int(seed) for seed in merged.get("seeds") or config["seeds"][:1])
    return TuningSpec(**{**merged, "seeds": seeds})


def split_point(point: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training settings, mechanism parameters) of a point."""
    training = {key: value for key, value in point.items() if not key.startswith(PARAMS_PREFIX)}
    params = {key[len(PARAMS_PREFIX):]: value for key, value in point.items() if key.startswith(PARAMS_PREFIX)}
    return training, params


def with_point(entry: dict[str, Any], point: dict[str, Any], training: dict[str, Any] | None = None) -> dict[str, Any]:
    """A mechanism entry with a point applied (and further training settings, e.g. the validation share)."""
    point_training, point_params = split_point(point)
    return {**entry, "params": {**entry.get("params", {}), **point_params},
            "training": {**entry.get("training", {}), **point_training, **(training or {})}}


def check_spec(spec: TuningSpec, where: str, config: dict[str, Any]) -> None:
    """What the schema cannot check: the space's keys, the public split, the points themselves."""
    for key, values in spec.space.items():
        if not key.startswith(PARAMS_PREFIX) and key not in TUNABLE_TRAINING:
            raise ConfigError(f"config key '{where}.space.{key}': not a tunable training setting or "
                              f"params.<name>; tunable settings: {', '.join(TUNABLE_TRAINING)}")
        if isinstance(values, dict):
            if spec.method != "random":
                raise ConfigError(f"config key '{where}.space.{key}': a range {{low, high}} needs method: random; "
                                  "a grid takes a list of values")
            if not values["low"] < values["high"] or (values.get("log") and values["low"] <= 0):
                raise ConfigError(f"config key '{where}.space.{key}': needs low < high (and low > 0 with log), "
                                  f"got {values}")
    if spec.data == "public" and not config["split"]["public_fraction"] > 0:
        raise ConfigError(f"config key '{where}.data': 'public' tunes on the public part of the data: set "
                          "split.public_fraction > 0")


# ---------------------------------------------------------------------------- selection
def trial_scores(trials: pd.DataFrame) -> pd.DataFrame:
    """tables/tuning.parquet from the trial runs (their run rows with point, setting, metric, direction
    and data attached): every trial and its score, the final validation metric it is selected by."""
    from ldpbench.results.schema import TABLES

    score = np.array([row[metric] for row, metric in zip(trials.to_dict("records"), trials["metric"])], dtype=float)
    return trials.assign(score=score)[TABLES["tuning"].names]  # the table's columns, in order


def select(tuning: pd.DataFrame) -> pd.DataFrame:
    """tables/selected.parquet: per (dataset, model, label, ε) the best point of tables/tuning.parquet.

    Reads the scores only (no test metric is in the table). A trial that diverged or has no finite
    score counts as the worst possible; the mean over tuning seeds ranks the points; ties go to the
    earliest point.
    """
    rows = []
    for (dataset, model, label, epsilon), trials in tuning.groupby(["dataset", "model", "label", "epsilon"],
                                                                    sort=True):
        minimise = trials["direction"].iloc[0] == "minimize"
        worst = math.inf if minimise else -math.inf
        usable = (trials["status"] == "ok") & np.isfinite(trials["score"])
        scores = trials["score"].where(usable, worst)
        by_point = scores.groupby(trials["point"]).mean().sort_index()
        best_point = int(by_point.idxmin() if minimise else by_point.idxmax())
        chosen = trials[trials["point"] == best_point]
        public = trials["data"].iloc[0] == "public"
        rows.append({
            "campaign": trials["campaign"].iloc[0], "dataset": dataset, "model": model, "label": label,
            "mechanism": trials["mechanism"].iloc[0], "epsilon": epsilon, "point": best_point,
            "setting": chosen["setting"].iloc[0], "score": float(by_point.loc[best_point]),
            "metric": trials["metric"].iloc[0], "direction": trials["direction"].iloc[0],
            "trials": int(by_point.size), "trial_runs": len(trials), "tuning_data": trials["data"].iloc[0],
            "tuning_epsilon_claimed_client_max": 0.0 if public else float(trials["epsilon_claimed_client_max"].sum()),
            "tuning_epsilon_worst_case_client_max":
                0.0 if public else float(trials["epsilon_worst_case_client_max"].sum()),
        })
    return pd.DataFrame(rows)


def setting_json(point: dict[str, Any]) -> str:
    return json.dumps(point, sort_keys=True, separators=(",", ":"))


def _scored(runs: pd.DataFrame, trials: list[dict[str, Any]]) -> pd.DataFrame:
    """tables/tuning.parquet's rows: the trials' run rows with the point each tries and how it is scored."""
    points = pd.DataFrame([{key: entry[key] for key in ("run_id", "point", "setting", "metric", "direction", "data")}
                           for entry in trials])
    return trial_scores(runs.merge(points, on="run_id", how="left"))


def select_cell(trials: list[dict[str, Any]], runs_root: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the point selected, its row of tables/selected.parquet) for one trial cell's runs (every point of
    one configuration at one ε), read from the run store: what a tuned final cell runs with."""
    from ldpbench.layout import TRIAL
    from ldpbench.results.tables import load_runs

    runs, _ = load_runs(trials, runs_root, TRIAL)
    runs.insert(0, "campaign", "")
    [row] = select(_scored(runs, trials)).drop(columns="campaign").to_dict("records")
    return json.loads(row["setting"]), row


def select_tables(trials_manifest: str | Path, runs_root: str | Path, tables_dir: str | Path) -> dict[str, int]:
    """The trials' run files → tables/tuning.parquet and, last, tables/selected.parquet."""
    from ldpbench.layout import table_file
    from ldpbench.results.schema import write_table
    from ldpbench.results.tables import load_manifest_runs

    manifest, runs, _ = load_manifest_runs(trials_manifest, runs_root)
    table = _scored(runs, manifest["runs"])
    chosen = select(table)
    write_table(table_file(tables_dir, "tuning"), "tuning", table)
    write_table(table_file(tables_dir, "selected"), "selected", chosen)
    return {"trials": len(table), "selected": len(chosen)}
