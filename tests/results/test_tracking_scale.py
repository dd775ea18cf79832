"""Tracking at scale: concurrent writers to the SQLite store, and the tracking-server mode checked
through its REST API and a headless-Chromium screenshot of the UI's runs page."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from workflow_cli import REPO, environment, run_snakemake, small_config

# Each test takes minutes: eight writer processes, or a tracking server with a campaign logged into it.
pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"


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
    context = multiprocessing.get_context("spawn")
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
        assert 0.0 <= metrics["final/test_accuracy"] <= 1.0 and "test_accuracy" in metrics
    before = {tags(c)["run_key"]: {m["key"]: m["value"] for m in c["data"]["metrics"]} for c in children}

    # Tracking again (forced) finds every run by its key: nothing duplicated, no number changed.
    again = run_snakemake(logged["workdir"], logged["config"], "--cores", "2", "--forcerun", "track")
    assert again.returncode == 0, again.stdout[-5000:]
    marker = json.loads((logged["workdir"] / "results" / "uicheck" / "tracking" / "mlflow.json").read_text())
    assert marker["created"] == 0 and marker["skipped"] == 5
    after = runs()
    assert len(after) == len(logged_runs)
    assert {tags(c)["run_key"]: {m["key"]: m["value"] for m in c["data"]["metrics"]}
            for c in after if tags(c)["ldpbench.level"] == "run"} == before


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--virtual-time-budget=15000", "--hide-scrollbars"]


def test_ui_runs_page_renders_in_headless_chromium(server, logged):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); UI screenshot not taken")
    experiments = _post(server["base"], "experiments/search",
                        {"max_results": 10, "filter": "name = 'ldpbench/uicheck'"})["experiments"]
    url = f"{server['base']}/#/experiments/{experiments[0]['experiment_id']}/runs"
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "mlflow-runs-page.png"
    screenshot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        shot = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}/a",
                               "--window-size=1400,900", f"--screenshot={screenshot}", url],
                              capture_output=True, text=True, timeout=180)
        dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}/b", "--dump-dom", url],
                             capture_output=True, text=True, timeout=180)
    assert screenshot.exists() and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    print(f"\nMLflow runs page screenshot: {screenshot}")
    page = dom.stdout
    title = page.split("<title>", 1)[1].split("</title>", 1)[0].strip() if "<title>" in page else ""
    assert title, f"the runs page has no title; chromium said: {dom.stderr[-2000:]}"
    # The runs table lists the campaign's parent run by name once the app has rendered.
    assert "uicheck" in page, f"the runs page does not show the campaign (title {title!r})"
