"""The benchmark scripts run (tiny sizes); their numbers are for people, not assertions."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


@pytest.mark.slow
def test_engine_throughput_runs_every_scenario(tmp_path, capsys):
    out = tmp_path / "engine.json"
    module = load("engine_throughput")
    assert module.main(["--quick", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [r["scenario"] for r in record["results"]] == list(module.SCENARIOS)
    assert all(r["seconds_per_round"] > 0 and r["vectorisation_ratio"] > 0 for r in record["results"])
    assert "ratio" in capsys.readouterr().out
