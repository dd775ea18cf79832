"""`ldpbench status` polled while a real tuned campaign runs, held at fixed points by gates: from the
workflow's first second, before the first run, mid-tuning, mid-final, during the report, after, and right
after an edit of the campaign file. It must tell the truth at each: never an error, never the numbers of
an earlier file, "complete" only once the workflow has ended."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workflow_cli import environment, small_config, snakemake_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A sitecustomize hook, so that the production code carries no test hook: with $LDPBENCH_TEST_GATES set,
# the Nth ldpbench command of a kind (a file <gates>/<kind> holding N) waits once it has started (its job
# record written) until <gates>/<kind>.open exists, having made <gates>/<kind>.waiting. Kinds: the command,
# with the phase of a cell for run-cell (run-cell:trial, run-cell:final). The worker imports it too, so
# the commands it forks are held the same way.
GATE_HOOK = '''
import os
_gates = os.environ.get("LDPBENCH_TEST_GATES")
if _gates:
    import fcntl, json, time
    import ldpbench.cli as _cli
    _run = _cli._run

    def _held(args):
        kind = args.command
        if kind == "run-cell":
            with open(args.cell) as plan:
                kind += ":" + json.load(plan)["phase"]
        spec = os.path.join(_gates, kind)
        if os.path.exists(spec):
            with open(spec + ".count", "a+") as counter:
                fcntl.flock(counter, fcntl.LOCK_EX)
                counter.write("x")
                counter.flush()
                counter.seek(0)
                number = len(counter.read())
            if number == int(open(spec).read()):
                open(spec + ".waiting", "w").close()
                while not os.path.exists(spec + ".open"):
                    time.sleep(0.05)
        return _run(args)

    _cli._run = _held
'''


def tuned_campaign(seeds=(0, 1)) -> dict:
    config = small_config(name="watched", mechanisms=("np", "pm"), epsilons=(1, 4), seeds=seeds, rounds=10)
    config["tuning"] = {"space": {"learning_rate": [0.03, 0.3]}}
    return config


class Watched:
    """A workflow started in the background with gates, and `ldpbench status` of its campaign."""

    def __init__(self, root: Path, config: dict, gates: dict[str, int]):
        self.root, self.gates = root, root / f"gates-{time.monotonic_ns()}"
        self.gates.mkdir(parents=True)
        hook = root / "hook"
        hook.mkdir(exist_ok=True)
        (hook / "sitecustomize.py").write_text(GATE_HOOK)
        for kind, number in gates.items():
            (self.gates / kind).write_text(str(number))
        self.console = (root / "console.log").open("a")
        self.started = time.monotonic()
        self.process = subprocess.Popen(snakemake_command(root, config, "--cores", "1"),
                                        env=environment(hook, LDPBENCH_TEST_GATES=str(self.gates)),
                                        stdout=self.console, stderr=subprocess.STDOUT, start_new_session=True)

    def status(self) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ldpbench", "status", str(self.root / "results" / "watched")],
                              capture_output=True, text=True, env=environment())

    def at(self, kind: str, timeout: float = 300) -> str:
        """Wait until the gated command of `kind` is held; the status then."""
        deadline = time.monotonic() + timeout
        while not (self.gates / f"{kind}.waiting").exists():
            assert self.process.poll() is None, (self.root / "console.log").read_text()[-5000:]
            assert time.monotonic() < deadline, f"no {kind} held within {timeout} s"
            time.sleep(0.05)
        result = self.status()
        assert result.returncode == 0, result.stderr
        return result.stdout

    def release(self, kind: str) -> None:
        (self.gates / f"{kind}.open").touch()

    def end(self, timeout: float = 300) -> str:
        assert self.process.wait(timeout=timeout) == 0, (self.root / "console.log").read_text()[-5000:]
        self.console.close()
        result = self.status()
        assert result.returncode == 0, result.stderr
        return result.stdout


def counts(text: str, stage: str) -> tuple[int, ...]:
    found = re.search(rf"{stage}:\s+(\d+) of (\d+) done, (\d+) running, (\d+) pending", text)
    assert found, text
    return tuple(int(group) for group in found.groups())


def test_status_tells_the_truth_at_every_point_of_a_running_campaign(tmp_path):
    # Trials: NP at one ε, PM at two, two points at one tuning seed: 3 cells, 6 runs. Final: 3 cells of 2 seeds.
    watched = Watched(tmp_path, tuned_campaign(), {"prepare": 1, "run-cell:trial": 2, "run-cell:final": 2,
                                                   "report": 1})
    # From the workflow's first second: "starting" (not an error) while Snakemake builds the job graph,
    # then "running". (How long the first lasts depends on the machine: a poll may miss it.)
    states = []
    while not (watched.gates / "prepare.waiting").exists():
        result = watched.status()
        if result.returncode == 0:
            states.append(re.search(r"\): (\w+)", result.stdout).group(1))
        else:
            assert not states, f"an error after {states}: {result.stderr}"
            assert "no workflow has run it yet" in result.stderr
            # The record comes at the start of the parse, before the job graph; 15 s leaves room for a
            # slow machine's imports beside the other worker's campaign (5 s failed once on a machine
            # whose imports took 1.7 times as long as usual).
            assert time.monotonic() - watched.started < 15, "no workflow record 15 s after Snakemake started"
    assert states and set(states) <= {"starting", "running"}, states
    assert states == sorted(states, key=["starting", "running"].index), states

    before = watched.at("prepare")  # before the first run: the data is being prepared
    assert ": running" in before and counts(before, "tuning trials") == (0, 6, 0, 6)
    assert counts(before, "final runs") == (0, 6, 0, 6)
    assert "running:        prepare syn-S-0.1-0.9" in before and "jobs:           1 running on this machine" in before
    watched.release("prepare")

    # One trial cell done, the next one's job started (a configuration's final cell may run as soon as its
    # own trial cell is done: the job graph is fixed, no selection waits for every trial).
    mid_tuning = watched.at("run-cell:trial")
    assert counts(mid_tuning, "tuning trials")[:2] == (2, 6) and counts(mid_tuning, "final runs")[0] in (0, 2)
    assert "steps done:     prepare" in mid_tuning and "jobs:           1 running" in mid_tuning
    watched.release("run-cell:trial")

    mid_final = watched.at("run-cell:final")  # one final cell done, the next one's job started
    assert counts(mid_final, "tuning trials")[1] == 6 and counts(mid_final, "final runs")[:2] == (2, 6)
    assert "throughput:" in mid_final and "runs/min" in mid_final and "time left:      about" in mid_final
    watched.release("run-cell:final")

    reporting = watched.at("report")  # every run done, the tail running: not complete yet
    assert counts(reporting, "tuning trials") == (6, 6, 0, 0) and counts(reporting, "final runs") == (6, 6, 0, 0)
    assert ": running" in reporting and "complete" not in reporting
    assert "running:        report" in reporting and "every run is done; the steps after them are running" in reporting
    assert re.search(r"steps done:.*aggregate", reporting) and re.search(r"steps done:.*select", reporting)
    watched.release("report")

    after = watched.end()
    assert ": complete" in after and "complete:       the workflow ended successfully" in after
    assert re.search(r"steps done:.*track", after)
    # Snakemake's own progress never ran backwards: one job graph, its size known from the start.
    totals = set(re.findall(r"\d+ of (\d+) steps", (tmp_path / "console.log").read_text()))
    assert len(totals) == 1, totals

    # An edit of the file (a seed added): the next workflow's numbers, from its first record on.
    edited = Watched(tmp_path, tuned_campaign(seeds=(0, 1, 2)), {"run-cell:final": 1})
    first_final = edited.at("run-cell:final")
    assert ": running" in first_final and counts(first_final, "tuning trials") == (6, 6, 0, 0)
    # Nine final runs planned; those of seeds 0 and 1 are stored already (of the cells whose plan is written).
    done, planned, _, _ = counts(first_final, "final runs")
    assert planned == 9 and done in (2, 4, 6) and "complete" not in first_final
    edited.release("run-cell:final")
    assert ": complete" in edited.end() and counts(edited.status().stdout, "final runs") == (9, 9, 0, 0)
