"""The federated engine: per-client updates against plain loops, chunk/thread invariance, resume,
partitions and samplers, AUC."""

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from ldpbench import mechanisms
from ldpbench.errors import ConfigError
from ldpbench.fl import algorithms, engine, strategies
from ldpbench.fl import clients as fl_clients
from ldpbench.fl.engine import ClientData, FederatedTrainer, can_train_together, together_limit, train_together
from ldpbench.fl.hooks import Hook
from ldpbench.fl.metrics import area_under_curve, positive_rank_sum
from ldpbench.fl.model import FlatModel, build_network
from ldpbench.fl.settings import TrainingSettings
from ldpbench.fl.strategies import STEP_STRATEGIES, JointPrivatisation, SequentialPrivatisation, step_strategy
from ldpbench.layout import run_file
from ldpbench.rng import ClientStreams

from plans import run_plan


def image_data(records=48, classes=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    features = torch.randint(0, 256, (records, 1, 28, 28), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, classes, (records,), generator=gen)
    return features, labels


def trainer(network_name, mechanism_name, config, records=48, classes=4, partition=None, epsilon=4.0,
            seed=0, **kwargs):
    features, labels = image_data(records, classes)
    partition = partition or fl_clients.partition("iid", labels.numpy(), seed, clients=8)
    network = build_network(network_name, (1, 28, 28), classes, seed, {"hidden": [16]} if network_name == "mlp" else {})
    dims = FlatModel(network).dims
    mechanism = None if mechanism_name is None else \
        mechanisms.create(mechanism_name, epsilon, dims, cohort_size=config.cohort(partition.clients))
    return FederatedTrainer(network, mechanism, ClientData(features, labels, partition),
                            features[:16], labels[:16], config, seed, **kwargs)


@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
def test_without_an_update_mechanism_rounds_aggregate_the_mean_as_np_does(algorithm):
    """A data release leaves the rounds without an update mechanism: its runs must train exactly as
    they did with the non-private stand-in `np` (reports = updates, aggregate = mean)."""
    config = TrainingSettings(learning_rate=0.05, cohort_size=3, rounds=4, algorithm=algorithm, eval_every=2)
    with_np_result = trainer("softmax", "np", config).run()
    without_result = trainer("softmax", None, config).run()
    assert torch.equal(with_np_result.weights, without_result.weights)
    assert with_np_result.curve == without_result.curve
    assert torch.equal(with_np_result.reports_per_client, without_result.reports_per_client)


def reference_client_gradient(network, weights, inputs, targets, l2):
    """One client at a time, with ordinary autograd: mean loss gradient + l2·w."""
    flat = FlatModel(network)
    w = weights.clone().requires_grad_(True)
    loss = network.per_example_loss(flat.outputs(w, inputs), targets).mean()
    return torch.autograd.grad(loss, w)[0] + l2 * weights


@pytest.mark.parametrize("network_name", ["softmax", "mlp", "lenet5"])
def test_fedsgd_updates_equal_a_per_client_loop(network_name):
    config = TrainingSettings(learning_rate=0.1, cohort_size=8, block_records=4, l2=0.01)
    run = trainer(network_name, "np", config)
    weights = run.model.initial(zero=False) + 0.01
    ids = torch.arange(8)
    updates = run.algorithm.updates(weights, ids, 1)
    for row, client in enumerate(ids.tolist()):
        records = run.data.client_records(client)
        expected = reference_client_gradient(run.model.network, weights, run.data.features[records].float() / 255,
                                             run.data.labels[records], config.l2)
        torch.testing.assert_close(updates[row], expected, rtol=1e-4, atol=1e-6)


def test_fedsgd_client_batches_are_fresh_keyed_samples_of_the_clients_records():
    """client_batch_size R: each client's gradient is over R distinct records of its own, drawn by
    its keyed stream (the same whatever the cohort), and a fresh draw every round."""
    config = TrainingSettings(learning_rate=0.1, cohort_size=8, client_batch_size=3, l2=0.01)
    run = trainer("softmax", "np", config, records=64)
    weights = run.model.initial(zero=False) + 0.01
    ids = torch.arange(8)
    record_ids, mask, _, counts = run.algorithm.units(ids, 5)
    assert record_ids.shape == (8, 3) and bool(mask.all()) and counts.tolist() == [3] * 8
    updates = run.algorithm.updates(weights, ids, 5)
    for row, client in enumerate(ids.tolist()):
        own = set(run.data.client_records(client).tolist())
        chosen = record_ids[row]
        assert len(set(chosen.tolist())) == 3 and set(chosen.tolist()) <= own
        expected = reference_client_gradient(run.model.network, weights, run.data.features[chosen].float() / 255,
                                             run.data.labels[chosen], config.l2)
        torch.testing.assert_close(updates[row], expected, rtol=1e-4, atol=1e-6)
    # Keyed per client: a client's sample does not depend on who else is in the cohort ...
    alone, _, _, _ = run.algorithm.units(ids[5:6], 5)
    assert torch.equal(alone[0], record_ids[5])
    # ... and changes from round to round (power: a fixed batch would fail this).
    later, _, _, _ = run.algorithm.units(ids, 6)
    assert not torch.equal(later, record_ids)
    # A client with fewer than R records uses all of them once.
    small = trainer("softmax", "np", TrainingSettings(learning_rate=0.1, cohort_size=8, client_batch_size=50),
                    records=64)
    _, small_mask, _, small_counts = small.algorithm.units(ids, 0)
    sizes = small.data.offsets[1:] - small.data.offsets[:-1]
    assert torch.equal(small_counts, sizes) and torch.equal(small_mask.sum(1), sizes)


def test_fedavg_updates_equal_a_per_client_loop():
    config = TrainingSettings(learning_rate=1.0, algorithm="fedavg", cohort_size=8, local_epochs=2,
                            local_batch_size=4, local_learning_rate=0.05, l2=0.01)
    run = trainer("mlp", "np", config)
    weights = run.model.initial(zero=False)
    ids = torch.arange(8)
    deltas = run.algorithm.updates(weights, ids, 3)
    network, flat = run.model.network, run.model
    sizes = (run.data.offsets[1:] - run.data.offsets[:-1])
    longest = int(sizes.max())
    for row, client in enumerate(ids.tolist()):
        records = run.data.client_records(client)
        local = weights.clone()
        for local_epoch in range(config.local_epochs):
            # The same keyed stream the engine uses: this client's keys, whatever the cohort.
            keys = ClientStreams((0, 3, "local shuffle", local_epoch), ids).rand((8, longest), torch.float64)[row]
            order = torch.argsort(keys[: len(records)], stable=True)
            for batch in order.split(config.local_batch_size):
                w = local.clone().requires_grad_(True)
                inputs = run.data.features[records[batch]].float() / 255
                loss = network.per_example_loss(flat.outputs(w, inputs), run.data.labels[records[batch]]).mean()
                loss = loss + 0.5 * config.l2 * w.dot(w)
                local = local - config.local_learning_rate * torch.autograd.grad(loss, w)[0]
        torch.testing.assert_close(deltas[row], local - weights, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algorithm,network_name,mechanism_name", [
    ("fedsgd", "lenet5", "pm"),
    ("fedsgd", "softmax", "ps-pm"),   # stateful: per-client residuals
    ("fedavg", "mlp", "pm"),
])
def test_chunks_of_1_7_and_all_give_the_same_run(algorithm, network_name, mechanism_name):
    """Same cohorts, same draws, same reports up to float rounding of the model's batched kernels.

    Every random draw and every mechanism output is chunk-invariant bit for bit (the contract
    suite checks each mechanism); the network's forward/backward runs through BLAS/oneDNN kernels
    whose last bits depend on the batch shape, so the final weights agree to float32 rounding.
    """
    config = dict(learning_rate=0.05, algorithm=algorithm, cohort_size=10, rounds=4, eval_every=2,
                  block_records=3, local_batch_size=4, sampler="uniform")
    labels = image_data(60)[1].numpy()
    partition = fl_clients.partition("dirichlet", labels, 0, clients=12, alpha=0.5)
    finals = {}
    for chunk in (1, 7, 0):
        run = trainer(network_name, mechanism_name, TrainingSettings(**config, chunk_clients=chunk),
                      records=60, partition=partition)
        result = run.run()
        assert result.status == "ok"
        finals[chunk] = (result.weights, pd.DataFrame(result.curve))
    for chunk in (1, 7):
        torch.testing.assert_close(finals[chunk][0], finals[0][0], rtol=1e-4, atol=1e-6)
        pd.testing.assert_frame_equal(finals[chunk][1], finals[0][1], rtol=1e-4)
    # Power: another seed's run is far from these weights.
    other = trainer(network_name, mechanism_name, TrainingSettings(**config), records=60,
                    partition=partition, seed=1).run()
    assert not torch.allclose(other.weights, finals[0][0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algorithm,network_name,mechanism_name", [
    ("fedsgd", "softmax", "pm"),
    ("fedsgd", "softmax", "fedsel"),  # stateful: per-client residuals
    ("fedavg", "mlp", "diffsketch"),  # corrects the aggregate with each worker's own update
    ("fedavg", "softmax", "np"),
])
def test_runs_trained_together_give_each_run_its_own_numbers(algorithm, network_name, mechanism_name):
    """train_together privatises several runs' cohorts in one call (the "joint" step strategy); each
    run's curve, weights and report counts are bit for bit those of the run alone, including a run
    that stops early (it leaves the group) and one whose seed is another's (the same numbers twice).
    So are those of the "sequential" strategy, each run's own step in turn."""
    config = TrainingSettings(learning_rate=0.05, algorithm=algorithm, cohort_size=5, rounds=6, eval_every=2,
                              block_records=3, local_batch_size=4)

    def runs():
        hooks = {1: [RoundRecorder(stop_after=3)]}
        return [trainer(network_name, mechanism_name, config, epsilon=8.0, seed=seed, hooks=hooks.get(index, []))
                for index, seed in enumerate((0, 1, 2, 0))]

    alone = runs()
    alone_results = [run.run() for run in alone]
    together = runs()
    assert all(can_train_together(together[0], run) for run in together)
    together_results = train_together(together)
    assert [result.final["rounds"] for result in together_results] == [6, 3, 6, 6]
    in_turn = runs()
    for runs_, results in ((together, together_results), (in_turn, train_together(in_turn, "sequential"))):
        for run, result, own_run, own in zip(runs_, results, alone, alone_results, strict=True):
            assert torch.equal(result.weights, own.weights)
            assert result.curve == own.curve and result.status == own.status
            assert torch.equal(result.reports_per_client, own.reports_per_client)
            if run.client_state is not None:
                assert torch.equal(run.client_state.memory, own_run.client_state.memory)
    # Power: the runs of other seeds moved elsewhere.
    assert not torch.equal(together_results[0].weights, together_results[2].weights)


def test_the_step_strategies_use_only_the_trainers_public_round_api():
    """A strategy composes rounds from the trainer's public round API (strategies.RoundTrainer): no
    attribute it reads or calls is private."""
    tree = ast.parse(Path(strategies.__file__).read_text(encoding="utf-8"))
    private = {node.attr for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__")}
    assert not private, f"fl/strategies.py reaches into private attributes: {sorted(private)}"


def test_step_strategies_are_chosen_by_name():
    assert sorted(STEP_STRATEGIES) == ["joint", "sequential"]
    assert isinstance(step_strategy("joint"), JointPrivatisation)
    assert isinstance(step_strategy("sequential"), SequentialPrivatisation)
    with pytest.raises(ValueError, match="unknown step strategy 'parallel'; known: joint, sequential"):
        step_strategy("parallel")


def test_which_runs_train_together_is_decided_from_their_shapes(monkeypatch):
    config = TrainingSettings(learning_rate=0.05, cohort_size=5, rounds=2)
    first = trainer("softmax", "pm", config)
    values = 5 * first.model.dims  # a round's updates: 5 clients × 3,140 weights
    assert together_limit(first) == engine.TOGETHER_MAX_RUNS < engine.TOGETHER_MAX_VALUES // values
    monkeypatch.setattr(engine, "TOGETHER_MAX_VALUES", 3 * values + 1)
    assert together_limit(first) == 3
    assert can_train_together(first, trainer("softmax", "pm", config, seed=3))
    assert not can_train_together(first, trainer("softmax", "pm", config, epsilon=2.0))  # another ε
    assert not can_train_together(first, trainer("softmax", "hm", config))
    chunked = trainer("softmax", "pm", TrainingSettings(learning_rate=0.05, cohort_size=5, rounds=2, chunk_clients=2))
    assert together_limit(chunked) == 1 and not can_train_together(first, chunked)
    assert together_limit(trainer("softmax", None, config)) == 1  # no mechanism: nothing to privatise together
    monkeypatch.setattr(engine, "TOGETHER_MAX_VALUES", 2 * values - 1)  # a round too large to gain
    assert together_limit(first) == 1 and not can_train_together(first, trainer("softmax", "pm", config, seed=3))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="same mechanism"):
        train_together([first, trainer("softmax", "pm", config, epsilon=2.0)])


def test_a_training_split_read_through_its_rows_gives_the_run_of_its_copy():
    """The runner passes the whole dataset and the split's rows (no copy of the split per run): the
    gradients, the training-loss sample and so every number are those of the copied split."""
    features, labels = image_data(80)
    rows = torch.randperm(80, generator=torch.Generator().manual_seed(3))[:48]
    partition = fl_clients.partition("iid", labels[rows].numpy(), 0, clients=8)
    config = TrainingSettings(learning_rate=0.05, cohort_size=4, rounds=4, eval_every=2, eval_train_records=20)
    runs = {}
    for name, data in (("copy", ClientData(features[rows], labels[rows], partition)),
                       ("rows", ClientData(features, labels, partition, rows=rows))):
        run = FederatedTrainer(build_network("softmax", (1, 28, 28), 4, 0), mechanisms.create("pm", 4.0, 3140),
                               data, features[:16], labels[:16], config, 0)
        runs[name] = (run, run.run())
    assert torch.equal(runs["copy"][1].weights, runs["rows"][1].weights)
    assert runs["copy"][1].curve == runs["rows"][1].curve
    # Power: the dataset's first 48 rows in place of the split train elsewhere.
    wrong = FederatedTrainer(build_network("softmax", (1, 28, 28), 4, 0), mechanisms.create("pm", 4.0, 3140),
                             ClientData(features, labels, partition, rows=torch.arange(48)), features[:16],
                             labels[:16], config, 0).run()
    assert not torch.equal(wrong.weights, runs["rows"][1].weights)


def test_thread_count_does_not_change_the_numbers():
    config = TrainingSettings(learning_rate=0.05, cohort_size=8, rounds=3, block_records=4)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append(trainer("mlp", "pm", config).run().weights)
    assert torch.equal(*results)


def test_state_spilled_to_disk_gives_the_same_run(tmp_path):
    config = TrainingSettings(learning_rate=0.05, cohort_size=8, rounds=3, block_records=4)
    in_memory = trainer("softmax", "ps-pm", config).run()
    on_disk = trainer("softmax", "ps-pm", config, checkpoint_path=tmp_path / "run.pt",
                      state_memory_limit_bytes=1)
    assert on_disk.client_state.memory is None and (tmp_path / "run.state.npy").exists()
    assert torch.equal(in_memory.weights, on_disk.run().weights)


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint_to_the_same_numbers(syn_s, tmp_path):
    training = {"epochs": 12, "batch_fraction": 0.01, "learning_rate": 0.1, "eval_every": 50,
                "checkpoint_every": 20}
    spec = run_plan("syn-S-0.1-0.9", "lr", "ps-pm", {}, 8.0, 0, 0, 0, 0.2, training)
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"cell_id": "0123456789abcdef", "phase": "final",
                                 "runs": [{"run_id": spec.run_id, "plan": spec.to_dict()}]}))
    command = [sys.executable, "-m", "ldpbench", "run-cell", "--cell", str(plans), "--prepared", str(syn_s),
               "--checkpoint-dir", str(tmp_path / "checkpoints"), "--marker", str(tmp_path / "marker.json")]
    checkpoint = tmp_path / "checkpoints" / f"{spec.run_id}.pt"
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    victim = subprocess.Popen([*command, "--runs-root", str(killed)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    saved_round = torch.load(checkpoint, weights_only=True)["round"]
    assert 0 < saved_round < 1200
    resumed = subprocess.run([*command, "--runs-root", str(killed)], check=True,
                             stderr=subprocess.PIPE, text=True)
    assert f"at round {saved_round} of 1200" in resumed.stderr
    assert not checkpoint.exists(), "a finished run leaves no checkpoint behind"
    uncheckpointed = [part for part in command if part not in ("--checkpoint-dir", str(tmp_path / "checkpoints"))]
    subprocess.run([*uncheckpointed, "--runs-root", str(whole)], check=True, stderr=subprocess.DEVNULL)
    for kind in ("curves", "ledgers"):
        where = (kind, "syn-S-0.1-0.9", "ps-pm", "final", spec.run_id)
        pd.testing.assert_frame_equal(pd.read_parquet(run_file(killed, *where)),
                                      pd.read_parquet(run_file(whole, *where)))


def test_divergence_stops_the_run_and_is_recorded():
    config = TrainingSettings(learning_rate=1e38, cohort_size=8, rounds=20, eval_every=5)
    result = trainer("mlp", "pm", config).run()
    assert result.status == "diverged" and result.final["rounds"] < 20


def test_partitions_assign_every_record_once():
    labels = np.repeat(np.arange(5), 200)
    for scheme, kwargs in [("record", {}), ("iid", {"clients": 7}), ("dirichlet", {"clients": 20, "alpha": 0.1}),
                           ("natural", {"natural_ids": np.arange(1000) % 13 * 10})]:
        part = fl_clients.partition(scheme, labels, 0, **kwargs)
        assert sorted(part.records.tolist()) == list(range(1000)), scheme
        assert part.offsets[-1] == 1000 and (np.diff(part.offsets) >= 0).all()
    iid = fl_clients.partition("iid", labels, 0, clients=7)
    assert iid.sizes.max() - iid.sizes.min() <= 1
    natural = fl_clients.partition("natural", labels, 0, natural_ids=np.arange(1000) % 13 * 10)
    assert natural.clients == 13
    # Label skew: with α = 0.1 most clients are dominated by one class; iid clients are not.
    def dominant_share(part):
        shares = [np.bincount(labels[part.records[a:b]], minlength=5).max() / max(b - a, 1)
                  for a, b in zip(part.offsets[:-1], part.offsets[1:]) if b > a]
        return float(np.median(shares))
    assert dominant_share(fl_clients.partition("dirichlet", labels, 0, clients=20, alpha=0.1)) > 0.6
    assert dominant_share(fl_clients.partition("iid", labels, 0, clients=20)) < 0.4


def test_natural_partition_needs_client_ids():
    with pytest.raises(Exception, match="natural"):
        fl_clients.partition("natural", np.zeros(10, dtype=np.int64), 0)


def test_epoch_sampler_takes_every_client_once_per_epoch():
    seen = {}
    for _round_index, epoch, cohort in fl_clients.cohorts("epoch", 103, 10, 30, seed=1):
        seen.setdefault(epoch, []).extend(cohort.tolist())
    assert sorted(seen) == [0, 1, 2]
    assert all(sorted(ids) == list(range(103)) for ids in seen.values())
    uniform = [c for _, _, c in fl_clients.cohorts("uniform", 50, 10, 5, seed=1)]
    assert all(len(set(c.tolist())) == 10 for c in uniform) and not torch.equal(uniform[0], uniform[1])


def test_a_client_takes_part_in_one_round_per_epoch_or_in_every_round_of_the_uniform_sampler():
    """The engine's number a mechanism's reports_bound is given (mechanisms never see the settings)."""
    assert TrainingSettings(epochs=3).most_rounds_per_client(1000) == 3
    assert TrainingSettings(rounds=250, cohort_size=10).most_rounds_per_client(100) == 25  # 10 rounds an epoch
    assert TrainingSettings(rounds=7, sampler="uniform").most_rounds_per_client(100) == 7


def test_area_under_curve_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (500,), generator=gen)
    scores = torch.softmax(torch.randn(500, 3, generator=gen) + torch.nn.functional.one_hot(labels, 3), 1)
    expected = roc_auc_score(labels.numpy(), scores.numpy(), multi_class="ovr", average="macro")
    assert area_under_curve(scores, labels, "multiclass") == pytest.approx(expected, abs=1e-12)
    binary = (labels == 1).long()
    rounded = torch.round(scores[:, 1] * 10) / 10  # ties count one half
    assert area_under_curve(rounded, binary, "binary") == pytest.approx(
        roc_auc_score(binary.numpy(), rounded.numpy()), abs=1e-12)


@pytest.mark.parametrize("values", [
    np.array([0.3, 0.1, 0.3, 0.2, 0.3, 0.1]),  # ties, unsorted
    np.round(np.random.default_rng(0).normal(size=1000), 1),  # many ties
    np.round(np.random.default_rng(2).normal(size=20000), 2),  # many ties, large enough for a sort's SIMD paths
    np.r_[np.zeros(500), -np.zeros(500), np.ones(17)],  # −0 ties 0
    np.random.default_rng(1).normal(size=257),  # none
    np.array([5.0]),
])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_positives_rank_sum_is_that_of_scipys_rankdata_bit_for_bit(values, dtype):
    """In float32 too (sorted in their own dtype: the ranks of their exact float64 copies)."""
    from scipy.stats import rankdata

    values = values.astype(dtype)
    for positive in (np.random.default_rng(len(values)).random(len(values)) < 0.3, np.ones(len(values), bool)):
        assert positive_rank_sum(values, positive) == rankdata(values.astype(np.float64))[positive].sum()


CHECKPOINTED = TrainingSettings(learning_rate=0.05, cohort_size=4, rounds=6, block_records=4,
                              checkpoint_every=2)


def _checkpoint_of(path, seed, rounds_done=2):
    """A genuine checkpoint at `path`, as a run of `seed` writes it after `rounds_done` rounds."""
    run = trainer("softmax", "ps-pm", CHECKPOINTED, seed=seed, checkpoint_path=path)
    weights = run.initial_weights() + 0.5
    run.checkpoint.save(rounds_done, weights, torch.ones(run.partition.clients, dtype=torch.int64),
                        [{"round": 0, "epoch": 0, **run.evaluate(weights)}], run.client_state.snapshot())
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another run's"])
def test_an_unusable_checkpoint_is_set_aside_and_the_run_starts_afresh(tmp_path, caplog, damage):
    fresh_result = trainer("softmax", "ps-pm", CHECKPOINTED).run()
    checkpoint = tmp_path / "run.pt"
    if damage == "garbage":
        bad = b"not a checkpoint\n" * 10
    elif damage == "truncated":
        bad = _checkpoint_of(checkpoint, seed=0)[:-300]
    else:
        bad = _checkpoint_of(checkpoint, seed=1)  # loads fine, but another run's weights and state
    checkpoint.write_bytes(bad)
    run = trainer("softmax", "ps-pm", CHECKPOINTED, checkpoint_path=checkpoint)
    with caplog.at_level("WARNING", logger="ldpbench"):
        result = run.run()
    assert torch.equal(result.weights, fresh_result.weights)
    pd.testing.assert_frame_equal(pd.DataFrame(result.curve), pd.DataFrame(fresh_result.curve))
    set_aside = list(tmp_path.glob("run.pt.corrupt-*"))
    assert len(set_aside) == 1 and set_aside[0].read_bytes() == bad and not checkpoint.exists()
    assert f"checkpoint '{checkpoint}' cannot be resumed" in caplog.text and str(set_aside[0]) in caplog.text


def test_a_checkpoint_of_another_gradients_arithmetic_is_not_resumed(tmp_path, monkeypatch, caplog):
    """training.gradients: auto resolves by the code's version (the MLP's per-client arithmetic became
    fused): a run interrupted under one must restart under the other, not continue in a mix."""
    config = TrainingSettings(learning_rate=0.05, algorithm="fedavg", cohort_size=4, rounds=6, local_batch_size=16,
                              checkpoint_every=2)
    checkpoint = tmp_path / "run.pt"
    with monkeypatch.context() as older_code:
        older_code.setattr(algorithms, "resolve_gradients", lambda requested, network, records: "per-client")
        older = trainer("mlp", "np", config, records=160, checkpoint_path=checkpoint)
    assert older.algorithm.gradients == "per-client"
    weights = older.initial_weights()  # as after 2 rounds of the older run (any weights: it is set aside)
    older.checkpoint.save(2, weights, torch.ones(older.partition.clients, dtype=torch.int64),
                          [{"round": 0, "epoch": 0, **older.evaluate(weights)}], None)
    fresh = trainer("mlp", "np", config, records=160).run()
    with caplog.at_level("WARNING", logger="ldpbench"):
        resumed = trainer("mlp", "np", config, records=160, checkpoint_path=checkpoint).run()
    assert fresh.final["gradients"] == resumed.final["gradients"] == "fused"
    assert torch.equal(resumed.weights, fresh.weights)
    assert "cannot be resumed" in caplog.text and len(list(tmp_path.glob("run.pt.corrupt-*"))) == 1


class RoundRecorder(Hook):
    """A hook that records the rounds it sees and stops the loop after `stop_after`."""

    def __init__(self, stop_after):
        self.started, self.rounds, self.ended, self.stop_after = False, [], False, stop_after

    def on_start(self, state):
        self.started = True

    def on_round_end(self, state):
        self.rounds.append((state.round, state.metrics is not None, len(state.curve)))

    def should_stop(self, state):
        return state.round >= self.stop_after

    def on_end(self, state):
        self.ended = True


def test_a_hook_sees_the_rounds_in_order_and_can_stop_the_loop():
    recorder = RoundRecorder(stop_after=3)
    config = TrainingSettings(learning_rate=0.05, cohort_size=4, rounds=6, block_records=4, eval_every=2)
    result = trainer("softmax", "np", config, hooks=[recorder]).run()
    assert recorder.started and recorder.ended
    # Evaluation runs before the extra hook: round 2 is evaluated (curve: rounds 0, 2), 1 and 3 are not.
    assert recorder.rounds == [(1, False, 1), (2, True, 2), (3, False, 2)]
    assert result.final["rounds"] == 3 and result.status == "ok"
    assert int(result.reports_per_client.sum()) == 3 * 4


def test_a_server_step_at_rate_one_has_the_bits_of_the_scaled_step():
    """At learning rate 1 the server adds or subtracts the step without scaling it: the same bits
    as weights + (±1)·step, signed zeros, infinities and NaNs included."""
    gen = torch.Generator().manual_seed(3)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -3e38])
    weights = torch.cat([torch.randn(1000, generator=gen) * 10.0 ** torch.randint(-30, 30, (1000,), generator=gen),
                         specials.repeat_interleave(len(specials))])
    step = torch.cat([torch.randn(1000, generator=gen), specials.repeat(len(specials))])
    for name, sign in (("fedsgd", -1.0), ("fedavg", 1.0)):
        run = trainer("softmax", "np", TrainingSettings(learning_rate=1.0, algorithm=name, cohort_size=8))
        stepped = run.algorithm.server_step(weights, step)
        assert torch.equal(stepped.view(torch.int32), (weights + sign * 1.0 * step).view(torch.int32)), name


def test_algorithms_are_chosen_by_name_and_step_the_server_their_way():
    from ldpbench.fl import algorithms, settings

    assert set(algorithms.ALGORITHMS) == set(settings.ALGORITHMS)
    weights, step = torch.zeros(3), torch.ones(3)
    for name, sign in (("fedsgd", -1.0), ("fedavg", 1.0)):
        config = TrainingSettings(learning_rate=0.5, algorithm=name, cohort_size=8)
        run = trainer("softmax", "np", config)
        assert type(run.algorithm).name == name and isinstance(run.algorithm, algorithms.Algorithm)
        assert torch.equal(run.algorithm.server_step(weights, step), torch.full((3,), sign * 0.5))
        updates = run.algorithm.updates(run.initial_weights(), torch.arange(3), 1)
        assert updates.shape == (3, run.model.dims) and bool(updates.abs().sum() > 0)


# ---------------------------------------------------------------- closed-form gradients (training.gradients)
@pytest.mark.parametrize("network_name", ["lr", "svm", "softmax"])
@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
def test_closed_form_gradients_equal_autograd(network_name, algorithm):
    """The linear models' formula (the default) and vmap(grad) give the same updates to float rounding:
    masked blocks, clients of unequal sizes, FedAvg's per-client local models, l2."""
    config = dict(learning_rate=0.1, algorithm=algorithm, cohort_size=8, block_records=3, local_batch_size=4,
                  local_epochs=2, local_learning_rate=0.5, l2=0.01)
    labels = image_data(60, classes=2)[1].numpy()
    partition = fl_clients.partition("dirichlet", labels, 0, clients=8, alpha=0.5)
    runs = {gradients: trainer(network_name, "np", TrainingSettings(**config, gradients=gradients), records=60,
                               classes=2, partition=partition)
            for gradients in ("auto", "vmap")}
    assert runs["auto"].algorithm.gradients == "closed-form" and runs["vmap"].algorithm.gradients == "vmap"
    weights = runs["auto"].model.initial(zero=False) * 3 + 0.05  # away from 0, where every slope is alike
    ids = torch.arange(8)
    formula, autograd = (runs[g].algorithm.updates(weights, ids, 2) for g in ("auto", "vmap"))
    torch.testing.assert_close(formula, autograd, rtol=1e-5, atol=1e-6)
    assert formula.abs().max() > 1e-3


def test_a_wrong_gradient_formula_fails_the_comparison_with_autograd(monkeypatch):
    """Power of the test above: logistic regression's slope with the sign of the margin flipped."""
    from ldpbench.fl.networks import LogisticRegressionNetwork

    monkeypatch.setattr(LogisticRegressionNetwork, "loss_slope",
                        lambda self, outputs, signs: -signs * torch.sigmoid(signs * outputs))
    config = TrainingSettings(learning_rate=0.1, cohort_size=8, block_records=3)
    formula, autograd = (trainer("lr", "np", TrainingSettings(**{**config.__dict__, "gradients": g}), classes=2)
                         for g in ("auto", "vmap"))
    weights = formula.model.initial(zero=False) * 3 + 0.05
    with pytest.raises(AssertionError):
        torch.testing.assert_close(formula.algorithm.updates(weights, torch.arange(8), 1),
                                   autograd.algorithm.updates(weights, torch.arange(8), 1), rtol=1e-5, atol=1e-6)


def test_networks_without_a_formula_train_by_vmap_and_the_run_says_how():
    config = TrainingSettings(learning_rate=0.05, cohort_size=4, rounds=2, eval_every=1)
    assert trainer("mlp", "np", config).run().final["gradients"] == "vmap"
    assert trainer("softmax", "np", config).run().final["gradients"] == "closed-form"
    with pytest.raises(ConfigError, match="training.gradients"):
        TrainingSettings(gradients="formula")


def test_clients_of_one_record_take_the_short_path_to_the_same_updates():
    """FedSel's setting (partition 'record'): a unit per client without the block arithmetic."""
    features, labels = image_data(40, classes=2)
    partition = fl_clients.partition("record", labels.numpy(), 0)
    config = TrainingSettings(learning_rate=0.1, cohort_size=10, l2=0.01)
    run = trainer("lr", "np", config, records=40, classes=2, partition=partition)
    assert run.algorithm.one_record_each
    weights = run.model.initial(zero=False) + 0.01
    ids = torch.tensor([7, 0, 39, 12])
    short = run.algorithm.updates(weights, ids, 1)
    record_ids, mask, unit_client, counts = run.algorithm.units(ids, 1)
    run.algorithm.one_record_each = False  # the general block path
    general_ids, general_mask, general_client, general_counts = run.algorithm.units(ids, 1)
    assert unit_client is None and torch.equal(general_client, torch.arange(4))
    assert torch.equal(record_ids, general_ids) and torch.equal(mask, general_mask)
    assert torch.equal(counts, general_counts)
    assert torch.equal(short, run.algorithm.updates(weights, ids, 1))


@pytest.mark.parametrize("network_name,algorithm,client_batch_size", [
    ("mlp", "fedsgd", 0), ("lenet5", "fedsgd", 0), ("mlp", "fedsgd", 5), ("mlp", "fedavg", 0),
    ("lenet5", "fedavg", 0),
])
def test_per_client_autograd_equals_vmap(network_name, algorithm, client_batch_size):
    """Client after client on per-layer parameters, or vmapped over the chunk: the same updates to float
    rounding (blocks of records, clients of unequal sizes, client samples, FedAvg's shuffles and l2)."""
    config = dict(learning_rate=0.1, algorithm=algorithm, cohort_size=8, block_records=3, local_batch_size=4,
                  local_epochs=2, local_learning_rate=0.5, l2=0.01, client_batch_size=client_batch_size)
    labels = image_data(60)[1].numpy()
    partition = fl_clients.partition("dirichlet", labels, 0, clients=8, alpha=0.5)
    runs = {g: trainer(network_name, "np", TrainingSettings(**config, gradients=g), records=60, partition=partition)
            for g in ("per-client", "vmap")}
    weights = runs["vmap"].model.initial(zero=False)
    ids = torch.tensor([5, 0, 3, 7, 1])
    per_client, vmapped = (runs[g].algorithm.updates(weights, ids, 2) for g in ("per-client", "vmap"))
    torch.testing.assert_close(per_client, vmapped, rtol=1e-4, atol=1e-6)
    assert vmapped.abs().max() > 1e-3
    # The worker is a copy: training it leaves the network the run starts from untouched.
    assert torch.equal(runs["per-client"].initial_weights(), runs["vmap"].initial_weights())


def test_auto_trains_client_by_client_from_16_records_a_step():
    from ldpbench.fl.algorithms import PER_CLIENT_MIN_RECORDS

    def strategy(network_name, **training):
        run = trainer(network_name, "np", TrainingSettings(learning_rate=0.1, cohort_size=4, **training),
                      records=8 * 20, classes=2)
        return run.algorithm.gradients

    assert PER_CLIENT_MIN_RECORDS == 16
    assert strategy("mlp") == "fused"  # 20 records a client, and the MLP fuses its gradients
    assert strategy("lenet5") == "per-client"  # it does not
    assert strategy("mlp", client_batch_size=15) == "vmap"
    assert strategy("mlp", algorithm="fedavg", local_batch_size=16) == "fused"
    assert strategy("mlp", algorithm="fedavg", local_batch_size=8) == "vmap"
    assert strategy("lr") == "closed-form"
    assert strategy("mlp", gradients="vmap") == "vmap"  # overridden
    assert strategy("mlp", gradients="per-client") == "per-client"
    with pytest.raises(ConfigError, match="'closed-form' but network 'mlp' has no formula"):
        strategy("mlp", gradients="closed-form")
    with pytest.raises(ConfigError, match="'fused' but network 'lenet5' does not fuse"):
        strategy("lenet5", gradients="fused")


def test_progress_lines_name_the_run_and_the_time_its_remaining_rounds_take(caplog):
    from ldpbench.durations import duration
    from ldpbench.fl.hooks import LoopState, Progress

    def state(round_, rounds, seconds_ago, evaluated=True):
        return LoopState(rounds=rounds, weights=torch.zeros(1), reports_per_client=torch.zeros(1),
                         started=time.perf_counter() - seconds_ago, round=round_,
                         metrics={"test_accuracy": 0.75, "train_loss": 0.5} if evaluated else None)

    with caplog.at_level("INFO", logger="ldpbench"):
        fresh = Progress("PM ε=4 seed 1 fold 2")
        fresh.on_round_end(state(1, 6, 5.0, evaluated=False))  # the hook sees every round; logs evaluated ones
        fresh.on_round_end(state(2, 6, 10.0))  # 5 s a round, 4 rounds left
        resumed = Progress("PM ε=4 seed 1 fold 2")
        resumed.on_round_end(state(5, 10, 1.0, evaluated=False))  # resumed after round 4
        resumed.on_round_end(state(6, 10, 20.0))  # 2 rounds in 20 s: 10 s a round, 4 left
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["PM ε=4 seed 1 fold 2: round 2 of 6: test accuracy 0.7500, train loss 0.5 (10 s, 20 s left)",
                     "PM ε=4 seed 1 fold 2: round 6 of 10: test accuracy 0.7500, train loss 0.5 (20 s, 40 s left)"]
    assert [duration(s) for s in (0.42, 12.4, 185, 7620)] == ["0.4 s", "12 s", "3 min 05 s", "2 h 07 min"]


@pytest.mark.parametrize("table", [
    torch.randn(50, 7),  # features
    torch.randint(0, 256, (50, 3, 4, 4), dtype=torch.uint8),  # images
    torch.randint(0, 80, (50, 9)),  # token windows
    torch.randint(0, 10, (50,)),  # labels
])
def test_take_rows_gives_advanced_indexing_s_rows(table):
    """take_rows replaces table[index] on the run's set-up and round paths: the same rows, dtype and
    shape, for numpy and tensor indices of any shape (a client's records per row), and no rows."""
    from ldpbench.fl.model import take_rows

    rows = np.random.default_rng(3).integers(0, len(table), size=40)
    for index in (rows, torch.from_numpy(rows), torch.from_numpy(rows).reshape(8, 5), rows[:0]):
        expected = table[index]
        taken = take_rows(table, index)
        assert taken.dtype == expected.dtype and taken.shape == expected.shape
        assert torch.equal(taken, expected)


def test_a_row_divided_or_subtracted_on_its_way_in_is_the_row_divided_or_subtracted_after_bit_for_bit():
    """FedSGD's rows are divided by the record count, FedAvg's per-client deltas less the weights."""
    config = dict(learning_rate=0.1, algorithm="fedsgd", cohort_size=4, gradients="per-client")
    run = trainer("mlp", "np", TrainingSettings(**config), records=40)
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(size, generator=generator) for size in run.model.sizes]
    weights = torch.randn(run.model.dims, generator=generator)
    divided, subtracted, after = (torch.empty(run.model.dims) for _ in range(3))
    run.algorithm.write_row(divided, tensors, divisor=7)
    run.algorithm.write_row(subtracted, tensors, minus=weights)
    run.algorithm.write_row(after, tensors)
    assert not torch.equal(divided, after) and not torch.equal(subtracted, after)  # it did divide, subtract
    assert torch.equal(divided.view(torch.int32), (after / 7).view(torch.int32))
    assert torch.equal(subtracted.view(torch.int32), (after - weights).view(torch.int32))


def rounds_of_steps(run, rounds):
    """(weights, cohort, round) of `rounds` rounds of `run`, each step taken by the run's round API."""
    from ldpbench.fl.strategies import RoundRequest

    weights = run.initial_weights()
    for round_index, _, cohort in fl_clients.cohorts(run.settings.sampler, run.partition.clients,
                                                     run.cohort_size, rounds, run.seed):
        request = RoundRequest(weights, cohort, round_index)
        step = run.step(request)
        yield request, step
        weights = run.algorithm.server_step(weights, step)


@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
def test_a_round_writes_its_update_rows_where_the_last_round_wrote_them(algorithm):
    """A round's [clients, d] updates reuse the last round's memory (fresh pages of a large matrix cost
    a page fault each), and each chunk has its own: every round's step is still the mean of the
    updates computed afresh, bit for bit."""
    config = TrainingSettings(learning_rate=0.1, algorithm=algorithm, cohort_size=6, chunk_clients=2,
                              gradients="per-client", local_batch_size=4, l2=0.01)
    run = trainer("mlp", None, config, records=64)
    where, held = [], []

    def noting_where(weights, ids, round_index):
        updates = type(run).updates(run, weights, ids, round_index)
        where.append(updates.untyped_storage().data_ptr())
        held.append(updates)  # kept alive: a fresh matrix could not take its place
        return updates

    run.updates = noting_where
    by_round = []
    for request, step in rounds_of_steps(run, 3):
        fresh = torch.cat([run.algorithm.updates(request.weights, ids, request.round_index)
                           for ids in request.cohort.split(2)])
        assert torch.equal(step.view(torch.int32), fresh.mean(dim=0).view(torch.int32))
        by_round.append(where[:])
        where.clear()
    assert len(by_round[0]) == len(set(by_round[0])) >= 3  # a matrix for each chunk
    assert by_round[1] == by_round[0] and by_round[2] == by_round[0]


def test_a_step_that_is_a_kept_update_row_is_copied_before_the_next_round_overwrites_it():
    config = TrainingSettings(learning_rate=0.1, cohort_size=4, gradients="per-client")
    run = trainer("mlp", None, config, records=64)
    run.estimate = lambda reports, cohort_updates: reports[0]  # as an aggregate returning a row might
    steps = [(step, step.clone()) for _, step in rounds_of_steps(run, 3)]
    assert all(torch.equal(step, as_returned) for step, as_returned in steps)
    assert not torch.equal(steps[0][1], steps[1][1])


@pytest.mark.parametrize("network_name", ["lenet5", "mlp"])
@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
def test_the_per_client_path_takes_a_network_s_written_out_backward(monkeypatch, network_name, algorithm):
    """LeNet-5 and the MLP write their backward out (`summed_loss_gradients`): the per-client path
    uses it, and its updates are those of autograd's gradients bit for bit."""
    config = TrainingSettings(learning_rate=0.1, algorithm=algorithm, cohort_size=4, gradients="per-client",
                              local_batch_size=4, l2=0.01)
    run = trainer(network_name, "np", config, records=48)
    network_class, written_out = type(run.algorithm.worker), type(run.algorithm.worker).summed_loss_gradients
    calls = []

    def counted(network, inputs, targets):
        calls.append(len(targets))
        return written_out(network, inputs, targets)

    monkeypatch.setattr(network_class, "summed_loss_gradients", counted)
    weights, ids = run.model.initial(zero=False), torch.tensor([5, 0, 3])
    updates = run.algorithm.updates(weights, ids, 2)
    assert sum(calls) == sum(len(run.data.client_records(client)) for client in ids.tolist())
    monkeypatch.setattr(network_class, "summed_loss_gradients", lambda network, inputs, targets: None)
    assert torch.equal(updates.view(torch.int32), run.algorithm.updates(weights, ids, 2).view(torch.int32))


@pytest.mark.parametrize("algorithm,client_batch_size,l2", [
    ("fedsgd", 0, 0.01), ("fedsgd", 0, 0.0), ("fedsgd", 5, 0.01), ("fedavg", 0, 0.01), ("fedavg", 0, 0.0),
])
def test_fused_gradients_give_the_per_client_updates_to_float_rounding(monkeypatch, algorithm, client_batch_size,
                                                                       l2):
    """training.gradients: fused writes each weight gradient scaled and added where it goes by the
    product that makes it: FedSGD's rows (l2·w, the mean over several blocks of records) and FedAvg's
    local steps in place, over clients of unequal sizes, samples and shuffles. The same updates as
    per-client to float rounding, by the network's fused path."""
    monkeypatch.setattr(algorithms, "PER_CLIENT_BLOCK_RECORDS", 3)  # FedSGD clients of several blocks
    config = dict(learning_rate=0.1, algorithm=algorithm, cohort_size=8, local_batch_size=4, local_epochs=2,
                  local_learning_rate=0.5, l2=l2, client_batch_size=client_batch_size)
    labels = image_data(60)[1].numpy()
    partition = fl_clients.partition("dirichlet", labels, 0, clients=8, alpha=0.5)
    runs = {g: trainer("mlp", "np", TrainingSettings(**config, gradients=g), records=60, partition=partition)
            for g in ("per-client", "fused")}
    network_class = type(runs["fused"].algorithm.worker)
    fused_step, fused_calls = network_class.scaled_gradients_into, []

    def counted(network, inputs, *args, **kwargs):
        fused_calls.append(len(inputs))
        return fused_step(network, inputs, *args, **kwargs)

    monkeypatch.setattr(network_class, "scaled_gradients_into", counted)
    weights = runs["fused"].model.initial(zero=False)
    ids = torch.tensor([5, 0, 3, 7, 1])
    per_client, fused = (runs[g].algorithm.updates(weights, ids, 2) for g in ("per-client", "fused"))
    torch.testing.assert_close(fused, per_client, rtol=1e-5, atol=1e-7)
    assert per_client.abs().max() > 1e-2
    steps = 2 if algorithm == "fedavg" else 1  # FedAvg: every record once an epoch
    records = (min(client_batch_size, len(runs["fused"].data.client_records(c))) if client_batch_size
               else len(runs["fused"].data.client_records(c)) for c in ids.tolist())
    assert sum(fused_calls) == steps * sum(records)


@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
@pytest.mark.parametrize("gradients", ["vmap", "per-client", "fused"])
def test_a_client_without_records_reports_the_update_of_an_empty_loss(algorithm, gradients):
    """A Dirichlet partition can leave a client without records. Its loss is empty (0): FedSGD's
    update is l2·w, not 0/0, and FedAvg's takes no step, so its delta is 0 (the per-client paths
    divided by its zero records before). Its neighbours' updates are computed as ever."""
    owner = np.arange(40) % 4
    owner[owner == 2] = 3  # client 2 owns nothing
    partition = fl_clients.Partition.from_assignment(owner, 4)
    config = TrainingSettings(learning_rate=0.1, algorithm=algorithm, cohort_size=4, local_batch_size=16, l2=0.01,
                              gradients=gradients)
    run = trainer("mlp", "np", config, records=40, partition=partition)
    weights = run.model.initial(zero=False)
    updates = run.algorithm.updates(weights, torch.tensor([0, 2, 3]), 1)
    assert run.algorithm.gradients == gradients
    expected = 0.01 * weights if algorithm == "fedsgd" else torch.zeros_like(weights)
    assert torch.equal(updates[1], expected)
    assert bool(torch.isfinite(updates).all()) and bool((updates[[0, 2]] != expected).any(dim=1).all())
