"""Tracking at scale: concurrent writers to the SQLite store, and the tracking-server mode checked
through its REST API and a headless-Chromium screenshot of the UI's runs page."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

import fresh_processes
from browser import chromium_or_skip, render
from workflow_cli import environment, run_snakemake, small_config

# Each test takes minutes: eight writer processes, or a tracking server with a campaign logged into it.
pytestmark = pytest.mark.slow

# ---------------------------------------------------------------------------- concurrent writers
def _writer(uri: str, experiment_id: str, writer: int, queue) -> None:
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        run = client.create_run(experiment_id, run_name=f"writer-{writer}", tags={"writer": str(writer)})
        for batch in range(5):  # live progress: 5 batches of 100 steps, as a cluster job would log
            metrics = [Metric("progress", float(writer * 1000 + step), 0, step)
                       for step in range(batch * 100, (batch + 1) * 100)]
            client.log_batch(run.info.run_id, metrics=metrics,
                             params=[Param(f"p{batch}", str(batch))])
        client.set_terminated(run.info.run_id)
        queue.put((writer, None))
    except Exception as error:  # reported to the parent, which fails the test with it
        queue.put((writer, f"{type(error).__name__}: {error}"))


def test_eight_concurrent_writers_lose_nothing(tmp_path):
    from ldpbench.results.tracking import init_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = init_store(uri, "concurrency", tmp_path / "artifacts", tmp_path / "store.json")
    context = fresh_processes.context()
    queue = context.Queue()
    writers = [context.Process(target=_writer, args=(uri, store["experiment_id"], i, queue))
               for i in range(8)]
    for process in writers:
        process.start()
    outcomes = dict(queue.get(timeout=300) for _ in writers)
    for process in writers:
        process.join(timeout=60)
    assert outcomes == {i: None for i in range(8)}  # no lock error, no exception at all

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([store["experiment_id"]], max_results=100)
    assert sorted(int(r.data.tags["writer"]) for r in runs) == list(range(8))
    for run in runs:
        writer = int(run.data.tags["writer"])
        history = client.get_metric_history(run.info.run_id, "progress")
        assert sorted(m.step for m in history) == list(range(500))
        assert {m.value for m in history} == {float(writer * 1000 + s) for s in range(500)}
        assert len(run.data.params) == 5


# ---------------------------------------------------------------------------- tracking server
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _post(base: str, endpoint: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`ldpbench tracking-server` on 127.0.0.1 (free port), in its own process group."""
    root = tmp_path_factory.mktemp("server")
    port = _free_port()
    log = open(root / "server.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "ldpbench", "tracking-server", "--store", str(root / "server.db"),
         "--artifacts", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port)],
        env=environment(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not become healthy:\n{(root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"base": base, "root": root}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def logged(server, tmp_path_factory):
    """A tiny campaign named 'uicheck' tracked into the server through its URI."""
    workdir = tmp_path_factory.mktemp("uicheck")
    config = small_config(name="uicheck", seeds=(0,))
    config["tracking"] = {"uri": server["base"]}
    result = run_snakemake(workdir, config, "--cores", "2")
    assert result.returncode == 0, result.stdout[-5000:]
    return {"workdir": workdir, "config": config}


def test_server_lists_parent_and_child_runs_with_metrics_and_track_is_idempotent(server, logged):
    base = server["base"]
    experiments = _post(base, "experiments/search",
                        {"max_results": 10, "filter": "name = 'ldpbench/uicheck'"})["experiments"]
    assert len(experiments) == 1
    experiment_id = experiments[0]["experiment_id"]

    def runs() -> list[dict]:
        return _post(base, "runs/search", {"experiment_ids": [experiment_id], "max_results": 100})["runs"]

    def tags(run: dict) -> dict:
        return {t["key"]: t["value"] for t in run["data"].get("tags", [])}

    logged_runs = runs()
    level = {r["info"]["run_id"]: tags(r)["ldpbench.level"] for r in logged_runs}
    parents = [r for r in logged_runs if level[r["info"]["run_id"]] == "campaign"]
    configurations = [r for r in logged_runs if level[r["info"]["run_id"]] == "configuration"]
    children = [r for r in logged_runs if level[r["info"]["run_id"]] == "run"]
    assert len(parents) == 1 and parents[0]["info"]["run_name"] == "uicheck"
    assert len(children) == 5 and len(configurations) == 5  # np + pm x 2 ε + ps-pm x 2 ε, one seed
    assert all("mlflow.parentRunId" not in tags(r) for r in (*parents, *configurations))
    assert {tags(c)["mlflow.parentRunId"] for c in children} == {r["info"]["run_id"] for r in configurations}
    for child in children:
        metrics = {m["key"]: m["value"] for m in child["data"]["metrics"]}
        assert set(metrics) == {"test_accuracy", "test_auc", "test_loss", "train_loss"}  # the curves alone
        assert 0.0 <= float(tags(child)["final.test_accuracy"]) <= 1.0
    before = {tags(c)["run_key"]: {m["key"]: m["value"] for m in c["data"]["metrics"]} for c in children}

    # While they trained, the runs streamed their rounds to the server (tracking.live); `track`
    # soft-deleted those live runs once it had logged the final ones.
    live = _post(base, "runs/search", {"experiment_ids": [experiment_id], "max_results": 100, "run_view_type": "ALL",
                                       "filter": "tags.`ldpbench.level` = 'live'"})["runs"]
    said = [line for log in sorted(logged["workdir"].rglob("*.log")) for line in log.read_text().splitlines()
            if "live" in line]  # why a live run is missing, should one be
    assert len(live) == 5 and all(r["info"]["lifecycle_stage"] == "deleted" for r in live), said
    import pandas as pd

    curves = pd.read_parquet(logged["workdir"] / "results" / "uicheck" / "tables" / "curves.parquet")
    for run in live:
        query = f"run_id={run['info']['run_id']}&metric_key=test_accuracy&max_results=1000"
        with urllib.request.urlopen(f"{base}/api/2.0/mlflow/metrics/get-history?{query}", timeout=30) as response:
            history = json.loads(response.read())["metrics"]
        curve = curves[curves["run_id"] == tags(run)["ldpbench.run_id"]]
        assert {m["step"]: m["value"] for m in history} == pytest.approx(
            dict(zip(curve["round"], curve["test_accuracy"])), abs=1e-12)

    # Tracking again (forced) finds every run by its key: nothing duplicated, no number changed.
    again = run_snakemake(logged["workdir"], logged["config"], "--cores", "2", "--forcerun", "track")
    assert again.returncode == 0, again.stdout[-5000:]
    marker = json.loads((logged["workdir"] / "results" / "uicheck" / "tracking" / "mlflow.json").read_text())
    assert marker["created"] == 0 and marker["skipped"] == 5
    after = runs()
    assert len(after) == len(logged_runs)
    assert {tags(c)["run_key"]: {m["key"]: m["value"] for m in c["data"]["metrics"]}
            for c in after if tags(c)["ldpbench.level"] == "run"} == before


def test_ui_shows_configuration_rows_with_their_metric_columns(server, logged):
    """The runs page opens on the configurations (their runs folded under them), and the
    configurations view shows them alone with their numbers as columns, best accuracy first."""
    chromium = chromium_or_skip()
    marker = json.loads((logged["workdir"] / "results" / "uicheck" / "tracking" / "mlflow.json").read_text())
    import pandas as pd

    summary = pd.read_parquet(logged["workdir"] / "results" / "uicheck" / "tables" / "summary.parquet")
    configuration_names = {f"{row.dataset}/{row.model}/{row.label}/eps={row.epsilon:g}" for row in summary.itertuples()}
    assert len(configuration_names) == 5
    with tempfile.TemporaryDirectory() as profile:
        runs_page = render(chromium, f"{server['base']}/#/experiments/{marker['experiment_id']}/runs",
                           "mlflow-runs-page.png", profile + "/runs")
        view = render(chromium, f"{server['base']}/{marker['configurations_view']}",
                      "mlflow-configurations-view.png", profile + "/view")
        charts = render(chromium, f"{server['base']}/{marker['configurations_view']}&compareRunsMode=CHART",
                        "mlflow-configurations-charts.png", profile + "/charts")
    # Top-level rows: the campaign and its configurations; the runs (seed=, fold=) stay folded.
    assert "uicheck" in runs_page and all(name in runs_page for name in configuration_names)
    assert "/seed=" not in runs_page
    columns = set(re.findall(r'col-id="(metrics\.`[^`]+`)"', view))
    assert {"metrics.`accuracy_pct`", "metrics.`epsilon`", "metrics.`bits_per_report`"} <= columns, columns
    assert all(name in view for name in configuration_names) and "/seed=" not in view
    # The chart view opens on ldpbench's scatter plots of the configurations.
    assert "Accuracy against privacy and bits" in charts and "epsilon vs. accuracy_pct" in charts
