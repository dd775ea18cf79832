"""`ldpbench validate --estimate`: a campaign's runs, cells, SLURM jobs and the core-time of its runs, priced
from measured runs written here with known wall times (ldpbench.estimate)."""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from ldpbench.atomic import write_parquet
from ldpbench.campaign import campaign_cells, runnable_datasets, tuned_cell_runs, validate_config
from ldpbench.cli import main
from ldpbench.errors import ConfigError
from ldpbench.estimate import Measurements, estimate
from ldpbench.fl.settings import TrainingSettings
from ldpbench.layout import SUMMARIES, run_file
from ldpbench.plan import canonical_json
from ldpbench.results.schema import SUMMARY_SCHEMA

# Measured wall seconds of one run, by mechanism, of which TRAIN in training; the pilot's runs train
# PILOT_ROUNDS rounds.
WALL = {"np": 2.0, "pm": 3.0}
TRAIN = {"np": 1.5, "pm": 2.0}
PILOT_ROUNDS = 10
PILOT_CLIENTS = 400


def campaign(**changes) -> dict:
    """NP and PM on syn-S at two ε and two seeds, the learning rate tuned over two points."""
    config = {"campaign": "sized", "results_dir": "results", "datasets": [{"name": "syn-S-0.1-0.9"}],
              "models": ["lr"], "mechanisms": [{"name": "np"}, {"name": "pm"}], "epsilons": [1, 4],
              "seeds": [0, 1], "training": {"rounds": PILOT_ROUNDS},
              "tuning": {"space": {"learning_rate": [0.03, 0.3]}}}
    config.update(changes)
    return validate_config(copy.deepcopy(config))


def planned_runs(config: dict) -> list[tuple[str, dict]]:
    """(phase, plan) of every run the campaign plans (tuned final cells at the entry's own settings)."""
    datasets, _ = runnable_datasets(config)
    return [(cell.phase, run["plan"]) for cell in campaign_cells(config, datasets)
            for run in (tuned_cell_runs(config, cell, {}) if cell.tuned else cell.runs)]


def write_measured(store, plans) -> None:
    """A stored summary per plan, with WALL[mechanism] seconds over PILOT_ROUNDS rounds."""
    for index, (phase, plan) in enumerate(plans):
        row = {field.name: None for field in SUMMARY_SCHEMA} | {
            "run_id": f"{index:016x}", "dataset": plan["dataset"], "model": plan["model"],
            "mechanism": plan["mechanism"], "mechanism_params": canonical_json(plan["mechanism_params"]),
            "epsilon": math.inf if plan["epsilon"] is None else plan["epsilon"], "seed": plan["seed"],
            "fold": plan["fold"], "plan": canonical_json(plan), "status": "ok",
            "rounds": PILOT_ROUNDS, "clients": PILOT_CLIENTS, "wall_seconds": WALL[plan["mechanism"]],
            "train_seconds": TRAIN[plan["mechanism"]]}
        write_parquet(run_file(store, SUMMARIES, plan["dataset"], plan["mechanism"], phase, row["run_id"]), [row],
                      SUMMARY_SCHEMA)


def sized(config: dict, store=None, profile=None):
    datasets, skipped = runnable_datasets(config)
    return estimate(config, datasets, skipped, None if store is None else Measurements.read([store]), profile)


def test_every_run_is_priced_by_its_kind_whatever_its_seed_epsilon_or_learning_rate(tmp_path):
    config = campaign()
    plans = planned_runs(config)
    # Measured: seed 0 at ε 1 (or NP) alone, the trials at the first learning rate alone; yet every planned
    # run is of a measured kind (a trial's kind is not a final run's: it holds validation clients out).
    pilot = [(phase, plan) for phase, plan in plans if plan["seed"] == 0 and plan["epsilon"] in (None, 1.0)
             and (phase == "final" or plan["training"]["learning_rate"] == 0.03)]
    assert 0 < len(pilot) < len(plans)
    write_measured(tmp_path / "runs", pilot)
    found = sized(config, tmp_path / "runs")
    assert found.priced == {"of its kind": len(plans)} and found.unmeasured == {}
    assert found.core_seconds == pytest.approx(sum(WALL[plan["mechanism"]] for _, plan in plans))
    # 2 trial runs (points) per configuration and ε, 2 final runs (seeds): NP 1 ε, PM 2.
    assert found.runs == {"trial": 6, "final": 6} and len(found.cells) == 6
    text = "\n".join(found.lines())
    assert "runs: 6 final, 6 tuning trials" in text and "6 cells (3 trial, 3 final)" in text
    assert f"core-time of the runs: {found.core_seconds:.1f} core-seconds for 12 of 12 runs" in text


def test_runs_of_an_unmeasured_kind_are_priced_per_round_at_the_rounds_they_plan(tmp_path):
    pilot = campaign()
    write_measured(tmp_path / "runs", planned_runs(pilot))
    # Epochs instead of a fixed round count: the rounds follow from the pilot's training clients.
    config = campaign(training={"epochs": 2, "batch_fraction": 0.05})
    rounds = TrainingSettings(epochs=2, batch_fraction=0.05).total_rounds(PILOT_CLIENTS)
    assert rounds != PILOT_ROUNDS
    found = sized(config, tmp_path / "runs")
    assert found.priced == {"per round": 12}
    # Each run's time outside training as measured, its training time per round times its rounds.
    expected = sum(WALL[mechanism] - TRAIN[mechanism] + TRAIN[mechanism] / PILOT_ROUNDS * rounds
                   for mechanism in (plan["mechanism"] for _, plan in planned_runs(config)))
    assert found.core_seconds == pytest.approx(expected)


def test_what_nothing_measured_prices_is_listed_not_guessed(tmp_path):
    write_measured(tmp_path / "runs", planned_runs(campaign()))
    config = campaign(mechanisms=[{"name": "np"}, {"name": "pm"}, {"name": "hm", "label": "HM"}])
    found = sized(config, tmp_path / "runs")
    hm = "syn-S-0.1-0.9 · lr · hm(anonymizer=False)"
    assert found.unmeasured == {hm: 4 + 4}  # 2 ε × (2 trial points + 2 seeds)
    assert found.core_seconds == pytest.approx(sized(campaign(), tmp_path / "runs").core_seconds)
    assert f"unmeasured: 8 runs of {hm}" in "\n".join(found.lines())
    # A split the pilot never had (another test share) leaves epoch-planned rounds unknown: unmeasured too.
    other_split = campaign(training={"epochs": 1}, split={"test_fraction": 0.3})
    assert sum(sized(other_split, tmp_path / "runs").unmeasured.values()) == 12
    # No measurement at all: the counts, and no core-time.
    assert "core-time: not estimated: no measured runs" in "\n".join(sized(config).lines())


def test_slurm_jobs_follow_the_profiles_grouping_and_a_cell_past_its_runtime_is_warned(tmp_path):
    from ldpbench.estimate import slurm_jobs

    repository_profile = slurm_jobs("profiles/slurm", {"trial": 30, "final": 60}, 1)
    assert (repository_profile.group_size, repository_profile.cores) == (25, 4)
    assert repository_profile.cell_jobs == math.ceil(30 / 25) + math.ceil(60 / 25)
    assert repository_profile.cell_runtime_minutes == 30  # "30 * attempt" at the first attempt
    profile = tmp_path / "site"
    profile.mkdir()
    (profile / "profile.yaml").write_text(yaml.safe_dump({
        "cores": 2, "groups": {"run_cell": "runs"}, "group-components": {"runs": 2},
        "set-resources": {"run_cell": {"runtime": "0.001 * attempt"}}}))
    write_measured(tmp_path / "runs", planned_runs(campaign()))
    found = sized(campaign(), tmp_path / "runs", profile)
    assert found.slurm.cell_jobs == math.ceil(3 / 2) + math.ceil(3 / 2) and found.slurm.other_jobs == 1
    text = "\n".join(found.lines())
    assert f"SLURM ({profile}): at least 4 jobs for the cells (2 cells per job, 2 at a time)" in text
    assert "warning: the longest cell exceeds the profile's run_cell runtime (0.001 min at the first attempt)" in text
    (profile / "profile.yaml").write_text(yaml.safe_dump({"set-resources": {"run_cell": {"runtime": 60}}}))
    ungrouped = sized(campaign(), tmp_path / "runs", profile)
    assert ungrouped.slurm.cell_jobs == 6 and "warning" not in "\n".join(ungrouped.lines())


def test_the_command_prints_the_estimate_and_names_a_bad_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = campaign()
    raw = {"campaign": "sized", "datasets": [{"name": "syn-S-0.1-0.9"}], "models": ["lr"],
           "mechanisms": [{"name": "np"}, {"name": "pm"}], "epsilons": [1, 4], "seeds": [0, 1],
           "training": {"rounds": PILOT_ROUNDS}, "tuning": {"space": {"learning_rate": [0.03, 0.3]}}}
    (tmp_path / "sized.yaml").write_text(yaml.safe_dump(raw))
    assert main(["validate", "sized.yaml", "--estimate"]) == 0
    assert "core-time: not estimated: no measured runs" in capsys.readouterr().out
    # The campaign's own run store, once it has one, is what it estimates from by default.
    write_measured(tmp_path / "results" / "sized" / "runs", planned_runs(config))
    assert main(["validate", "sized.yaml", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert "for 12 of 12 runs (12 of its kind)" in out and "measured: 12 stored runs under results/sized/runs" in out
    assert main(["validate", "sized.yaml", "--measured", "results"]) != 0
    assert "give --estimate with them" in capsys.readouterr().err
    assert main(["validate", "sized.yaml", "--estimate", "--measured", "nowhere"]) != 0
    assert "--measured 'nowhere': no such directory" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="holds no stored run"):
        Measurements.read([tmp_path])  # a directory without a run store

