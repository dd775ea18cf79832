"""Live progress: a run streams its evaluated rounds while it trains, in batches from a background
thread; a server that is away, refuses or comes back late never fails or holds up the run."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pandas as pd
import pytest

from ldpbench.fl.hooks import ForwardRounds
from ldpbench.results.live import LIVE_ENV, LiveRun, LiveTarget, target_from_environment
from ldpbench.runner import execute

from plans import run_plan

TARGET = LiveTarget("http://127.0.0.1:9", "ldpbench/c", "c")
TRAINING = {"epochs": 1, "batch_fraction": 0.05, "learning_rate": 0.1, "eval_every": 5}


class FakeServer:
    """Stands in for MlflowClient: records what reaches it; `down` makes every call fail."""

    def __init__(self, down: bool = False):
        self.down = down
        self.batches: list[list] = []
        self.runs: list[dict] = []
        self.terminated: list[str] = []
        self.calls = 0
        self.refuse_next = 0  # calls refused once, as by a busy store, before the server answers again
        self.experiment_after = 0  # lookups that find no experiment (the workflow is creating it)
        self.lock = threading.Lock()

    def _call(self) -> None:
        with self.lock:
            self.calls += 1
            refused, self.refuse_next = self.refuse_next > 0, max(0, self.refuse_next - 1)
        if self.down:
            raise ConnectionError("Connection refused")
        if refused:
            raise RuntimeError("INTERNAL_ERROR: database is locked")

    def get_experiment_by_name(self, name):
        self._call()
        with self.lock:
            self.experiment_after -= 1
            if self.experiment_after >= 0:
                return None
        return type("Experiment", (), {"experiment_id": "7"})()

    def create_run(self, experiment_id, run_name, tags):
        self._call()
        self.runs.append({"name": run_name, "tags": tags})
        return type("Run", (), {"info": type("Info", (), {"run_id": "r1"})()})()

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self._call()
        if metrics:
            self.batches.append(list(metrics))

    def set_terminated(self, run_id, status):
        self._call()
        self.terminated.append(status)


def live_run(server: FakeServer, **kwargs) -> LiveRun:
    return LiveRun(TARGET, "abc", "PM ε=2 seed 0", {"seed": "0"}, client_factory=lambda uri: server, **kwargs)


def wait_for_calls(server: FakeServer, calls: int) -> None:
    deadline = time.monotonic() + 30
    while server.calls < calls:
        assert time.monotonic() < deadline, f"the sender made {server.calls} calls in 30 s"
        time.sleep(0.005)


def sent_points(server: FakeServer) -> list[tuple[str, float, int]]:
    return [(m.key, m.value, m.step) for batch in server.batches for m in batch]


def test_rounds_go_out_in_batches_and_the_run_is_ended_with_its_status():
    server = FakeServer()
    live = live_run(server, flush_seconds=60)
    wait_for_calls(server, 3)  # the live run exists before any round: experiment, run, params
    for step in range(0, 2000, 1):
        live.add(step, {"test_accuracy": step / 2000})
    live.close("FINISHED")
    assert sent_points(server) == [("test_accuracy", step / 2000, step) for step in range(2000)]
    assert [len(batch) for batch in server.batches] == [900, 900, 200]  # MLflow takes ≤ 1000 a batch
    assert server.terminated == ["FINISHED"] and live.sent == 2000
    [run] = server.runs
    assert run["name"] == "PM ε=2 seed 0 (live)"
    assert run["tags"]["ldpbench.level"] == "live" and run["tags"]["run_key"] == "live:abc"


def test_a_server_that_is_away_is_retried_and_gets_everything_once_it_answers(caplog):
    server = FakeServer(down=True)
    live = live_run(server, flush_seconds=0.01)
    with caplog.at_level(logging.INFO, logger="ldpbench"):
        live.add(1, {"test_accuracy": 0.5})
        wait_for_calls(server, 3)  # failed attempts while the run goes on
        live.add(2, {"test_accuracy": 0.6})
        wait_for_calls(server, 6)
        server.down = False
        live.add(3, {"test_accuracy": 0.7})
        live.close()
    assert sent_points(server) == [("test_accuracy", 0.5, 1), ("test_accuracy", 0.6, 2), ("test_accuracy", 0.7, 3)]
    assert server.terminated == ["FINISHED"]
    away = [r.message for r in caplog.records if "failed" in r.message]
    assert len(away) == 1 and "Connection refused" in away[0]  # said once, not at every retry
    assert any("answers again" in r.message for r in caplog.records)


def test_the_live_run_is_created_at_once_while_the_run_trains_not_at_its_end():
    # Creating it (and importing MLflow) takes seconds on a busy machine: left to the end, it ran
    # past close_seconds and a finished run had no live run on the server.
    server = FakeServer()
    live = live_run(server, flush_seconds=600)
    wait_for_calls(server, 3)
    assert [run["name"] for run in server.runs] == ["PM ε=2 seed 0 (live)"] and server.terminated == []
    live.add(1, {"test_accuracy": 0.5})
    live.close()
    assert sent_points(server) == [("test_accuracy", 0.5, 1)] and server.terminated == ["FINISHED"]


def test_close_waits_for_mlflows_import_and_bounds_only_the_wait_for_the_server():
    # On a loaded machine importing MLflow took 9 s, past close_seconds: short runs had no live run.
    server = FakeServer()

    def slow_import(uri):
        time.sleep(1.0)
        return server

    live = LiveRun(TARGET, "abc", "PM ε=2 seed 0", {"seed": "0"}, client_factory=slow_import,
                   flush_seconds=600, close_seconds=0.2)
    live.add(1, {"test_accuracy": 0.5})
    live.close()
    assert sent_points(server) == [("test_accuracy", 0.5, 1)] and server.terminated == ["FINISHED"]


def test_a_refusal_at_the_end_is_retried_when_the_server_answered_this_run_before():
    server = FakeServer()
    live = live_run(server, flush_seconds=600, close_seconds=20)
    wait_for_calls(server, 3)
    live.add(1, {"test_accuracy": 0.5})
    server.refuse_next = 2  # the last batch refused twice (the store busy), then accepted
    live.close()
    assert sent_points(server) == [("test_accuracy", 0.5, 1)] and server.terminated == ["FINISHED"]


def test_runs_that_start_before_the_workflow_made_the_experiment_stream_once_it_exists():
    # The cells do not wait for the tracking_store step; a short run used to end before its experiment
    # existed and had no live run at all.
    server = FakeServer()
    server.experiment_after = 3
    live = live_run(server, flush_seconds=600, close_seconds=20)
    live.add(1, {"test_accuracy": 0.5})
    wait_for_calls(server, 2)
    live.close()
    assert [run["name"] for run in server.runs] == ["PM ε=2 seed 0 (live)"]
    assert sent_points(server) == [("test_accuracy", 0.5, 1)] and server.terminated == ["FINISHED"]


def test_a_server_that_never_answered_gets_one_last_attempt_not_retries():
    server = FakeServer(down=True)
    live = live_run(server, flush_seconds=600, close_seconds=20)
    wait_for_calls(server, 1)  # the first attempt, at once
    live.add(1, {"test_accuracy": 0.5})
    live.close()
    assert server.calls == 2 and server.batches == []  # every run's end is not held up by a dead server


def test_close_waits_a_bounded_time_when_the_server_never_answers(caplog):
    server = FakeServer(down=True)
    live = live_run(server, flush_seconds=0.01, close_seconds=0.5)
    live.add(1, {"test_accuracy": 0.5})
    with caplog.at_level(logging.WARNING, logger="ldpbench"):
        live.close()
    assert server.batches == [] and any("1 live metric values not sent" in r.message for r in caplog.records)


def test_the_hook_sends_round_zero_and_every_evaluated_round_without_non_finite_values():
    server = FakeServer()
    live = live_run(server, flush_seconds=60)
    hook = ForwardRounds(live.add)
    state = type("State", (), {"curve": [{"round": 0, "test_accuracy": 0.1, "train_loss": 2.0}], "metrics": None,
                               "round": 0})()
    hook.on_start(state)
    state.round, state.metrics = 1, None  # not evaluated: nothing sent
    hook.on_round_end(state)
    state.round, state.metrics = 5, {"test_accuracy": 0.4, "train_loss": float("inf"), "test_loss": float("nan")}
    hook.on_round_end(state)
    live.close()
    assert sorted(sent_points(server)) == [("test_accuracy", 0.1, 0), ("test_accuracy", 0.4, 5),
                                           ("train_loss", 2.0, 0)]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the probe is closed


def test_a_run_streaming_to_an_unreachable_server_finishes_with_the_same_numbers(syn_s, tmp_path, caplog):
    """The real MLflow client against a port nobody listens on: the run neither fails nor changes."""
    plan = run_plan("syn-S-0.1-0.9", "lr", "pm", {}, 2.0, 0, 0, 0, 0.2, TRAINING)
    quiet = execute(plan, syn_s, tmp_path / "quiet")
    unreachable = LiveTarget(f"http://127.0.0.1:{_closed_port()}", "ldpbench/c", "c")
    with caplog.at_level(logging.WARNING, logger="ldpbench"):
        streamed = execute(plan, syn_s, tmp_path / "streamed", live=unreachable)
    timing = {"train_seconds", "wall_seconds", "started_at", "finished_at"}
    assert {k: v for k, v in streamed.items() if k not in timing} == {k: v for k, v in quiet.items() if k not in timing}
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "quiet" / "curve.parquet"),
                                  pd.read_parquet(tmp_path / "streamed" / "curve.parquet"))
    assert any("live progress to" in r.message and "failed" in r.message for r in caplog.records)


def test_the_workflow_hands_its_target_through_the_environment(monkeypatch, caplog):
    from ldpbench.results.live import live_environment

    monkeypatch.setenv(LIVE_ENV, live_environment("http://h:5000", "ldpbench/c", "c"))
    assert target_from_environment() == LiveTarget("http://h:5000", "ldpbench/c", "c")
    monkeypatch.setenv(LIVE_ENV, json.dumps({"uri": "sqlite:///x.db", "experiment": "e", "campaign": "c"}))
    with caplog.at_level(logging.WARNING, logger="ldpbench"):
        assert target_from_environment() is None  # a SQLite store is no server: ignored, said
    assert any(LIVE_ENV in r.message for r in caplog.records)
    with pytest.raises(ValueError, match="tracking server"):
        LiveTarget("sqlite:///x.db", "e", "c")


def test_at_most_max_pending_values_wait_for_an_absent_server_the_oldest_dropped_first(caplog):
    server = FakeServer(down=True)
    live = live_run(server, flush_seconds=60, close_seconds=0.5, max_pending=3)
    for step in range(5):
        live.add(step, {"test_accuracy": step / 10})
    assert [point[3] for point in live.pending] == [2, 3, 4] and live.dropped == 2
    with caplog.at_level(logging.WARNING, logger="ldpbench"):
        live.close()
    assert any("2 live metric values dropped" in r.message for r in caplog.records)
