"""The edit loop on the default campaign file itself (config/config.yaml): a seed and an ε edit each rerun
exactly what they change, and the tables, the report and MLflow are then those of the edited file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from edit_loop import AFTER_FINAL, TABLES, TUNING, Campaign, cells_of, stored, tables
from workflow_cli import TEST_AUDIT

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_default_campaign_takes_a_seed_and_a_new_epsilon(tmp_path):
    """The issue's own cases, on config/config.yaml itself (syn-L; UCI Adult is left out where its files are
    not at hand, as here): a fourth seed, then ε 8 -> 4, each planned exactly, and the tables, the report and
    MLflow those of the edited file."""
    import yaml

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["results_dir"] = "results"
    config["data"].update(raw_dir=str(tmp_path / "raw"), prepared_dir=str(tmp_path / "prepared"), mirror=None)
    config["tracking"]["uri"] = "sqlite:///results/mlflow.db"
    # The audit at the test campaigns' number of reports: which pairs an edit audits is this test's concern,
    # not how closely each is audited.
    config["audit"] = {**config.get("audit", {}), **TEST_AUDIT}
    targets = (*(f"results/default/tables/{table}.parquet" for table in TABLES), "results/default/report/index.html",
               "results/default/tracking/mlflow.json", "results/default/tracking/report.json")
    campaign = Campaign(tmp_path, config, targets, dry_run_first=True)
    campaign.start()
    # The report, MLflow, the campaign file and the report MLflow attaches.
    views = {"report", "track", "track_report", "campaign_file"}
    # A seed: a new final cell per configuration, each training that seed alone.
    new = campaign.edit(lambda c: c.update(seeds=[0, 1, 2, 3]), reruns=set(), tail=AFTER_FINAL | views)
    assert len(new) == len([c for c in cells_of(campaign.config).values() if c == "final"]) == 7
    runs = tables(campaign.workdir, "default")["runs"]
    assert sorted(runs["seed"].unique()) == [0, 1, 2, 3] and len(runs) == 7 * 4
    assert_mlflow_matches_the_tables(campaign.workdir)
    # ε 8 -> 4: PM and PS-PM at ε = 4, their trials and final cells; nothing else.
    new = campaign.edit(lambda c: c.update(epsilons=[0.5, 2, 4]), reruns=TUNING, tail=AFTER_FINAL | views)
    assert Counter(cells_of(campaign.config)[cell] for cell in new) == {"trial": 2, "final": 2}
    assert set(tables(campaign.workdir, "default")["summary"]["epsilon"]) == {0.5, 2.0, 4.0, float("inf")}
    assert_mlflow_matches_the_tables(campaign.workdir)
    # The README's query over the run store: the learning rates tried, by phase, of every run trained
    # (the ε = 8 runs stay in the store: they left the tables only).
    import duckdb

    query = (REPO / "README.md").read_text().split("```sql\n")[1].split("```")[0]
    found = duckdb.sql(query.replace("'results/", f"'{campaign.workdir}/results/")).df()
    trials = found[found["phase"] == "trial"]
    assert set(trials["learning_rate"]) == {0.03, 0.1, 0.3} and set(found["phase"]) == {"trial", "final"}
    assert set(found["epsilon"]) == {0.5, 2.0, 4.0, 8.0, float("inf")}
    assert found.loc[found["phase"] == "final", "runs"].sum() == len(stored(campaign.workdir, "default")) - \
        trials["runs"].sum()


def assert_mlflow_matches_the_tables(workdir: Path) -> None:
    """MLflow, a view of the tables: a live run per run of the tables and a configuration per summary row
    with its mean; a tuning run per selected setting, under its configuration, and a trial per trial run of
    the tuning table, under its tuning run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'results' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ldpbench/default")
    logged = client.search_runs([experiment.experiment_id], max_results=1000)
    by_level = {}
    for run in logged:
        by_level.setdefault(run.data.tags["ldpbench.level"], []).append(run)
    found = tables(workdir, "default")
    runs, summary, tuning, selected = (found[name] for name in ("runs", "summary", "tuning", "selected"))
    assert sorted(run.data.tags["run_key"] for run in by_level["run"]) == sorted(runs["run_id"])
    assert sorted(run.data.tags["run_key"] for run in by_level["trial"]) == sorted("trial/" + tuning["run_id"])
    configurations = {run.info.run_id: run for run in by_level["configuration"]}
    swept = {(configurations[run.data.tags["mlflow.parentRunId"]].data.params["label"], run.data.params["epsilon"],
              run.data.params["selected_setting"]) for run in by_level["tuning"]}
    assert swept == {(row.label, f"{row.epsilon:g}", row.setting) for row in selected.itertuples()}
    means = {(run.data.params["label"], run.data.tags["epsilon"]): run.data.metrics["test_accuracy_mean"]
             for run in by_level["configuration"]}
    assert means == pytest.approx({(row.label, f"{row.epsilon:g}"): row.mean for row in summary.itertuples()})
