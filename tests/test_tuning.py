"""Tuning: the search space, the trials, the selection and the privacy cost of tuning."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from ldpbench.campaign import campaign_cells, expand, expand_trials, tuned_cell_runs, validate_config
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
def test_trials_are_one_cell_per_configuration_and_epsilon_scored_on_validation_clients():
    config = tuned({"space": {"learning_rate": [0.03, 0.3]}, "validation_fraction": 0.25})
    trials = expand_trials(config)
    # np: 1 ε, pm: 2 ε; 2 points; tuning seed = the campaign's first seed, fold 0.
    assert len(trials) == (1 + 2) * 2
    assert {(t["plan"]["seed"], t["plan"]["fold"]) for t in trials} == {(0, 0)}
    assert all(t["plan"]["training"]["validation_fraction"] == 0.25 for t in trials)
    assert {t["plan"]["training"]["learning_rate"] for t in trials if t["point"] == 1} == {0.3}
    cells = {(t["label"], t["plan"]["epsilon"]): t["cell_id"] for t in trials}
    # Every point of a configuration at one ε in one cell: what its final cell's selection reads.
    assert len(set(cells.values())) == len(cells) == 3
    assert all(sum(t["cell_id"] == cell for t in trials) == 2 for cell in cells.values())
    # Adding a point changes every trial cell of the entry (their runs are stored: only the new point's train).
    more = expand_trials(tuned({"space": {"learning_rate": [0.03, 0.3, 1.0]}, "validation_fraction": 0.25}))
    assert {t["run_id"] for t in trials} < {t["run_id"] for t in more}
    assert not {t["cell_id"] for t in trials} & {t["cell_id"] for t in more}
    # Without tuning, or with an empty space for an entry, there are no trials for it.
    untuned = tuned(mechanisms=[{"name": "np"}, {"name": "pm", "tuning": {"space": {}}}])
    assert {t["label"] for t in expand_trials(untuned)} == {"np"}


def test_a_tuned_final_cell_is_known_before_its_selection_and_changes_only_with_what_it_derives_from():
    config = tuned({"space": {"learning_rate": [0.03, 0.3]}})
    cells = {(cell.phase, cell.label, cell.epsilon): cell for cell in campaign_cells(config)}
    final = cells[("final", "pm", 1.0)]
    assert final.tuned and final.runs == () and final.run_count == 2  # seeds 0 and 1
    assert final.trial_cell == cells[("trial", "pm", 1.0)].cell_id

    def final_ids(change):
        return {(c.label, c.epsilon): c.cell_id for c in campaign_cells(tuned(**change)) if c.phase == "final"}

    before = final_ids({"tuning": {"space": {"learning_rate": [0.03, 0.3]}}})
    # Another ε: only its own cells are new.
    more_epsilons = final_ids({"tuning": {"space": {"learning_rate": [0.03, 0.3]}}, "epsilons": [1, 4, 8]})
    assert {key: more_epsilons[key] for key in before} == before
    # What the selection reads changes (another point, another metric): the tuned cells are new.
    for tuning in ({"space": {"learning_rate": [0.03, 0.3, 1.0]}},
                   {"space": {"learning_rate": [0.03, 0.3]}, "metric": "validation_loss"}):
        changed = final_ids({"tuning": tuning})
        assert all(changed[key] != before[key] for key in before)
    # Its runs, once the trials have selected a point, carry it, at the campaign's seeds, on every training
    # client, in the final cell.
    runs = tuned_cell_runs(config, final, {"learning_rate": 0.3})
    assert [(r["plan"]["seed"], r["plan"]["training"]["learning_rate"], r["cell_id"]) for r in runs] == \
        [(0, 0.3, final.cell_id), (1, 0.3, final.cell_id)]
    assert all(r["plan"]["training"]["validation_fraction"] == 0 for r in runs)


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
def test_expanded_final_runs_use_a_selected_setting_where_one_is_given():
    config = tuned()
    selected = {("syn-S-0.1-0.9", "lr", "np", math.inf): {"learning_rate": 0.3},
                ("syn-S-0.1-0.9", "lr", "pm", 1.0): {"learning_rate": 0.03},
                ("syn-S-0.1-0.9", "lr", "pm", 4.0): {"learning_rate": 0.3}}
    runs = expand(config, selected=selected)
    rates = {(r["label"], r["plan"]["epsilon"]): r["plan"]["training"]["learning_rate"] for r in runs}
    assert rates == {("np", None): 0.3, ("pm", 1.0): 0.03, ("pm", 4.0): 0.3}
    assert all(r["plan"]["training"]["validation_fraction"] == 0 for r in runs)  # final runs train on all clients
    with pytest.raises(ConfigError, match="selected no setting"):
        expand(config, selected={})
