"""The run plan: fully resolved, canonical, read back with clear errors; training defaults in one place."""

import dataclasses
import json
import math

import pytest
import yaml

from ldpbench.campaign import DEFAULT_SCHEMA
from ldpbench.errors import ConfigError
from ldpbench.fl.settings import PartitionSettings, TrainingSettings
from ldpbench.plan import NETWORK_PARAMS_KEY, RunPlan

from plans import run_plan

TRAINING_SCHEMA = yaml.safe_load(DEFAULT_SCHEMA.read_text())["properties"]["training"]


def _defaults_below(schema, path):
    for key, value in schema.items():
        if key == "default":
            yield path
        elif isinstance(value, dict):
            yield from _defaults_below(value, [*path, key])


def test_schema_carries_no_training_defaults():
    """TrainingSettings is the one home of training defaults; the schema keeps types, bounds and text."""
    assert list(_defaults_below(TRAINING_SCHEMA["properties"], ["training"])) == []


def test_schema_and_training_settings_name_the_same_settings():
    fields = {field.name for field in dataclasses.fields(TrainingSettings)}
    assert set(TRAINING_SCHEMA["properties"]) == fields | {NETWORK_PARAMS_KEY}
    partition = {field.name for field in dataclasses.fields(PartitionSettings)}
    assert set(TRAINING_SCHEMA["properties"]["partition"]["properties"]) == partition


def test_a_plan_is_fully_resolved_and_reads_back_equal():
    plan = run_plan("syn-S-0.1-0.9", "mlp", "ps-pm", {"mu": 0.2}, 2.0, 3, 1, 5, 0.0,
                    {"epochs": 2, "partition": {"scheme": "iid", "clients": 10}})
    assert plan.network_params == {"hidden": [1500, 1500]}  # the network's default, in its JSON form
    assert plan.mechanism_params["mu"] == 0.2 and plan.mechanism_params["k_fraction"] == 0.1
    assert plan.training == TrainingSettings(epochs=2, partition=PartitionSettings("iid", 10))
    assert plan.training.learning_rate == 0.1
    assert RunPlan.from_json(plan.canonical_json()) == plan
    assert json.loads(plan.canonical_json()) == plan.to_dict()
    assert plan.canonical_json() == json.dumps(plan.to_dict(), sort_keys=True, separators=(",", ":"))
    # A value written out equal to its default is the same plan, so the same run.
    explicit = run_plan("syn-S-0.1-0.9", "mlp", "ps-pm", {"mu": 0.2, "k_fraction": 0.1}, 2.0, 3, 1, 5, 0.0,
                        {"epochs": 2, "learning_rate": 0.1, "partition": {"scheme": "iid", "clients": 10},
                         NETWORK_PARAMS_KEY: {"hidden": [1500, 1500]}})
    assert explicit.run_id == plan.run_id
    # The id is computed once per plan; a plan derived from it gets its own.
    reseeded = dataclasses.replace(plan, seed=4)
    assert reseeded.run_id != plan.run_id and reseeded.canonical_json() != plan.canonical_json()
    assert reseeded.run_id == run_plan("syn-S-0.1-0.9", "mlp", "ps-pm", {"mu": 0.2}, 2.0, 4, 1, 5, 0.0,
                                       {"epochs": 2, "partition": {"scheme": "iid", "clients": 10}}).run_id


@pytest.mark.parametrize("text,message", [
    ("{not json", r"not a valid run plan: Expecting property name"),
    ("[1]", r"a run plan must be a JSON object, got list"),
    ('{"dataset": "d"}', r"not a valid run plan: missing keys \['data_part', 'epsilon', 'features'"),
])
def test_from_json_names_what_is_wrong(text, message):
    with pytest.raises(ConfigError, match=message):
        RunPlan.from_json(text)


@pytest.mark.parametrize("change,message", [
    ({"training": {"learnin_rate": 0.1}}, r"training has no setting\(s\) \['learnin_rate'\]"),
    ({"training": {"partition": {"scheme": "iid", "shards": 2}}},
     r"training.partition has no setting\(s\) \['shards'\]"),
    ({"training": {"algorithm": "fedprox"}}, r"training.algorithm must be one of"),
    ({"training": 3}, r"'training' must be an object"),
    ({"training": {"gradients": "formula"}}, r"training.gradients must be one of"),
    ({"model": "mlp", "network_params": {"hidden": [4]}, "training": {"gradients": "closed-form"}},
     r"training.gradients is 'closed-form' but network 'mlp' has no formula"),
    ({"model": "lenet5", "network_params": {}, "training": {"gradients": "fused"}},
     r"training.gradients is 'fused' but network 'lenet5' does not fuse its gradients"),
])
def test_from_dict_rejects_bad_training(change, message):
    plan = run_plan("syn-S-0.1-0.9", "lr", "pm", {}, 1.0, 0, 0, 0, 0.2, {})
    with pytest.raises(ConfigError, match=message):
        RunPlan.from_dict({**plan.to_dict(), **change})


@pytest.mark.parametrize("mechanism,training,expected", [
    ("pm", {"epochs": 4}, 2.0 / 4),  # a total budget over the one report per epoch
    ("pm", {"epochs": 4, "epsilon_scope": "per_report"}, 2.0),
    ("pm", {"epochs": 2, "sampler": "uniform", "rounds": 7}, 2.0 / 7),  # one report per round at most
    ("bitrand", {"epochs": 4}, 2.0),  # a data release: one report per client
])
def test_epsilon_per_report_is_the_plans_one_rule(mechanism, training, expected):
    plan = run_plan("syn-S-0.1-0.9", "lr", mechanism, {}, 2.0, 0, 0, 0, 0.2, training)
    assert plan.epsilon_per_report(clients=1000) == expected


def test_a_non_private_plan_has_an_infinite_budget_per_report():
    plan = run_plan("syn-S-0.1-0.9", "lr", "np", {}, None, 0, 0, 0, 0.2, {"epochs": 3})
    assert plan.epsilon_value == math.inf and plan.epsilon_per_report(1000) == math.inf
