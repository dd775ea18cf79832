"""Validation clients, the public data part and early stopping on a validation plateau."""

import dataclasses

import numpy as np
import pytest
import torch

from ldpbench.data.split import public_indices, run_indices, train_test_indices
from ldpbench.errors import ConfigError
from ldpbench.fl import clients as fl_clients
from ldpbench.fl.hooks import Hook, plateau_reached
from ldpbench.runner import LoadedDataset, load, train

from plans import run_plan

# syn-S: 5,000 records, 4,000 training clients of one record; 40 per round, 100 rounds per epoch.
TRAINING = {"epochs": 1, "batch_fraction": 0.01, "learning_rate": 0.5, "l2": 1e-4, "eval_every": 5}


def plan_of(training=None, seed=0, public_fraction=0.0, data_part="private", mechanism="pm", epsilon=2.0):
    plan = run_plan("syn-S-0.1-0.9", "lr", mechanism, {}, epsilon, seed, 0, 0, 0.2, {**TRAINING, **(training or {})})
    return dataclasses.replace(plan, public_fraction=public_fraction, data_part=data_part)


@pytest.fixture(scope="module")
def data(syn_s):
    return load(syn_s)


# ---------------------------------------------------------------- holding out whole clients
@pytest.mark.parametrize("scheme,clients", [("record", None), ("iid", 50)])
def test_validation_clients_are_whole_clients_of_the_training_split(scheme, clients):
    labels = np.arange(1000) % 2
    partition = fl_clients.partition(scheme, labels, 3, clients)
    held = fl_clients.hold_out_clients(partition, 0.2, seed=3)
    assert held.partition.clients == partition.clients - round(0.2 * partition.clients)
    # Every record is either training or validation, once.
    assert np.array_equal(np.sort(np.concatenate([held.training_records, held.validation_records])), np.arange(1000))
    # The renumbered training partition covers exactly the training records, client by client.
    kept = held.training_records[held.partition.records]
    owners = {int(r): c for c in range(partition.clients)
              for r in partition.records[partition.offsets[c]:partition.offsets[c + 1]]}
    for client in range(held.partition.clients):
        members = kept[held.partition.offsets[client]:held.partition.offsets[client + 1]]
        assert len({owners[int(r)] for r in members}) == 1  # one original client, whole
    validation_owners = {owners[int(r)] for r in held.validation_records}
    assert not validation_owners & {owners[int(r)] for r in kept}
    # Keyed by the seed: the same seed holds out the same clients, another seed others.
    assert np.array_equal(fl_clients.hold_out_clients(partition, 0.2, 3).validation_records, held.validation_records)
    assert not np.array_equal(fl_clients.hold_out_clients(partition, 0.2, 4).validation_records,
                              held.validation_records)


def test_a_validation_fraction_that_leaves_no_client_on_either_side_is_refused():
    partition = fl_clients.partition("iid", np.zeros(100), 0, 3)
    with pytest.raises(ConfigError, match="training.validation_fraction"):
        fl_clients.hold_out_clients(partition, 0.1, 0)  # round(0.3) = 0 validation clients
    with pytest.raises(ConfigError, match="training.validation_fraction"):
        fl_clients.hold_out_clients(partition, 0.9, 0)  # all three would validate


def test_a_run_with_validation_clients_trains_on_fewer_and_scores_them(data):
    plain = train(plan_of(), data)
    validated = train(plan_of({"validation_fraction": 0.25}), data)
    assert validated.sizes["clients"] == plain.sizes["clients"] - 1000
    assert validated.sizes["validation_records"] == 1000 and plain.sizes["validation_records"] == 0
    assert validated.sizes["test_records"] == plain.sizes["test_records"]
    assert len(validated.client_ids) == validated.sizes["clients"]  # the ledger lists training clients only
    final = validated.result.final
    assert 0.5 < final["validation_accuracy"] <= 1 and np.isfinite(final["validation_loss"])
    assert np.isnan(plain.result.final["validation_accuracy"])


def test_a_poisoned_test_split_changes_no_validation_score(data):
    """Selection reads validation scores only: flipping every test label must leave them untouched."""
    _, test = train_test_indices(len(data.labels), 0, 0, 0, 0.2)
    poisoned_labels = data.labels.clone()
    poisoned_labels[torch.from_numpy(test)] = 1 - poisoned_labels[torch.from_numpy(test)]
    poisoned = LoadedDataset(data.features, poisoned_labels, data.meta, data.natural_clients)
    plan = plan_of({"validation_fraction": 0.25})
    clean, dirty = train(plan, data).result, train(plan, poisoned).result
    for metric in ("validation_accuracy", "validation_auc", "validation_loss", "train_loss"):
        assert [p[metric] for p in clean.curve] == [p[metric] for p in dirty.curve]
    # Power: the poison does reach the test metrics.
    assert clean.final["test_accuracy"] + dirty.final["test_accuracy"] == pytest.approx(1.0)


# ---------------------------------------------------------------- the public part
def test_the_public_part_is_the_same_for_every_seed_and_disjoint_from_every_run_split():
    public, private = public_indices(1000, 0.1)
    assert len(public) == 100 and not set(public) & set(private) and len(public) + len(private) == 1000
    for seed in range(3):
        train_idx, test_idx = run_indices(1000, seed, 0, 0, 0.2, public_fraction=0.1)
        assert not set(public) & (set(train_idx) | set(test_idx))
        assert len(train_idx) + len(test_idx) == 900
        public_train, public_test = run_indices(1000, seed, 0, 0, 0.2, public_fraction=0.1, data_part="public")
        assert np.array_equal(public_train, public) and len(public_test) == 0
    # Without a public part the split is exactly the usual one.
    assert all(np.array_equal(a, b) for a, b in zip(run_indices(1000, 5, 0, 0, 0.2), train_test_indices(1000, 5)))


def test_a_run_on_the_public_part_has_no_test_metrics(data):
    result = train(plan_of({"validation_fraction": 0.2}, public_fraction=0.2, data_part="public"), data)
    assert result.sizes["test_records"] == 0 and result.sizes["records"] + result.sizes["validation_records"] == 1000
    assert np.isnan(result.result.final["test_accuracy"]) and result.result.status == "ok"
    assert np.isfinite(result.result.final["validation_accuracy"])


# ---------------------------------------------------------------- early stopping
@pytest.mark.parametrize("values,patience,min_delta,minimise,expected", [
    ([0.5, 0.6, 0.6, 0.6], 2, 0.0, False, True),  # two evaluations without a gain
    ([0.5, 0.6, 0.6, 0.7], 2, 0.0, False, False),  # a gain resets the count
    ([0.5, 0.6, 0.61, 0.62], 2, 0.05, False, True),  # gains within min_delta do not count
    ([1.0, 0.8, 0.9, 0.85], 2, 0.0, True, True),  # a loss must fall
    ([1.0, 0.8, 0.9, 0.7], 2, 0.0, True, False),
    ([float("nan"), 0.5, float("nan"), 0.5], 2, 0.0, False, True),  # NaN never improves
])
def test_plateau_logic(values, patience, min_delta, minimise, expected):
    assert plateau_reached(values, patience, min_delta, minimise) is expected


# PM at ε = 8 improves the validation loss for about 50 rounds, then wanders.
STOPPING = {"validation_fraction": 0.2, "rounds": 300, "eval_every": 2, "learning_rate": 0.1,
            "stop": {"patience": 3, "min_delta": 0.002, "metric": "validation_loss"}}


def test_early_stopping_ends_the_run_on_a_plateau_and_is_deterministic(data):
    first, second = (train(plan_of(STOPPING, epsilon=8.0), data).result for _ in range(2))
    assert first.stopped_early and 20 < first.final["rounds"] < 300
    assert first.curve == second.curve and first.final["rounds"] == second.final["rounds"]
    # The stop is where the plateau is: the last `patience` evaluations brought no gain, earlier ones did.
    losses = [point["validation_loss"] for point in first.curve]
    assert plateau_reached(losses, 3, 0.002, True) and not plateau_reached(losses[:-1], 3, 0.002, True)
    # Power: without the stop the run trains every planned round.
    unstopped = train(plan_of({**STOPPING, "stop": None}, epsilon=8.0), data).result
    assert not unstopped.stopped_early and unstopped.final["rounds"] == 300


class Crash(Hook):
    def __init__(self, at_round):
        self.at_round = at_round

    def on_round_end(self, state):
        if state.round == self.at_round:
            raise KeyboardInterrupt("killed")


def test_a_stopped_run_resumed_from_its_checkpoint_ends_where_an_uninterrupted_one_does(data, tmp_path, monkeypatch):
    from ldpbench.fl import engine

    settings = {**STOPPING, "checkpoint_every": 4}
    reference = train(plan_of(settings, epsilon=8.0), data).result
    assert reference.stopped_early
    checkpoint = tmp_path / "run.pt"
    crash_round = (reference.final["rounds"] // 8) * 4  # a checkpointed round before the stop
    original_init = engine.FederatedTrainer.__init__

    def with_crash(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.hooks.append(Crash(crash_round))

    monkeypatch.setattr(engine.FederatedTrainer, "__init__", with_crash)
    with pytest.raises(KeyboardInterrupt):
        train(plan_of(settings, epsilon=8.0), data, checkpoint)
    monkeypatch.setattr(engine.FederatedTrainer, "__init__", original_init)
    assert checkpoint.exists()
    resumed = train(plan_of(settings, epsilon=8.0), data, checkpoint).result
    assert resumed.curve == reference.curve and resumed.stopped_early
    assert resumed.final["rounds"] == reference.final["rounds"]
