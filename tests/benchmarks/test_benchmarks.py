"""The benchmark scripts run (tiny sizes); their numbers are for people, not assertions."""

import dataclasses
import json
import logging
import math
import shutil
import time
from pathlib import Path

import pytest

from benchmark_scripts import load


def test_mechanism_throughput_runs_for_every_mechanism(tmp_path, capsys):
    from ldpbench import mechanisms

    out = tmp_path / "throughput.json"
    arguments = ["--clients", "8", "--dims", "6", "--repetitions", "1", "--out", str(out)]
    assert load("mechanism_throughput").main(arguments) == 0
    record = json.loads(out.read_text())
    assert {r["mechanism"] for r in record["results"]} == set(mechanisms.names()) | {"streams.rand"}
    assert {"anonymizer": True} in [r["params"] for r in record["results"]]
    assert all(r["values_per_second"] > 0 for r in record["results"])
    assert "values/s" in capsys.readouterr().out


def test_hadamard_throughput_runs(tmp_path, capsys):
    out = tmp_path / "hadamard.json"
    assert load("hadamard_throughput").main(["--log2-dims", "2", "4", "--clients", "1", "3", "--repetitions", "1",
                                             "--dense-max", "8", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [(r["dims"], r["clients"]) for r in record["results"]] == [(4, 1), (4, 3), (8, 1), (8, 3), (16, 1), (16, 3)]
    assert all(r["values_per_second"] > 0 for r in record["results"])
    assert "dense_median_seconds" in record["results"][0] and "dense_median_seconds" not in record["results"][-1]
    assert "ns/butterfly" in capsys.readouterr().out


def test_blas_products_times_every_product_of_a_step_and_the_numpy_step_computes_the_same_gradients(tmp_path,
                                                                                                      capsys):
    out = tmp_path / "blas.json"
    module = load("blas_products")
    assert module.main(["--quick", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    [(network, widths, batch)] = module.QUICK_NETWORKS
    layers = len(widths) - 1
    rows = record["results"]
    assert len(rows) == 3 * layers - 1 + 1 and all(r["network"] == network for r in rows)
    assert [r["what"] for r in rows[:3]] == ["layer 1 forward", "layer 1 weight gradient", "layer 2 forward"]
    assert all(r["torch_seconds"] > 0 and r["numpy_seconds"] > 0 for r in rows)
    # Both steps' gradients agree to float32 rounding (the sums' order differs, so the last bits do).
    assert rows[-1]["what"] == "local SGD step" and 0 <= rows[-1]["gradient_relative_difference"] < 1e-5
    assert set(record["blas"]) == {"torch", "numpy"} and "torch/numpy" in capsys.readouterr().out


def test_run_profile_timers_count_a_parts_outermost_call_only():
    module = load("run_profile")
    timers = module.Timers()

    class Work:
        def inner(self):
            time.sleep(0.02)

        def outer(self):
            self.inner()
            time.sleep(0.02)

    timers.wrap(Work, "inner", "rounds")
    timers.wrap(Work, "outer", "rounds")
    started = time.perf_counter()
    Work().outer()
    elapsed = time.perf_counter() - started
    taken = timers.take()
    assert 0.04 <= taken["rounds"] <= elapsed  # the inner call counted again would exceed the wall time
    assert timers.take() == {}  # taking them starts them again from zero


@pytest.mark.slow
def test_run_profile_splits_a_campaigns_cells_into_rounds_evaluation_and_the_rest(tmp_path, capsys, caplog,
                                                                                 monkeypatch):
    import yaml

    from ldpbench import rng
    from ldpbench.data import prepared

    from workflow_cli import small_config

    # The benchmark warms its process as the worker does, which switches every later draw to the
    # compiled kernels and holds the datasets: on copies of the switches and the held copies, which
    # the test puts back.
    monkeypatch.setattr(rng, "speed", rng.DrawSpeed())
    monkeypatch.setattr(prepared, "_WARM", {})
    caplog.set_level(logging.INFO, logger="ldpbench")

    campaign = tmp_path / "campaign.yaml"
    config = small_config(name="profiled", mechanisms=("np", "pm"), epsilons=(1,), seeds=(0, 1), rounds=12,
                          checkpoint_every=3)
    config["tuning"] = {"space": {"learning_rate": [0.1, 0.3]}}  # left out: every cell trains the base setting
    campaign.write_text(yaml.safe_dump(config))
    out = tmp_path / "profile.json"
    module = load("run_profile")
    assert module.main([str(campaign), "--cells", "2", "--rounds", "4", "--workdir", str(tmp_path / "work"),
                        "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert rng.speed.every_draw  # warmed as the worker: its kernels loaded before the clock
    assert sorted(row["label"] for row in rows) == ["np", "pm"]  # the campaign gives no labels
    for row in rows:
        # One seed (the campaign's first), its 12 planned rounds capped at 4.
        assert (row["runs"], row["rounds_trained"], row["rounds_planned"]) == (1, 4, 12)
        assert set(row["seconds"]) == {"rounds", "evaluation", "checkpoints", "preparing", "the rest"}
        assert all(seconds > 0 for part, seconds in row["seconds"].items() if part != "the rest")
        assert sum(row["seconds"].values()) == pytest.approx(row["wall_seconds"])
        parts = row["seconds"]
        assert row["share_outside_rounds"] == pytest.approx(1 - parts["rounds"] / row["wall_seconds"])
        # Evaluated (every 5 rounds, and the last) at rounds 0 and 4 of 4; at 0, 5, 10 and 12 of the 12
        # planned. At plan the rounds and checkpoints weigh three times as much, the evaluation twice.
        assert (row["evaluations"], row["evaluations_planned"]) == (2, 4)
        at_plan = 3 * (parts["rounds"] + parts["checkpoints"]) + 2 * parts["evaluation"]
        assert row["share_outside_rounds_at_planned_rounds"] == pytest.approx(
            1 - 3 * parts["rounds"] / (at_plan + parts["preparing"] + parts["the rest"]))
    assert "at plan" in capsys.readouterr().out
    # Each cell found its dataset held in memory, as a run-cell job forked from the warm worker does.
    assert caplog.text.count("in memory from the warm worker") == 2


@pytest.mark.slow
@pytest.mark.integration
def test_run_profile_prepares_a_campaign_whose_dataset_has_features_from_scratch(tmp_path, monkeypatch):
    """Its data and features extracted before the plans (with `--until` over the three rules, Snakemake
    left the features job unscheduled and the profile stopped)."""
    import yaml

    from ldpbench import rng

    from workflow_cli import tiny_config

    monkeypatch.setattr(rng, "speed", rng.DrawSpeed())
    sentences = [f"clause {i}: the parties agree to {verb} the goods" for i, verb in
                 enumerate(["deliver", "inspect", "insure", "return", "store", "ship", "pay for", "keep"])]
    raw = tmp_path / "raw" / "sec"
    raw.mkdir(parents=True)
    (raw / "sec_contract_clauses.csv").write_text("text,label\n" + "".join(
        f'"{sentence}",{i % 2}\n' for i, sentence in enumerate(sentences)))
    config = tiny_config(tmp_path)
    config.update(datasets=[{"name": "sec", "features": "minilm"}], mechanisms=[{"name": "np", "label": "NP"}],
                  features={"threads": 1})
    campaign = tmp_path / "campaign.yaml"
    campaign.write_text(yaml.safe_dump(config))
    module = load("run_profile")
    workdir = tmp_path / "work"
    workdir.mkdir()
    shutil.copytree(tmp_path / "raw", workdir / "raw")  # the benchmark reads the raw data in its own directory
    out = tmp_path / "profile.json"
    assert module.main([str(campaign), "--cells", "1", "--rounds", "2", "--workdir", str(workdir), "--cores", "1",
                        "--out", str(out)]) == 0
    assert (workdir / "features" / "sec" / "minilm" / "meta.json").exists()
    assert json.loads(out.read_text())["results"][0]["dataset"] == "sec"


@pytest.mark.slow
def test_engine_throughput_runs_every_scenario(tmp_path, capsys):
    out = tmp_path / "engine.json"
    module = load("engine_throughput")
    assert module.main(["--quick", "--kernels", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [r["scenario"] for r in record["results"]] == list(module.SCENARIOS)
    assert all(r["seconds_per_round"] > 0 and r["vectorisation_ratio"] > 0 for r in record["results"])
    # The kernels' time, for the deep scenarios alone: part of the time of the rounds it was measured in
    # (one thread; against the rounds of another run, a loaded machine made it exceed theirs once).
    for row in record["results"]:
        deep = row["scenario"].startswith(module.PFL_SCENARIOS)
        assert (row["kernel_seconds_per_round"] is not None) == deep, row["scenario"]
        assert not deep or 0 < row["kernel_seconds_per_round"] < row["kernel_profiled_round_seconds"]
    # pfl-research where it is installed, on the deep scenarios only; here, where it is not, nowhere.
    installed = load("pfl_reference").available() is not None
    for row in record["results"]:
        measured = installed and row["scenario"].startswith(module.PFL_SCENARIOS)
        assert (row["pfl_seconds_per_round"] is not None) == measured, row["scenario"]
    assert "ratio" in capsys.readouterr().out


def test_the_references_train_the_textbook_layers_with_the_engines_parameters():
    import torch
    from torch import nn

    from ldpbench.fl.model import build_network
    from ldpbench.fl.pooling import ReLUMaxPool2d

    network = build_network("lenet5", (1, 28, 28), 10, seed=0)
    textbook = load("engine_throughput").textbook_network(network)
    assert not any(isinstance(module, ReLUMaxPool2d) for module in textbook.modules())
    assert sum(isinstance(module, nn.MaxPool2d) for module in textbook.modules()) == 2
    assert any(isinstance(module, ReLUMaxPool2d) for module in network.modules())  # the engine's, untouched
    assert [name for name, _ in textbook.named_parameters()] == [name for name, _ in network.named_parameters()]
    images = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    assert torch.equal(textbook(images), network(images))


def moments_agree(samples, mean: float, variance: float, z: float = 5.5) -> bool:
    """Sample mean and variance within z standard errors of the closed forms. Two z-tests at
    |z| > 5.5 (asymptotic normal, each two-sided 3.8e-8): false alarm below 1e-7 per call."""
    import numpy as np

    n = len(samples)
    centred = samples - samples.mean()
    m2, m4 = float(np.mean(centred**2)), float(np.mean(centred**4))
    mean_ok = abs(samples.mean() - mean) <= z * math.sqrt(variance / n)
    variance_ok = abs(m2 - variance) <= z * math.sqrt(max(m4 - m2 * m2, 1e-300) / n)
    return mean_ok and variance_ok


@pytest.mark.parametrize("name", ["pm", "duchi", "hm"])
def test_the_numpy_reference_samples_the_law_it_is_compared_with(name):
    """The benchmark's reference is the same law as ldpbench's: unbiased, with its exact variance.
    Power: the reference run at 1.5 ε is rejected by the same check."""
    import numpy as np

    from ldpbench.mechanisms.scalar import get_perturber

    reference = load("numpy_reference").REFERENCES[name]
    variance = get_perturber(name).variance
    rng = np.random.default_rng(20261125)
    for epsilon in (0.5, 2.0):
        for x in (-1.0, -0.3, 0.8):
            samples = reference(np.full(400_000, x), epsilon, rng)
            assert moments_agree(samples, x, variance(x, epsilon)), (epsilon, x)
    wrong = reference(np.full(400_000, 0.8), 3.0, rng)
    assert not moments_agree(wrong, 0.8, variance(0.8, 2.0))


def test_the_throughput_benchmark_sets_perturbers_and_streams_beside_their_references(tmp_path, capsys):
    out = tmp_path / "throughput.json"
    assert load("mechanism_throughput").main(["--clients", "8", "--dims", "6", "--repetitions", "1",
                                              "--out", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["results"] if "reference" in r]
    assert sorted((r["mechanism"], r["reference"]) for r in rows) == [
        ("duchi", "numpy reference"), ("hm", "numpy reference"), ("pm", "numpy reference"),
        ("streams.rand", "numpy Generator.random"), ("streams.rand", "torch.rand")]
    assert all(r["ratio"] > 0 for r in rows) and "×" in capsys.readouterr().out


def test_linear_round_runs_beside_its_floor(tmp_path, capsys, monkeypatch):
    from ldpbench import rng

    monkeypatch.setattr(rng, "speed", dataclasses.replace(rng.speed))  # the benchmark switches on compiled draws
    out = tmp_path / "linear.json"
    assert load("linear_round").main(["--repetitions", "3", "--scaling", "--dims", "50", "--cohorts", "10",
                                      "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["draws"], r["cohort"], r["dims"]) for r in rows] == [
        ("numpy (short process)", 488, 123), ("compiled (long process)", 488, 123),
        ("compiled (long process)", 10, 50)]
    assert all(r["seconds_per_round"] > 0 and r["floor_seconds_per_round"] > 0 and r["ratio"] > 0 for r in rows)
    assert "floor ms" in capsys.readouterr().out


def test_cell_batching_runs_beside_its_floors(tmp_path, capsys, monkeypatch):
    """It also checks that the runs trained together end where the runs trained one by one do."""
    from ldpbench import rng

    monkeypatch.setattr(rng, "speed", dataclasses.replace(rng.speed))  # the benchmark compiles every draw
    out = tmp_path / "cell.json"
    assert load("cell_batching").main(["--runs", "2", "--rounds", "3", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["mechanism"], r["runs"]) for r in rows] == [("pm", 2), ("np", 2)]
    assert all(r["engine_seconds"] > 0 and r["together_seconds"] > 0 and r["batched_floor_seconds"] > 0
               for r in rows)
    assert "engine/together" in capsys.readouterr().out


def test_the_batched_floor_is_the_run_by_run_floor_for_every_run():
    """Without a mechanism the floors are deterministic: the batched round is each run's own round."""
    import torch

    module = load("cell_batching")
    x, y = module.linear_round.one_hot_stand_in(200, 7)
    signs = (2 * y - 1).float()
    weights = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    cohorts = torch.randperm(200, generator=torch.Generator().manual_seed(1))[:3 * 11].reshape(3, 11)
    batched = module.batched_floor_round(x, signs, weights, cohorts, private=False)
    one_by_one = torch.stack([module.np_floor_round(x, signs, weights[run], cohorts[run]) for run in range(3)])
    assert torch.allclose(batched, one_by_one, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(batched, module.batched_floor_round(x, signs, weights, cohorts.flip(0), private=False))


def test_frozen_imports_runs_every_variant_beside_the_bare_interpreter(tmp_path, capsys):
    out = tmp_path / "frozen.json"
    assert load("frozen_imports").main(["--repeats", "1", "--imports", "json", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [row["variant"] for row in record["results"]] == [
        "imports, then a normal exit", "imports, frozen, then a normal exit", "imports, then os._exit (no teardown)",
        "an interpreter importing nothing"]
    assert all(row["cpu_seconds_median"] > 0 for row in record["results"])
    assert "of CPU (median of 1)" in capsys.readouterr().out


def test_workflow_parse_measures_the_dry_run_beside_the_parse_with_torch(tmp_path, capsys):
    out = tmp_path / "parse.json"
    assert load("workflow_parse").main(["--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [row["variant"] for row in rows] == ["the workflow's dry run",
                                                "the same, torch imported first (the parse before)"]
    assert all(row["cpu_seconds_median"] > 0 and row["wall_seconds_median"] > 0 for row in rows)
    assert "medians of 1" in capsys.readouterr().out


def test_mechanism_throughput_can_measure_only_what_has_a_reference(tmp_path):
    out = tmp_path / "references.json"
    arguments = ["--clients", "8", "--dims", "6", "--repetitions", "1", "--references-only", "--out", str(out)]
    assert load("mechanism_throughput").main(arguments) == 0
    rows = json.loads(out.read_text())["results"]
    assert {r["mechanism"] for r in rows} == {"streams.rand", "pm", "duchi", "hm"} and all("ratio" in r for r in rows)


@pytest.mark.parametrize("pairs", [1, 2, 4, 8])
def test_campaign_throughputs_grid_is_a_valid_campaign_of_the_runs_it_names(tmp_path, pairs):
    from ldpbench.campaign import count_runs, validate_config

    config = validate_config(load("campaign_throughput").grid(tmp_path, pairs, seeds=2, worker=False))
    assert count_runs(config) == 125 * pairs * 2  # (NP + 4 mechanisms x 6 ε) x 5 folds per pair and seed
    assert config["worker"] == {"enabled": False, "linger_seconds": 0}


def merged(base: dict, over: dict) -> dict:
    """`over` merged into `base` key by key, as Snakemake merges a --configfile over the Snakefile's."""
    return {**base, **{key: merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict)
                       else value for key, value in over.items()}}


@pytest.mark.parametrize("name", ["fedsel-table3", "bitrand-verdicts", "diffsketch-shakespeare"])
def test_a_campaign_from_scratch_writes_everything_in_its_directory_and_runs_the_files_runs(tmp_path, name):
    import yaml

    from ldpbench.campaign import count_runs, validate_config

    repo = Path(__file__).resolve().parents[2]
    defaults = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    campaign_file = repo / "config" / "campaigns" / f"{name}.yaml"
    as_written = yaml.safe_load(campaign_file.read_text())
    config = load("campaign_throughput").from_scratch(campaign_file, tmp_path / "run")
    assert (tmp_path / "run" / "config" / "config.yaml").exists()  # the Snakefile's own config file
    checked = validate_config(merged(defaults, config))
    assert count_runs(checked) == count_runs(validate_config(merged(defaults, as_written)))
    written = [checked["results_dir"], checked["data"]["raw_dir"], checked["data"]["prepared_dir"],
               checked["features"]["dir"], checked["tracking"]["uri"].removeprefix("sqlite:///")]
    assert all(Path(path).is_relative_to(tmp_path / "run") for path in written), written
    mirror = (repo / as_written.get("data", {}).get("mirror", defaults["data"]["mirror"])).resolve()
    assert checked["data"]["mirror"] == str(mirror) and checked["worker"]["linger_seconds"] == 0


def test_the_goals_table_orients_every_ratio_as_the_issue_states_its_target():
    """Engine over loop ≤ 1, and a deep network's round 1.5 times faster than the loop and than pfl-research
    (not met where pfl is not measured: unknown); round over floor ≤ 2 (Adult) or 1.5 (scaling), numpy time
    over ours ≥ 5, the draw ≥ 300 M values/s at its largest shape, the default campaign from scratch ≤ 20 s."""
    goals = load("performance_goals")
    engine = goals.engine_goals({"results": [
        {"scenario": "fedsel-adult-lr-ps-pm", "device": "cpu", "engine_round_seconds": 0.2,
         "loop_seconds_per_round": 0.4},
        {"scenario": "lenet5-mnist-fedsgd-10", "device": "cpu", "engine_round_seconds": 0.2,
         "loop_seconds_per_round": 0.25, "pfl_seconds_per_round": 0.4},
        {"scenario": "bitrand-mlp-fedavg-20", "device": "cpu", "engine_round_seconds": 0.5,
         "loop_seconds_per_round": 0.25}]})
    assert [(r["goal"], r["reference_name"], r["ratio"], r["met"]) for r in engine] == [
        ("1", "per-client loop", 0.5, True),
        ("1", "per-client loop", 0.8, True), ("7", "per-client loop", 1.25, False), ("7", "pfl-research", 2.0, True),
        ("1", "per-client loop", 2.0, False), ("7", "per-client loop", 0.5, False),
        ("7", "pfl-research (not installed: not measured)", None, None)]
    assert not any(r["goal"] == "7" for r in goals.engine_goals({"results": engine_results()}, goal="6"))
    linear = goals.linear_goals({"results": [
        {"data": "official Adult (a9a encoding)", "dims": 123, "cohort": 488, "draws": "numpy",
         "seconds_per_round": 3e-3, "floor_seconds_per_round": 1e-3, "ratio": 3.0},
        {"data": "one-hot stand-in", "dims": 1000, "cohort": 100, "draws": "compiled",
         "seconds_per_round": 1.4e-3, "floor_seconds_per_round": 1e-3, "ratio": 1.4}]})
    assert [(r["goal"], r["met"]) for r in linear] == [("2", False), ("5", True)]
    mechanisms = goals.mechanism_goals({"results": [
        {"mechanism": "streams.rand", "clients": 1000, "dims": 100, "values_per_second": 2e8,
         "reference_values_per_second": 1e8, "reference": "torch.rand", "ratio": 2.0},
        {"mechanism": "streams.rand", "clients": 1000, "dims": 10000, "values_per_second": 6e8,
         "reference_values_per_second": 2e8, "reference": "torch.rand", "ratio": 3.0},
        {"mechanism": "pm", "clients": 1000, "dims": 100, "values_per_second": 1e7,
         "reference_values_per_second": 2e7, "reference": "numpy reference", "ratio": 0.5},
        {"mechanism": "bitrand", "clients": 1000, "dims": 100, "values_per_second": 1e7}]})
    assert [r["met"] for r in mechanisms] == [None, True, False]  # the smaller draw is for scale only
    throughput = load("campaign_throughput")
    campaign = goals.campaign_goals({"cores": 2, "results": [
        {"workload": throughput.DEFAULT_SYN_L, "worker": True, "wall_seconds": 19.5},
        {"workload": throughput.DEFAULT_SYN_L, "worker": False, "wall_seconds": 160.0},
        {"workload": throughput.DEFAULT_WITH_ADULT, "worker": True, "wall_seconds": 32.0}]})
    assert [(r["figure"], r["reference"], r["met"]) for r in campaign] == [(19.5, 160.0, True), (32.0, 160.0, False)]
    profile = goals.profile_goals({"campaign": "config/campaigns/bitrand-verdicts.yaml", "results": [
        {"label": "noiseless", "dataset": "ag-news-test", "wall_seconds": 40.0,
         "share_outside_rounds_at_planned_rounds": 0.1},
        {"label": "BitRand", "dataset": "ag-news-test", "wall_seconds": 50.0,
         "share_outside_rounds_at_planned_rounds": 0.2}]})
    assert [(r["goal"], r["figure"], r["met"]) for r in profile] == [("8", 0.1, True), ("8", 0.2, False)]
    assert profile[0]["what"].startswith("bitrand-verdicts: noiseless (ag-news-test)")


def engine_results() -> list[dict]:
    return [{"scenario": "lenet5-mnist-fedsgd-10", "device": "cuda", "engine_round_seconds": 0.1,
             "loop_seconds_per_round": 0.3}]


def test_the_edit_loops_reruns_are_the_default_campaign_with_one_seed_more_and_the_variants_linger(tmp_path):
    """(Its runs are whole campaigns, measured by hand: here its campaign files and its CPU clock.)"""
    import time

    from ldpbench.campaign import validate_config

    edit_loop = load("edit_loop")
    default = validate_config(edit_loop.campaign(tmp_path, 3, 300))
    edited = validate_config(edit_loop.campaign(tmp_path, 4, 0))
    assert default["seeds"] == [0, 1, 2] and edited["seeds"] == [0, 1, 2, 3]
    assert (default["worker"]["linger_seconds"], edited["worker"]["linger_seconds"]) == (300, 0)
    assert {key: value for key, value in default.items() if key not in ("seeds", "worker")} == \
        {key: value for key, value in edited.items() if key not in ("seeds", "worker")}
    assert edit_loop.VARIANTS == {"warm seed": 300, "fresh worker": 0}
    before, deadline = edit_loop.busy_cpu_seconds(), time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert edit_loop.busy_cpu_seconds() - before >= 0.2
