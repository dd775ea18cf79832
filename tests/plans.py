"""Run plans for tests, built as a campaign builds them (every default applied)."""

from typing import Any

from ldpbench.plan import RunPlan


def run_plan(dataset: str, model: str, mechanism: str, params: dict[str, Any], epsilon: float | None, seed: int,
             fold: int, folds: int, test_fraction: float, training: dict[str, Any], features: str = "") -> RunPlan:
    """The plan of these campaign values (`training` as a campaign's `training:` block)."""
    return RunPlan.resolve(dataset=dataset, features=features, model=model, mechanism=mechanism, params=params,
                           training=training, epsilon=epsilon, seed=seed, fold=fold, folds=folds,
                           test_fraction=test_fraction)
