"""End to end: the Snakemake workflow on a tiny campaign, through Snakemake's Python API."""

import json
import math
import re
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ldpbench.launch import fork_server
from ldpbench.results.schema import TABLES

from benchmark_scripts import load
from column_map import assert_tables_follow_column_map
from workflow_cli import run_snakemake, small_config, snakemake, tiny_config

pytestmark = pytest.mark.integration


def mtimes(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns
            for p in directory.rglob("*.parquet")}


@pytest.mark.slow
def test_campaign_end_to_end(tmp_path):
    started = time.perf_counter()
    config = tiny_config(tmp_path)
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump({"paper": "A paper", "claims": [
        {"id": "np-value", "source": "Table 1", "dataset": "syn-S-0.01-0.9", "model": "lr", "epsilon": math.inf,
         "relation": "value", "mechanisms": ["NP"], "value": 50.0},
        {"id": "pm-over-ps-pm", "source": "Figure 1", "dataset": "syn-S-0.01-0.9", "model": "lr", "epsilon": [1, 4, 8],
         "relation": "order", "mechanisms": ["PM", "PS-PM"]}]}))
    config["scorecard"] = {"claims": [str(claims)]}
    snakemake(tmp_path, config)
    elapsed = time.perf_counter() - started
    campaign = tmp_path / "results" / "tiny"

    runs = pd.read_parquet(campaign / "tables" / "runs.parquet")
    summary = pd.read_parquet(campaign / "tables" / "summary.parquet")
    curves = pd.read_parquet(campaign / "tables" / "curves.parquet")
    assert len(runs) == 1 + 2 * 2 and runs["run_id"].is_unique  # adult skipped (optional)
    assert set(runs["dataset"]) == {"syn-S-0.01-0.9"}
    assert (runs["status"] == "ok").all()
    assert json.loads((campaign / "manifest.json").read_text())["skipped_datasets"] == ["adult"]
    assert len(summary) == 5 and set(curves["run_id"]) == set(runs["run_id"])
    # Every table and run file the campaign wrote follows the column map; it ran no tuning.
    assert assert_tables_follow_column_map(campaign) == sorted(set(TABLES) - {"tuning", "selected"})
    np_row = runs[runs["mechanism"] == "np"].iloc[0]
    assert np_row["epsilon"] == float("inf") and np_row["epsilon_worst_case_per_report"] == float("inf")
    pm_rows = runs[runs["mechanism"] != "np"]
    assert (pm_rows["epsilon_claimed_per_report"] == pm_rows["epsilon"]).all()
    # One directory per run at its Hive-style path in each tree, with its per-client ledger.
    for row in runs.itertuples():
        run = Path(f"dataset={row.dataset}", f"mechanism={row.mechanism}", "phase=final", f"run_id={row.run_id}")
        assert (campaign / "runs" / "summaries" / run / "summary.parquet").exists()
        ledger = pd.read_parquet(campaign / "runs" / "ledgers" / run / "ledger.parquet")
        assert len(ledger) == row.clients and (ledger["reports"] == 1).all()
        assert ledger["epsilon_worst_case"].max() == row.epsilon_worst_case_client_max
    # Each tree is one table for pyarrow, DuckDB and polars: its own kind's rows, with the Hive keys.
    rows_per_tree = {"summaries": len(runs), "curves": len(curves), "ledgers": int(runs["clients"].sum())}
    for tree, rows in rows_per_tree.items():
        read = read_tree_three_ways(campaign / "runs" / tree)
        for reader, table in read.items():
            assert len(table) == rows and set(table["run_id"]) == set(runs["run_id"]), (tree, reader)
            assert set(table["phase"]) == {"final"}, (tree, reader)
        assert set(read["pyarrow"].columns) == set(read["duckdb"].columns) == set(read["polars"].columns)

    # Every job was forked from the campaign's warm worker, which ended with the workflow.
    worker_log = (tmp_path / "logs" / "tiny" / "worker.log").read_text()
    forked = [line for line in worker_log.splitlines() if f" {fork_server.FORKED} " in line]
    # ... each from a single OS thread (a dataset held, MLflow and numba loaded), none declined.
    assert all(f" from {fork_server.SINGLE_THREAD} " in line for line in forked), forked
    assert f" {fork_server.DECLINED} for process " not in worker_log
    assert sum("ldpbench run-cell" in line for line in forked) == len(set(runs["cell_id"]))
    # The final cells' jobs audited what they ran (PM and PS-PM at two ε), each audit once; the
    # audit-table job gathered them.
    assert sum("ldpbench audit-table" in line for line in forked) == 1
    assert len(list((campaign / "audit").glob("*.parquet"))) == 4
    assert f"worker stopped after {len(forked)} commands" in worker_log
    socket_path = Path(re.search(r"listening on (\S+)", worker_log).group(1))
    assert not socket_path.parent.exists()
    # The campaign's profile (benchmarks/campaign_profile.py) accounts for every job the worker forked,
    # splits the final cells' jobs into the runs' training, the audits and the rest, and its parts add
    # up to the campaign's core-time.
    profile = load("campaign_profile").profile(tmp_path, "tiny", elapsed, 2, snakemake_cpu=0.0)
    assert profile["jobs"] == len(forked) and profile["declined_jobs"] == 0
    assert sum(profile["core_seconds_by_part"].values()) == pytest.approx(2 * elapsed, abs=0.01)
    final = profile["run_cells"]["final"]
    assert final["training"] == pytest.approx(runs["train_seconds"].sum(), abs=1e-3) and final["audits"] > 0
    assert sum(final.values()) == pytest.approx(profile["core_seconds_by_part"]["runs (final)"], abs=0.01)
    assert set(profile["core_seconds_by_part"]) >= {"preparation", "runs (final)", "report", "tracking", "no job"}
    assert profile["cpu_seconds"]["jobs"] > 0 and profile["cpu_seconds"]["worker"] > 0
    # A cell's log names its runs (label, ε, seed) on every progress line.
    [pm_log] = [path for path in (tmp_path / "logs" / "tiny" / "runs").rglob("*.log")
                if "ldpbench: PM ε=1 seed 0: round" in path.read_text()]
    assert "mechanism=pm" in str(pm_log) and "left)" in pm_log.read_text()

    page = (campaign / "report" / "index.html").read_text()
    assert "tiny" in page and "worst-case ε" in page and "uplink bits" in page
    # Every private (mechanism, ε) audited at the ε of one report its runs spent, shown in the report.
    audit = pd.read_parquet(campaign / "tables" / "audit.parquet")
    assert sorted(zip(audit["mechanism"], audit["epsilon"])) == [(m, e) for m in ("pm", "ps-pm") for e in (1.0, 4.0)]
    assert (audit["samples"] == 20_000).all() and (audit["verdict"] == "consistent").all()
    assert "Claimed / worst-case / audited ε" in page
    # The claims read against the campaign: one row per claim and ε, ε = 8 not run.
    scorecard = pd.read_parquet(campaign / "tables" / "scorecard.parquet")
    assert list(zip(scorecard["claim"], scorecard["epsilon"])) == [
        ("np-value", float("inf")), ("pm-over-ps-pm", 1.0), ("pm-over-ps-pm", 4.0), ("pm-over-ps-pm", 8.0)]
    assert scorecard["status"].iloc[-1] == "not run" and "not run" not in set(scorecard["status"].iloc[:-1])
    assert "Reproduction scorecard" in page
    # Every figure as PNG and SVG; the page embeds the PNGs (it shows them wherever it is opened).
    figures = campaign / "report" / "figures"
    for figure in ("accuracy_vs_epsilon", "auc_vs_epsilon", "convergence", "accuracy_vs_communication"):
        assert (figures / f"{figure}.png").stat().st_size > 10_000
        assert (figures / f"{figure}.svg").read_text().lstrip().startswith("<?xml")
        assert f'href="figures/{figure}.svg"' in page
    sources = re.findall(r'<img src="([^"]*)"', page)
    assert len(sources) >= 4 and all(source.startswith("data:image/png;base64,") for source in sources)
    assert '<table class="sortable">' in page and "<script>" in page
    # Snakemake's own report carries the page and every figure, and the page in it shows its images.
    report_zip = tmp_path / "snakemake-report.zip"
    result = run_snakemake(tmp_path, config, "--report", str(report_zip))
    assert result.returncode == 0, result.stdout[-3000:]
    with zipfile.ZipFile(report_zip) as archive:
        names = archive.namelist()
        carried = {Path(name).name for name in names}
        assert {path.name for path in figures.glob("*.[ps][nv]g")} <= carried and "index.html" in carried
        [embedded] = [name for name in names if name.endswith("/index.html")]
        embedded_sources = re.findall(r'<img src="([^"]*)"', archive.read(embedded).decode())
        assert embedded_sources == sources

    # MLflow agrees with the tables.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=config["tracking"]["uri"])
    experiment = client.get_experiment_by_name("ldpbench/tiny")
    summary = pd.read_parquet(campaign / "tables" / "summary.parquet")
    logged = client.search_runs([experiment.experiment_id], max_results=100)
    level = {r.info.run_id: r.data.tags["ldpbench.level"] for r in logged}
    children = [r for r in logged if level[r.info.run_id] == "run"]
    configurations = {r.data.tags["run_key"]: r for r in logged if level[r.info.run_id] == "configuration"}
    # The campaign, its configurations, their runs, and a curve across ε per dataset, model and private label.
    private = summary[np.isfinite(summary["epsilon"])]
    curve_runs = len(private.groupby(["dataset", "model", "label"]))
    assert len(logged) == 1 + len(summary) + curve_runs + len(runs) and len(children) == len(runs)
    assert sum(level[r.info.run_id] == "curve" for r in logged) == curve_runs
    assert all("mlflow.parentRunId" not in r.data.tags for r in configurations.values())
    for row in summary.itertuples():  # each summary row is a configuration, with its numbers
        [configuration] = [r for r in configurations.values() if r.data.params["label"] == row.label
                           and r.data.tags["epsilon"] == f"{row.epsilon:g}"]
        assert configuration.data.metrics["test_accuracy_mean"] == pytest.approx(row.mean, abs=1e-12)
        assert [i.dataset.name for i in configuration.inputs.dataset_inputs] == [row.dataset]
    by_key = {r.data.tags["run_key"]: r for r in children}
    for row in runs.itertuples():
        child = by_key[row.run_id]
        assert level[child.data.tags["mlflow.parentRunId"]] == "configuration"
        # A curve's last point is the run's final value (so the run carries its curves alone).
        assert child.data.metrics["test_accuracy"] == pytest.approx(row.test_accuracy, abs=1e-12)
        assert float(child.data.tags["final.test_accuracy"]) == pytest.approx(row.test_accuracy, abs=1e-12)
        assert child.data.tags["mechanism"] == row.mechanism and child.data.params["seed"] == "0"
        history = client.get_metric_history(child.info.run_id, "test_accuracy")
        expected = curves[curves["run_id"] == row.run_id].set_index("round")["test_accuracy"]
        assert {m.step: m.value for m in history} == pytest.approx(expected.to_dict(), abs=1e-12)
    [parent] = [r for r in logged if level[r.info.run_id] == "campaign"]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "tables")}
    assert artifacts == {f"tables/{table}.parquet" for table in ("runs", "curves", "summary", "comparisons",
                                                                 "rankings", "verdicts", "audit", "scorecard")}
    assert {"campaign.yaml", "manifest.json"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "epsilons:" in (campaign / "campaign.yaml").read_text()
    # The report, drawn while `track` logged the tables, attached to the campaign run afterwards, whole.
    attached = json.loads((campaign / "tracking" / "report.json").read_text())
    assert attached["campaign_run_id"] == parent.info.run_id
    assert attached["report_files"] == sorted(str(path.relative_to(campaign / "report"))
                                              for path in (campaign / "report").rglob("*") if path.is_file())
    assert {"report/index.html", "report/figures"} <= {a.path for a in client.list_artifacts(parent.info.run_id,
                                                                                                "report")}

    # Re-running after success does nothing.
    before = mtimes(campaign)
    snakemake(tmp_path, config)
    assert mtimes(campaign) == before

    # Changing one ε reruns only the new runs plus aggregation; tracking adds only the new runs.
    snakemake(tmp_path, tiny_config(tmp_path, epsilons=(1, 2)))
    after = mtimes(campaign)
    runs_after = pd.read_parquet(campaign / "tables" / "runs.parquet")
    assert set(runs_after["epsilon"]) == {1.0, 2.0, float("inf")}
    old_run_files = [k for k in before if "/run_id=" in k]
    assert all(after[k] == before[k] for k in old_run_files)  # no old run was recomputed
    new_run_files = [k for k in after if "/run_id=" in k and k not in before]
    assert len(new_run_files) == 2 * 3  # the two ε = 2 runs: summary, curve and ledger each
    # The ε = 4 runs stay on disk but leave the tables: only the manifest's runs are aggregated.
    assert len(runs_after) == 5 and runs_after["run_id"].is_unique
    assert after["tables/summary.parquet"] != before["tables/summary.parquet"]
    marker = json.loads((campaign / "tracking" / "mlflow.json").read_text())
    assert marker["created"] == 2 and marker["skipped"] == 3 and marker["removed"] == 2
    logged = client.search_runs([experiment.experiment_id], max_results=100)
    # MLflow matches the tables: the ε = 4 runs and their configurations are soft-deleted (and each
    # private label's curve now spans ε 1 and 2).
    summary_after = pd.read_parquet(campaign / "tables" / "summary.parquet")
    private_after = summary_after[np.isfinite(summary_after["epsilon"])]
    assert len(logged) == 1 + len(summary_after) + len(private_after.groupby(["dataset", "model", "label"])) + 5

    # Pointing the campaign at a tracking server (live progress on) reruns no cell: the jobs learn the
    # server from their environment, not from a changed command line.
    served = tiny_config(tmp_path, epsilons=(1, 2))
    served["tracking"] = {"uri": "http://127.0.0.1:9"}
    plan = run_snakemake(tmp_path, served, "--dry-run")
    assert plan.returncode == 0, plan.stdout[-3000:]
    planned = dict(re.findall(r"^(\w+)\s+(\d+)$", plan.stdout.split("Job stats:")[1], re.M))
    assert "track" in planned and "run_cell" not in planned and "aggregate" not in planned, planned
    print(f"tiny campaign wall time {elapsed:.1f} s")  # a number for people; speed is not asserted


def test_typo_in_campaign_fails_before_any_job(tmp_path):
    config = tiny_config(tmp_path)
    config["mechanisms"][1]["params"] = {"mu": 0.1}  # pm has no mu
    with pytest.raises(Exception) as info:
        snakemake(tmp_path, config, dryrun=True)
    assert "mechanisms[1].params" in str(info.value) or "mechanisms[1].params" in str(info.value.__cause__)
    assert not (tmp_path / "results").exists() and not (tmp_path / "prepared").exists()


def test_missing_required_dataset_names_the_file(tmp_path):
    config = tiny_config(tmp_path)
    config["datasets"] = [{"name": "adult"}]  # not optional, no mirror, no download
    with pytest.raises(Exception):  # noqa: B017 (the job fails; its log, below, says why)
        snakemake(tmp_path, config)
    log = (tmp_path / "logs" / "data" / "prepare_adult.log").read_text()
    assert "'adult.data' is missing" in log and "data.mirror" in log
    assert not (tmp_path / "prepared" / "adult" / "meta.json").exists()


def read_tree_three_ways(tree: Path) -> dict[str, pd.DataFrame]:
    """One tree of run files read as one dataset by pyarrow, DuckDB and polars (the README's query)."""
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds

    files = f"{tree}/**/*.parquet"
    return {
        "pyarrow": ds.dataset(tree, format="parquet", partitioning="hive").to_table().to_pandas(),
        "duckdb": duckdb.sql(f"SELECT * FROM read_parquet('{files}', hive_partitioning = true)").df(),
        "polars": pl.scan_parquet(files, hive_partitioning=True).collect().to_pandas(),
    }


@pytest.mark.parametrize("uri, waits_for_the_tables", [("sqlite:///results/mlflow.db", True),
                                                        ("http://127.0.0.1:9", False)])
def test_a_sqlite_store_is_built_beside_the_report_and_a_server_is_checked_first(tmp_path, uri,
                                                                                 waits_for_the_tables):
    """SQLite: the store's schema (seconds of MLflow migrations) waits for the aggregated tables, so it
    takes a core the serial tail leaves idle instead of one the first runs need. A server: nothing
    before it (live runs stream into its experiment; a server that is away fails at the start)."""
    config = small_config(name="order")
    config["tracking"] = {"uri": uri}
    graph = run_snakemake(tmp_path, config, "--rulegraph", "--quiet", "all")
    assert graph.returncode == 0, graph.stdout[-3000:]
    names = dict(re.findall(r'(\d+)\[label = "(\w+)"', graph.stdout))
    edges = {(names[a], names[b]) for a, b in re.findall(r"(\d+) -> (\d+)", graph.stdout)}
    assert ("tracking_store", "track") in edges
    into_the_store = {source for source, target in edges if target == "tracking_store"}
    assert into_the_store == ({"aggregate"} if waits_for_the_tables else set())
    # The report is drawn while `track` logs the tables (seconds each, on two cores): neither waits for
    # the other, and the report is attached to MLflow's campaign run once both are done. `track` still
    # waits for every table it logs: the verdicts and the audit.
    assert ("report", "track") not in edges and ("track", "report") not in edges
    assert {source for source, target in edges if target == "track_report"} == {"report", "track"}
    assert {"compare", "audit_table"} <= {source for source, target in edges if target == "track"}
