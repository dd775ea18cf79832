"""Tuning: the search space, the trials, the selection and the privacy cost of tuning."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from ldpbench.campaign import expand, expand_trials, validate_config
from ldpbench.errors import ConfigError
from ldpbench.tuning import TuningSpec, select, trial_scores

from workflow_cli import small_config


def tuned(tuning=None, mechanisms=None, **extra):
    config = small_config(mechanisms=("np", "pm"), **extra)
    if mechanisms is not None:
        config["mechanisms"] = mechanisms
    config["tuning"] = tuning if tuning is not None else {"space": {"learning_rate": [0.03, 0.3]}}
    return validate_config(config)


# ---------------------------------------------------------------- the space
def test_a_grid_is_every_combination_in_order_last_key_fastest():
    spec = TuningSpec(space={"learning_rate": [0.1, 0.3], "params.mu": [0.0, 0.1, 0.1]})
    assert spec.points() == [{"learning_rate": 0.1, "params.mu": 0.0}, {"learning_rate": 0.1, "params.mu": 0.1},
                             {"learning_rate": 0.3, "params.mu": 0.0}, {"learning_rate": 0.3, "params.mu": 0.1}]


def test_a_random_sample_is_seeded_within_its_ranges_and_without_repeats():
    space = {"learning_rate": {"low": 0.01, "high": 1.0, "log": True},
             "rounds": {"low": 10, "high": 50, "integer": True}, "params.mu": [0.0, 0.1]}
    spec = TuningSpec(space=space, method="random", samples=40, sample_seed=3)
    points = spec.points()
    assert points == TuningSpec(space=space, method="random", samples=40, sample_seed=3).points()
    assert points != TuningSpec(space=space, method="random", samples=40, sample_seed=4).points()
    assert all(0.01 <= p["learning_rate"] <= 1.0 and isinstance(p["rounds"], int) and 10 <= p["rounds"] <= 50
               for p in points)
    assert len({json.dumps(p, sort_keys=True) for p in points}) == len(points)
    # Log-uniform: about half the draws below the geometric middle 0.1 (40 draws; 5 to 35 has a
    # false-alarm probability below 1e-6 under Binomial(40, 1/2)).
    assert 5 <= sum(p["learning_rate"] < 0.1 for p in points) <= 35
    small = TuningSpec(space={"params.mu": [0.0, 0.1]}, method="random", samples=10)
    assert sorted(p["params.mu"] for p in small.points()) == [0.0, 0.1]  # repeats are one trial


# ---------------------------------------------------------------- checked before any job
@pytest.mark.parametrize("tuning,mechanisms,message", [
    ({"space": {"learning_rte": [0.1]}}, None, r"config key 'tuning.space.learning_rte': not a tunable"),
    ({"space": {"device": ["cuda"]}}, None, r"config key 'tuning.space.device': not a tunable"),
    ({"space": {"learning_rate": {"low": 0.1, "high": 1}}}, None, r"needs method: random"),
    ({"space": {"learning_rate": [0.1]}, "data": "public"}, None, r"'tuning.data'.*split.public_fraction"),
    ({"space": {"learning_rate": [-1.0]}}, None, r"config key 'tuning.space': the point .* is not valid"),
    ({"space": {"params.k_fraction": [2.0]}}, [{"name": "ps-pm"}], r"the point \{'params.k_fraction': 2.0\}"),
    ({"space": {"learning_rate": [0.1]}, "metric": "test_accuracy"}, None, r"config key 'tuning.metric'"),
    ({}, [{"name": "pm", "tuning": {"space": {"rounds": [0.5]}}}], r"mechanisms\[0\].tuning.space"),
])
def test_a_bad_tuning_section_names_its_key(tuning, mechanisms, message):
    with pytest.raises(ConfigError, match=message):
        tuned(tuning, mechanisms)


# ---------------------------------------------------------------- trials
def test_trials_are_one_cell_per_configuration_and_point_scored_on_validation_clients():
    config = tuned({"space": {"learning_rate": [0.03, 0.3]}, "validation_fraction": 0.25})
    trials = expand_trials(config)
    # np: 1 ε, pm: 2 ε; 2 points; tuning seed = the campaign's first seed, fold 0.
    assert len(trials) == (1 + 2) * 2
    assert {(t["plan"]["seed"], t["plan"]["fold"]) for t in trials} == {(0, 0)}
    assert all(t["plan"]["training"]["validation_fraction"] == 0.25 for t in trials)
    assert {t["plan"]["training"]["learning_rate"] for t in trials if t["point"] == 1} == {0.3}
    cells = {(t["label"], t["point"]): t["cell_id"] for t in trials}
    assert len(set(cells.values())) == len(cells) == 4  # pm's two ε share one cell per point
    # Adding a point adds cells and keeps the others.
    more = expand_trials(tuned({"space": {"learning_rate": [0.03, 0.3, 1.0]}, "validation_fraction": 0.25}))
    assert {t["cell_id"] for t in trials} < {t["cell_id"] for t in more}
    # Without tuning, or with an empty space for an entry, there are no trials for it.
    untuned = tuned(mechanisms=[{"name": "np"}, {"name": "pm", "tuning": {"space": {}}}])
    assert {t["label"] for t in expand_trials(untuned)} == {"np"}


def test_public_tuning_trains_the_trials_on_the_public_part():
    config = small_config(mechanisms=("pm",))
    config["split"] = {"public_fraction": 0.2}
    config["tuning"] = {"space": {"learning_rate": [0.1]}, "data": "public"}
    trials = expand_trials(validate_config(config))
    assert {t["plan"]["data_part"] for t in trials} == {"public"} and {t["data"] for t in trials} == {"public"}
    assert {r["plan"]["data_part"] for r in expand(validate_config(config))} == {"private"}


# ---------------------------------------------------------------- selection
def trial_runs(scores, metric="validation_accuracy", direction="maximize", data="private"):
    """Trial run rows as aggregation reads them: (label, point, seed) -> score."""
    rows = []
    for (label, point, seed), score in scores.items():
        rows.append({"campaign": "c", "dataset": "d", "model": "lr", "label": label, "mechanism": label.lower(),
                     "epsilon": 1.0, "point": point, "setting": json.dumps({"learning_rate": [0.03, 0.1, 0.3][point]}),
                     "seed": seed, "fold": 0, "run_id": f"{label}{point}{seed}", "status": "ok",
                     "validation_accuracy": score, "validation_loss": -score, "validation_auc": score,
                     "test_accuracy": 0.5, "test_auc": 0.5, "test_loss": 1.0, "metric": metric,
                     "direction": direction, "data": data, "epsilon_claimed_client_max": 1.0,
                     "epsilon_worst_case_client_max": 1.5})
    return pd.DataFrame(rows)


def test_the_point_with_the_best_mean_validation_score_is_selected():
    runs = trial_runs({("PM", 0, 0): 0.70, ("PM", 0, 1): 0.90, ("PM", 1, 0): 0.85, ("PM", 1, 1): 0.84,
                       ("PM", 2, 0): 0.60, ("PM", 2, 1): 0.99})
    chosen = select(trial_scores(runs)).iloc[0]
    assert chosen["point"] == 1 and chosen["score"] == pytest.approx(0.845)
    assert chosen["trials"] == 3 and chosen["trial_runs"] == 6
    # Minimising a loss picks the other end.
    losses = trial_runs({("PM", 0, 0): 0.3, ("PM", 1, 0): 0.2}, metric="validation_loss", direction="minimize")
    assert select(trial_scores(losses)).iloc[0]["point"] == 0  # validation_loss = −score: −0.3 is lowest


def test_ties_go_to_the_earliest_point_and_a_diverged_trial_scores_worst():
    tie = trial_runs({("PM", 0, 0): 0.8, ("PM", 1, 0): 0.8})
    assert select(trial_scores(tie)).iloc[0]["point"] == 0
    diverged = trial_runs({("PM", 0, 0): 0.7, ("PM", 1, 0): 0.9, ("PM", 2, 0): math.nan})
    diverged.loc[diverged["point"] == 1, "status"] = "diverged"
    assert select(trial_scores(diverged)).iloc[0]["point"] == 0


def test_poisoned_test_metrics_change_no_selection():
    runs = trial_runs({("PM", p, s): 0.6 + 0.05 * p - 0.01 * s for p in range(3) for s in range(2)})
    poisoned = runs.copy()
    rng = np.random.default_rng(0)
    for column in ("test_accuracy", "test_auc", "test_loss"):
        poisoned[column] = rng.uniform(0, 1, len(runs))
    pd.testing.assert_frame_equal(select(trial_scores(runs)), select(trial_scores(poisoned)))
    assert not any(column.startswith("test_") for column in trial_scores(runs).columns)


def test_the_tuning_cost_sums_the_trials_and_public_tuning_costs_nothing():
    runs = trial_runs({("PM", p, s): 0.7 for p in range(3) for s in range(2)})
    chosen = select(trial_scores(runs)).iloc[0]
    assert chosen["tuning_epsilon_claimed_client_max"] == 6 * 1.0
    assert chosen["tuning_epsilon_worst_case_client_max"] == 6 * 1.5
    public = select(trial_scores(trial_runs({("PM", 0, 0): 0.7}, data="public"))).iloc[0]
    assert public["tuning_epsilon_worst_case_client_max"] == 0 and public["tuning_data"] == "public"


# ---------------------------------------------------------------- final runs
def test_final_runs_use_the_selected_setting_and_keep_their_cells_while_it_stays():
    config = tuned()
    selected = {("syn-S-0.1-0.9", "lr", "np", math.inf): {"learning_rate": 0.3},
                ("syn-S-0.1-0.9", "lr", "pm", 1.0): {"learning_rate": 0.03},
                ("syn-S-0.1-0.9", "lr", "pm", 4.0): {"learning_rate": 0.3}}
    runs = expand(config, selected=selected)
    rates = {(r["label"], r["plan"]["epsilon"]): r["plan"]["training"]["learning_rate"] for r in runs}
    assert rates == {("np", None): 0.3, ("pm", 1.0): 0.03, ("pm", 4.0): 0.3}
    assert all(r["plan"]["training"]["validation_fraction"] == 0 for r in runs)  # final runs train on all clients
    again = expand(config, selected={**selected, ("syn-S-0.1-0.9", "lr", "pm", 1.0): {"learning_rate": 0.3}})
    moved = {r["cell_id"] for r in runs} ^ {r["cell_id"] for r in again}
    assert len(moved) == 2  # only pm at ε = 1 changed cell
    with pytest.raises(ConfigError, match="selected no setting"):
        expand(config, selected={})
