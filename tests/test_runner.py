"""Engine: per-client gradients, learning, determinism and divergence handling."""

import dataclasses

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from ldpbench import mechanisms
from ldpbench.data import registry
from ldpbench.data.split import train_test_indices
from ldpbench.mechanisms.base import UPDATES
from ldpbench.plan import RunPlan
from ldpbench.runner import execute

from plans import run_plan

TRAINING = {"epochs": 1, "batch_fraction": 0.01, "learning_rate": 0.1, "l2": 1e-4, "eval_every": 10}


@pytest.fixture(scope="module")
def syn_l(tmp_path_factory):
    directory = tmp_path_factory.mktemp("syn-L")
    registry.get("syn-L-0.01-0.9").prepare(directory, directory / "raw")
    return directory


def test_np_on_syn_l_matches_central_logistic_regression(syn_l):
    from sklearn.linear_model import LogisticRegression

    from ldpbench.data.prepared import load_prepared

    features, labels, _ = load_prepared(syn_l)
    train, test = train_test_indices(len(labels), seed=0)
    central = LogisticRegression(fit_intercept=False, C=1 / (1e-4 * len(train)), max_iter=2000)
    central_accuracy = central.fit(features[train], labels[train]).score(features[test], labels[test])
    from ldpbench.runner import train

    spec = run_plan("syn-L-0.01-0.9", "lr", "np", {}, None, 0, 0, 0, 0.2, TRAINING)
    result = train(spec, syn_l).result
    assert result.status == "ok" and result.final["rounds"] == 100
    assert abs(result.final["test_accuracy"] - central_accuracy) <= 0.02
    assert int(result.reports_per_client.min()) == int(result.reports_per_client.max()) == 1


def test_private_runs_learn_and_rank_as_expected(syn_l):
    """At ε = 2, PS-PM beats flat PM on syn-L (FedSel's claim) and both beat chance."""
    accuracies = {}
    for name in ("pm", "ps-pm"):
        spec = run_plan("syn-L-0.01-0.9", "lr", name, {}, 2.0, 0, 0, 0, 0.2, TRAINING)
        from ldpbench.runner import train

        accuracies[name] = train(spec, syn_l).result.final["test_accuracy"]
    assert accuracies["pm"] > 0.7 and accuracies["ps-pm"] > accuracies["pm"]


def test_same_plan_twice_gives_identical_parquet(syn_l, tmp_path):
    spec = run_plan("syn-L-0.01-0.9", "svm", "ps-pm", {"mu": 0.2}, 1.0, 3, 0, 0, 0.2, TRAINING)
    first = execute(spec, syn_l, tmp_path / "a")
    second = execute(spec, syn_l, tmp_path / "b")
    assert (tmp_path / "a" / "curve.parquet").read_bytes() == (tmp_path / "b" / "curve.parquet").read_bytes()
    timing = {"train_seconds", "wall_seconds", "started_at", "finished_at"}
    assert {k: v for k, v in first.items() if k not in timing} == {k: v for k, v in second.items() if k not in timing}
    a = pq.read_table(tmp_path / "a" / "summary.parquet").to_pandas().drop(columns=list(timing))
    b = pq.read_table(tmp_path / "b" / "summary.parquet").to_pandas().drop(columns=list(timing))
    pd.testing.assert_frame_equal(a, b)
    other = execute(dataclasses.replace(spec, seed=4), syn_l, tmp_path / "c")
    assert other["test_accuracy"] != first["test_accuracy"]


def test_divergence_is_a_result_not_a_crash(syn_l, tmp_path):
    spec = run_plan("syn-L-0.01-0.9", "lr", "pm", {}, 2.0, 0, 0, 0, 0.2,
                   {**TRAINING, "learning_rate": 1e38})
    row = execute(spec, syn_l, tmp_path)
    assert row["status"] == "diverged" and row["rounds"] < 100


def test_run_ids_are_stable_and_sensitive():
    spec = run_plan("syn-L-0.01-0.9", "lr", "pm", {}, 2.0, 0, 0, 0, 0.2, TRAINING)
    assert spec.run_id == RunPlan.from_json(spec.canonical_json()).run_id
    assert len(spec.run_id) == 16
    assert dataclasses.replace(spec, epsilon=4.0).run_id != spec.run_id
    assert dataclasses.replace(spec, training=dataclasses.replace(spec.training, l2=0.0)).run_id != spec.run_id


def test_data_mechanism_is_one_release_per_client(syn_s, tmp_path):
    spec = run_plan("syn-S-0.1-0.9", "lr", "bitrand", {"eps_y": 2.0}, 4.0, 0, 0, 0, 0.2,
                   {**TRAINING, "epochs": 3})
    row = execute(spec, syn_s, tmp_path)
    assert row["status"] == "ok" and row["rounds"] == 300
    assert row["reports_per_client_max"] == 1 and row["epsilon_per_report"] == 4.0
    assert row["epsilon_claimed_client_max"] == 6.0  # ε_X + ε_Y, not composed over epochs
    assert row["epsilon_worst_case_client_max"] > 100  # the released bits leak far more
    assert row["bits_per_report"] == 20 * 10 + 1
    assert 0.5 < row["test_accuracy"] < 1.0


@pytest.mark.parametrize("name", ["ldp-fl", "pm"])
@pytest.mark.parametrize("anonymizer", [False, True])
def test_ledger_composes_over_epochs(syn_s, tmp_path, name, anonymizer):
    epochs, epsilon, dims = 2, 4.0, 20
    spec = run_plan("syn-S-0.1-0.9", "lr", name, {"anonymizer": anonymizer}, epsilon, 0, 0, 0, 0.2,
                   {**TRAINING, "epochs": epochs})
    row = execute(spec, syn_s, tmp_path)
    ledger = pd.read_parquet(tmp_path / "ledger.parquet")
    assert (ledger["reports"] == epochs).all() and row["epsilon_per_report"] == epsilon / epochs
    per_report_worst = dims * epsilon / epochs if anonymizer else epsilon / epochs
    assert row["epsilon_worst_case_client_max"] == pytest.approx(epochs * per_report_worst)
    # The anonymizer claim does not compose over rounds; honest accounting does.
    assert row["epsilon_claimed_client_max"] == pytest.approx(epsilon / epochs if anonymizer else epsilon)


def test_every_mechanism_runs_in_the_engine(syn_s):
    from ldpbench.runner import train

    for name in mechanisms.names():
        epsilon = max(2.0, mechanisms.get(name).example_epsilon) if mechanisms.get(name).private else None
        spec = run_plan("syn-S-0.1-0.9", "svm", name, {}, epsilon, 0, 0, 0, 0.2, TRAINING)
        result = train(spec, syn_s).result
        assert result.status == "ok", name
        if mechanisms.get(name).privatises == UPDATES:
            assert result.final["test_accuracy"] > 0.5, name
        else:
            # A release of the records themselves (OME at ε = 2 flips most bits) can train a
            # classifier anywhere in [0, 1]; its quality is a campaign result, not a contract.
            assert 0.0 <= result.final["test_accuracy"] <= 1.0, name


def test_a_run_gives_the_same_numbers_alone_or_inside_a_cell(syn_s, tmp_path):
    from ldpbench import layout
    from ldpbench.runner import execute_cell

    specs = [run_plan("syn-S-0.1-0.9", "lr", "pe-pm", {}, 2.0, seed, 0, 0, 0.2, TRAINING) for seed in (0, 1, 2)]
    rows = execute_cell(specs, syn_s, tmp_path / "runs", "0123456789abcdef").trained
    # syn-S's rounds are small: the cell's runs trained together (ldpbench.fl.engine.train_together).
    assert [row["trained_together"] for row in rows] == [3, 3, 3]
    alone = execute(specs[1], syn_s, tmp_path / "alone")
    assert alone["trained_together"] == 1
    for kind in ("curves", "ledgers"):
        together = layout.run_file(tmp_path / "runs", kind, "syn-S-0.1-0.9", "pe-pm", "final", specs[1].run_id)
        assert together.read_bytes() == (tmp_path / "alone" / layout.RUN_FILES[kind]).read_bytes()
    timing = {"train_seconds", "wall_seconds", "started_at", "finished_at", "trained_together"}
    assert {k: v for k, v in rows[1].items() if k not in timing} == {k: v for k, v in alone.items() if k not in timing}
    # Runs trained together share their training time: each carries its share, not the group's.
    assert all(0 < row["train_seconds"] < row["wall_seconds"] for row in rows)


class RecordedLiveRun:
    """A stand-in for results.live.LiveRun that records how each run's live run was closed."""

    closed: list[tuple[str, str]] = []

    def __init__(self, target, run_id, name, params):
        self.run_id = run_id

    def add(self, point):
        pass

    def close(self, status):
        RecordedLiveRun.closed.append((self.run_id, status))


@pytest.mark.parametrize("failure", ["training", "preparing"])
def test_a_failing_cell_closes_every_live_run_it_opened_once(syn_s, tmp_path, monkeypatch, failure):
    """Runs are prepared ahead of their group's training: when a group fails to train, or a later run
    fails to prepare, each live run opened so far is closed as failed exactly once."""
    from ldpbench import runner

    monkeypatch.setattr(runner, "LiveRun", RecordedLiveRun)
    monkeypatch.setattr(RecordedLiveRun, "closed", [])
    # Two PM runs train together; the HM run after them cannot join and is prepared before they train.
    specs = [run_plan("syn-S-0.1-0.9", "lr", name, {}, 2.0, seed, 0, 0, 0.2, {**TRAINING, "rounds": 2})
             for name, seed in (("pm", 0), ("pm", 1), ("hm", 0))]
    if failure == "training":
        def train_together(trainers):
            raise RuntimeError("the group failed")

        monkeypatch.setattr(runner, "train_together", train_together)
    else:
        original = runner.prepare

        def prepare(plan, *args, **kwargs):
            if plan.mechanism == "hm":
                raise RuntimeError("the run failed to prepare")
            return original(plan, *args, **kwargs)

        monkeypatch.setattr(runner, "prepare", prepare)
    with pytest.raises(RuntimeError, match="failed"):
        runner.execute_cell(specs, syn_s, tmp_path / "runs", "0123456789abcdef", live=object())
    assert sorted(RecordedLiveRun.closed) == sorted((spec.run_id, "FAILED") for spec in specs)


def test_data_mechanisms_release_the_features_not_the_parameters(syn_s, tmp_path):
    """An MLP has far more parameters than a record has features; BitRand encodes the 20 features."""
    spec = run_plan("syn-S-0.1-0.9", "mlp", "bitrand", {"eps_y": 2.0}, 4.0, 0, 0, 0, 0.2,
                   {**TRAINING, "model_params": {"hidden": [8]}})
    row = execute(spec, syn_s, tmp_path)
    assert row["dims"] == 20 * 8 + 8 + 8 * 2 + 2  # the network's parameters
    assert row["bits_per_report"] == 20 * 10 + 1  # the released record: 20 features × l bits + label


def test_ledger_of_clients_that_never_reported_is_zero_even_for_an_unbounded_mechanism():
    from ldpbench.mechanisms.base import Accounting
    from ldpbench.runner import ledger

    rows = ledger(Accounting(1.0, float("inf"), 10), torch.tensor([0, 2, 1]), [0, 1, 2])
    assert rows["epsilon_worst_case"].tolist() == [0.0, float("inf"), float("inf")]
    assert rows["epsilon_claimed"].tolist() == [0.0, 2.0, 1.0]


def test_runs_are_stored_once_by_id_complete_and_stale_attempts_are_removed(syn_s, tmp_path, monkeypatch):
    from ldpbench import layout, runner
    from ldpbench.runner import execute_cell

    specs = [run_plan("syn-S-0.1-0.9", "lr", "pm", {}, 2.0, seed, 0, 0, 0.2, {**TRAINING, "rounds": 2})
             for seed in (0, 1, 2)]
    runs = tmp_path / "runs"
    attempts = layout.attempts_dir(runs)
    # What a SIGKILLed attempt leaves: its own directory with part of the cell.
    stale = attempts / "cell=0123456789abcdef.attempt-99999-dead"
    (stale / f"run_id={specs[0].run_id}").mkdir(parents=True)
    other_cell = attempts / "cell=fedcba9876543210.attempt-99999-dead"
    other_cell.mkdir()
    first = execute_cell(specs[:2], syn_s, runs, "0123456789abcdef")
    assert len(first.trained) == 2 and first.reused == []
    assert sorted(p.name for p in attempts.iterdir()) == [other_cell.name]

    def stored(phase="final"):
        found = {}
        for kind, name in layout.RUN_FILES.items():
            found[kind] = {path.parent.name for path in (runs / kind).glob(f"*/*/phase={phase}/run_id=*/{name}")}
            # Each tree holds its kind alone: one dataset per tree.
            assert {path.name for path in (runs / kind).rglob("*.parquet")} <= {name}
        return found

    assert all(ids == {f"run_id={spec.run_id}" for spec in specs[:2]} for ids in stored().values())
    # Another cell with these runs and one more (a seed added): only the new run trains.
    trained = []
    monkeypatch.setattr(runner, "_train_group", lambda group, real=runner._train_group:
                        trained.extend(p.plan.run_id for p in group) or real(group))
    again = execute_cell(specs, syn_s, runs, "00000000000000aa")
    assert trained == [specs[2].run_id] and sorted(again.reused) == sorted(spec.run_id for spec in specs[:2])
    # A run stored as a trial is linked, not trained, where a final cell needs the same plan.
    trials = [run_plan("syn-S-0.1-0.9", "lr", "pm", {}, 2.0, 5, 0, 0, 0.2, {**TRAINING, "rounds": 2})]
    assert len(execute_cell(trials, syn_s, runs, "00000000000000bb", phase="trial").trained) == 1
    trained.clear()
    assert execute_cell(trials, syn_s, runs, "00000000000000cc").reused == [trials[0].run_id] and trained == []
    for kind in layout.RUN_FILES:
        trial = layout.run_file(runs, kind, "syn-S-0.1-0.9", "pm", "trial", trials[0].run_id)
        final = layout.run_file(runs, kind, "syn-S-0.1-0.9", "pm", "final", trials[0].run_id)
        assert trial.read_bytes() == final.read_bytes()
    # A run is stored once its summary is: a run with only its curve stored (a process killed while
    # publishing) is trained again and its files completed.
    summary = layout.run_file(runs, "summaries", "syn-S-0.1-0.9", "pm", "final", specs[1].run_id)
    summary.unlink()
    assert [row["run_id"] for row in execute_cell(specs, syn_s, runs, "00000000000000dd").trained] == \
        [specs[1].run_id] and summary.exists()


def test_a_cell_says_which_runs_train_while_they_train(syn_s, tmp_path, monkeypatch):
    """`ldpbench status` counts a cell's runs as running from the start of their training: its attempt
    directory holds attempt.json (whose, which runs) before the first run completes."""
    import json

    from ldpbench import layout, runner
    from ldpbench.launch import processes

    specs = [run_plan("syn-S-0.1-0.9", "lr", name, {}, 2.0, 0, 0, 0, 0.2, {**TRAINING, "rounds": 2})
             for name in ("pm", "hm")]  # two groups: HM cannot train with PM
    seen = []

    def train_group(group, real=runner._train_group):
        [attempt] = layout.attempts_dir(tmp_path / "runs").glob("cell=*")
        seen.append(json.loads((attempt / layout.ATTEMPT_FILE).read_text()))
        return real(group)

    monkeypatch.setattr(runner, "_train_group", train_group)
    runner.execute_cell(specs, syn_s, tmp_path / "runs", "0123456789abcdef")
    assert [record["training"] for record in seen] == [[specs[0].run_id], [specs[1].run_id]]
    assert all(record["runs"] == [spec.run_id for spec in specs] for record in seen)
    assert all(processes.recorded_alive(record) for record in seen)


def test_a_run_is_named_in_the_log_by_its_label_budget_seed_and_fold():
    from ldpbench.runner import run_name

    private = run_plan("syn-S-0.1-0.9", "lr", "ps-pm", {}, 2.0, 1, 3, 5, 0.2, {})
    assert run_name(private, "PS-PM") == "PS-PM ε=2 seed 1 fold 3"
    assert run_name(private) == "ps-pm ε=2 seed 1 fold 3"
    hold_out = run_plan("syn-S-0.1-0.9", "lr", "np", {}, None, 0, 0, 0, 0.2, {})
    assert run_name(hold_out, "NP") == "NP seed 0"


def test_majority_accuracy_is_the_constant_predictors_test_accuracy_of_the_training_majority():
    from ldpbench.runner import majority_accuracy

    train_labels, test_labels = torch.tensor([0, 1, 1, 2, 1]), torch.tensor([1, 1, 0, 0])
    assert majority_accuracy(train_labels, test_labels, 3) == 0.5  # class 1, not the test split's own majority
    assert majority_accuracy(torch.tensor([2, 0]), torch.tensor([0, 2, 2]), 3) == pytest.approx(1 / 3)  # tie: class 0


def test_a_runs_summary_records_the_majority_rate_of_its_test_split(syn_l, tmp_path):
    from ldpbench.data.prepared import load_prepared

    _, labels, _ = load_prepared(syn_l)
    spec = run_plan("syn-L-0.01-0.9", "lr", "np", {}, None, 0, 0, 0, 0.2, TRAINING)
    execute(spec, syn_l, tmp_path)
    summary = pd.concat([pd.read_parquet(path) for path in tmp_path.rglob("summary*.parquet")])
    train, test = train_test_indices(len(labels), seed=0)
    majority = pd.Series(labels[train]).value_counts().idxmax()
    assert summary["test_majority_accuracy"].iloc[0] == pytest.approx((labels[test] == majority).mean())


def test_a_runs_summary_names_the_records_of_each_split_it_used(syn_l, tmp_path):
    """training_digest and test_digest are split_digest of the run's own split (the data's digests and
    the indices run_indices gives); a run holding out validation clients names a third split, trains on
    fewer records than the run without, and tests on the same ones."""
    import json

    from ldpbench.data.prepared import load_prepared, recorded_digests
    from ldpbench.data.split import split_digest

    _, labels, _ = load_prepared(syn_l)
    data = recorded_digests(json.loads((syn_l / "meta.json").read_text()))
    plain = run_plan("syn-L-0.01-0.9", "lr", "np", {}, None, 0, 0, 0, 0.2, TRAINING)
    held_out = run_plan("syn-L-0.01-0.9", "lr", "np", {}, None, 0, 0, 0, 0.2, {**TRAINING, "validation_fraction": 0.25})
    summaries = {}
    for name, spec in (("plain", plain), ("held_out", held_out)):
        execute(spec, syn_l, tmp_path / name)
        [path] = (tmp_path / name).rglob("summary*.parquet")
        summaries[name] = pd.read_parquet(path).iloc[0]
    train, test = train_test_indices(len(labels), seed=0)
    assert summaries["plain"]["training_digest"] == split_digest(data, train)
    assert summaries["plain"]["test_digest"] == split_digest(data, test)
    assert pd.isna(summaries["plain"]["validation_digest"])
    assert summaries["held_out"]["test_digest"] == summaries["plain"]["test_digest"]
    assert isinstance(summaries["held_out"]["validation_digest"], str)
    assert summaries["held_out"]["training_digest"] != summaries["plain"]["training_digest"]
    assert summaries["held_out"]["records"] + summaries["held_out"]["validation_records"] == len(train)
