"""Where a campaign's run-cell jobs spend their time: the rounds, and what surrounds them.

    python benchmarks/run_profile.py config/campaigns/bitrand-verdicts.yaml [--cells 3] [--rounds 10]
        [--workdir DIR] [--cores 2] [--out benchmarks/results/run_profile.json]

Performance goal 2 asks that a paper campaign's runs spend at most 15 % of their time outside the
rounds. This takes the campaign file as it is, but with its first seed alone, no tuning (every cell
trains the campaign's base setting: the cost of a run does not depend on its learning rate), no
audit and no tracking; prepares its data (and features) and writes its cell plans with Snakemake
(its data and features by file, then `--until plan`), then trains up to --cells of its cells, one per mechanism
as far as they go, as their run-cell jobs would, in this process, the warm worker's preload steps
done first (warm_as_the_worker). Each cell's wall time is split by timers around ldpbench's own functions:

* rounds: the step strategies (every client's update, the mechanism, the server's estimate) and the
  server's step;
* evaluation: the evaluation hook (the test and training metrics of the evaluated rounds);
* checkpoints: the checkpointing hook;
* preparing: building each run (its split, partition, network, mechanism and trainer) from the plan;
* the rest: reading the plan and dataset, writing the run files and marker, logging.

Each run-cell job of a campaign is forked from the warm worker, which holds the campaign's prepared
datasets in memory: the profile holds them too (data.prepared.warm), before the clock.

With --rounds R, each run trains at most R rounds (its plan's rounds capped), and the share outside
the rounds is also given at the plan's own rounds: the rounds scaled by planned / trained rounds, the
evaluation by the evaluations the planned rounds make / those made (round 0, every `eval_every`, the
last), preparing and the rest kept. Without --rounds "at plan" is the share measured: a run that stops
early (training.stop) stops early in the campaign too. Results are printed and written as JSON; not a
test: nothing here asserts a speed. The jobs outside run-cell (preparation, feature extraction,
aggregation, report, tracking, audits) are not measured here: benchmarks/campaign_profile.py
profiles whole campaigns, every job among them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import yaml

from ldpbench.layout import features_meta, prepared_meta

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
from campaign_throughput import relocated, snakemake  # noqa: E402
from performance_goals import PROFILE_TARGET  # noqa: E402
from result_file import write_result_file  # noqa: E402

PARTS = ("rounds", "evaluation", "checkpoints", "preparing")


class Timers:
    """Seconds spent in each part, counting a part's outermost call only (its nested calls are in it)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._depth: dict[str, int] = defaultdict(int)
        self._wrapped: list[tuple[object, str, object]] = []

    def wrap(self, owner, name: str, part: str) -> None:
        function = getattr(owner, name)
        self._wrapped.append((owner, name, function))

        @functools.wraps(function)
        def timed(*args, **kwargs):
            self._depth[part] += 1
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self._depth[part] -= 1
                if not self._depth[part]:
                    self.seconds[part] += time.perf_counter() - started

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        taken, self.seconds = dict(self.seconds), defaultdict(float)
        return taken

    def unwrap(self) -> None:
        """Put back every function `wrap` replaced."""
        while self._wrapped:
            owner, name, function = self._wrapped.pop()
            setattr(owner, name, function)


@contextlib.contextmanager
def instrument() -> Iterator[Timers]:
    """Timers around the functions each part runs in (see the module docstring), while in the block."""
    from ldpbench import runner
    from ldpbench.fl import algorithms, checkpoint, hooks, strategies

    timers = Timers()
    for strategy in strategies.STEP_STRATEGIES.values():
        timers.wrap(strategy, "steps", "rounds")
    timers.wrap(algorithms.Algorithm, "server_step", "rounds")
    for name in ("on_start", "on_round_end"):
        timers.wrap(hooks.Evaluation, name, "evaluation")
    for name in ("on_start", "on_round_end", "on_end"):
        timers.wrap(checkpoint.Checkpointing, name, "checkpoints")
    timers.wrap(runner, "prepare", "preparing")
    try:
        yield timers
    finally:
        timers.unwrap()


def profiled_campaign(campaign_file: Path, workdir: Path) -> dict:
    """The campaign file with one seed, no tuning, audit or tracking, its outputs under `workdir`."""
    config = yaml.safe_load(campaign_file.read_text())
    config.pop("tuning", None)
    for mechanism in config.get("mechanisms", []):
        if isinstance(mechanism, dict):
            mechanism.pop("tuning", None)
    config.pop("scorecard", None)
    config.update(seeds=config.get("seeds", [0])[:1], tracking={"enabled": False}, audit={"enabled": False})
    return relocated(config, workdir)


def plans(config: dict, workdir: Path, cores: int) -> list[Path]:
    """Prepare the data and write every cell's plan with Snakemake; the plan files.

    The data (and features) are asked for by file, the plans by rule: with `--until plan prepare_dataset
    features`, Snakemake 9 left the features job unscheduled once the data were prepared ("BUG: Out of
    jobs ready to be started")."""
    (workdir / "campaign.yaml").write_text(yaml.safe_dump(config))
    data = [str(prepared_meta_file(config, entry["name"])) for entry in config["datasets"]]
    for targets in (data, ["--until", "plan"]):
        done = snakemake(workdir, "--configfile", str(workdir / "campaign.yaml"), "--cores", str(cores), *targets)
        if done.returncode != 0:
            sys.exit(f"preparing the campaign failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return sorted((workdir / "results" / config["campaign"] / "plans").glob("*.json"))


def chosen(plan_files: list[Path], cells: int) -> list[dict]:
    """Up to `cells` plans, one per mechanism first (in the campaign's order of labels), then the rest."""
    loaded = [json.loads(path.read_text()) for path in plan_files]
    firsts, rest, seen = [], [], set()
    for plan in loaded:
        (rest if plan["mechanism"] in seen else firsts).append(plan)
        seen.add(plan["mechanism"])
    return (firsts + rest)[:cells]


def capped(plan: dict, rounds: int | None) -> dict:
    """The plan with each run's rounds capped at `rounds` (None: as planned)."""
    if rounds is not None:
        for run in plan["runs"]:
            training = run["plan"]["training"]
            training["rounds"] = rounds
            if training.get("stop") and training["stop"].get("max_rounds"):
                training["stop"]["max_rounds"] = min(rounds, training["stop"]["max_rounds"])
    return plan


def planned(original: dict, summaries) -> tuple[int, int]:
    """The rounds the cell's runs plan as the campaign has them (their clients known from the runs), and
    the evaluations those rounds make: round 0, every `eval_every` and the last of each run."""
    from ldpbench.plan import RunPlan

    # The capped runs have ids of their own: a run is found by its seed and fold.
    clients = {(int(seed), int(fold)): int(count)
               for seed, fold, count in zip(summaries["seed"], summaries["fold"], summaries["clients"])}
    rounds = evaluations = 0
    for plan in (RunPlan.from_dict(run["plan"]) for run in original["runs"]):
        total, every = plan.training.total_rounds(clients[plan.seed, plan.fold]), plan.training.eval_every
        rounds += total
        evaluations += 1 + total // every + (total % every != 0)
    return rounds, evaluations


def warm_as_the_worker() -> None:
    """Run the warm worker's preload steps in this process, before the clock, tracking's left out: its
    imports, and numba's kernels loaded with every later draw compiled (rng.speed.every_draw). A cell
    here then starts as a run-cell job forked from the worker does, except that each cell after the
    first also finds what the cells before it left (a forked job does not)."""
    from ldpbench.launch.fork_server import PRELOAD, TRACKING_PRELOAD

    for step in PRELOAD:
        if step in TRACKING_PRELOAD:
            continue
        module, _, function = step.partition(":")
        imported = importlib.import_module(module)
        if function:
            getattr(imported, function)()


def hold_dataset(prepared: Path) -> None:
    """Hold a dataset's prepared copy in memory, as the warm worker holds it for each run-cell job it
    forks (a job takes its copy: it is held again before the next cell)."""
    from ldpbench.data.prepared import warm

    if not warm(prepared):
        sys.exit(f"{prepared}: not held in memory (missing, damaged or over the limit)")


def profile_cell(original: dict, rounds: int | None, workdir: Path, prepared: Path, timers: Timers) -> dict:
    import pandas as pd

    from ldpbench import cli

    plan = capped(json.loads(json.dumps(original)), rounds)
    hold_dataset(prepared)
    cell_file = workdir / "profiled" / f"{plan['cell_id']}.json"
    cell_file.parent.mkdir(parents=True, exist_ok=True)
    cell_file.write_text(json.dumps(plan))
    runs_root, checkpoints = workdir / "profiled" / "runs", workdir / "profiled" / "checkpoints"
    for directory in (runs_root, checkpoints):  # nothing of an earlier cell is found again
        shutil.rmtree(directory, ignore_errors=True)
    timers.take()
    started = time.perf_counter()
    status = cli.main(["run-cell", "--cell", str(cell_file), "--prepared", str(prepared), "--runs-root", str(runs_root),
                       "--marker", str(cell_file.with_suffix(".done.json")), "--checkpoint-dir", str(checkpoints),
                       "--label", plan["label"]])
    wall = time.perf_counter() - started
    if status:
        sys.exit(f"run-cell of {cell_file} failed (exit {status})")
    parts = {part: timers.seconds.get(part, 0.0) for part in PARTS}
    parts["the rest"] = max(0.0, wall - sum(parts.values()))
    summaries = pd.concat(pd.read_parquet(path) for path in runs_root.glob("summaries/**/*.parquet"))
    evaluated = sum(len(pd.read_parquet(path)) for path in runs_root.glob("curves/**/*.parquet"))
    trained = int(summaries["rounds"].sum())
    planned_rounds, planned_evaluations = planned(original, summaries)
    scales = ({"rounds": planned_rounds / max(1, trained), "evaluation": planned_evaluations / max(1, evaluated),
               "checkpoints": planned_rounds / max(1, trained)} if rounds is not None else {})
    at_plan = {part: seconds * scales.get(part, 1.0) for part, seconds in parts.items()}
    return {"cell_id": plan["cell_id"], "dataset": plan["dataset"], "label": plan["label"],
            "mechanism": plan["mechanism"], "runs": len(plan["runs"]), "rounds_trained": trained,
            "rounds_planned": planned_rounds, "evaluations": evaluated, "evaluations_planned": planned_evaluations,
            "wall_seconds": wall, "seconds": parts,
            "share_outside_rounds": 1 - parts["rounds"] / wall,
            "share_outside_rounds_at_planned_rounds": 1 - at_plan["rounds"] / sum(at_plan.values())}


def prepared_meta_file(config: dict, dataset: str) -> Path:
    """The meta.json of what the run-cell job of `dataset` reads: its features where it has some."""
    entry = next(entry for entry in config["datasets"] if entry["name"] == dataset)
    if entry.get("features"):
        return features_meta(config["features"]["dir"], dataset, entry["features"])
    return prepared_meta(config["data"]["prepared_dir"], dataset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", type=Path, help="a campaign file, e.g. config/campaigns/bitrand-verdicts.yaml")
    parser.add_argument("--cells", type=int, default=3, help="cells profiled (one per mechanism first)")
    parser.add_argument("--rounds", type=int, default=None, help="cap each run's rounds (default: as planned)")
    parser.add_argument("--workdir", type=Path, default=None, help="default: benchmarks/results/run_profile/<name>")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="for preparing the data")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/run_profile_<name>.json")
    args = parser.parse_args(argv)
    name = args.campaign.stem
    workdir = (args.workdir or REPO / "benchmarks" / "results" / "run_profile" / name).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config = profiled_campaign(args.campaign.resolve(), workdir)
    plan_files = plans(config, workdir, args.cores)
    warm_as_the_worker()

    with instrument() as timers:
        results = []
        print(f"{'cell':16s} {'label':30s} {'runs':>4s} {'rounds':>7s} {'wall s':>8s} "
              + " ".join(f"{part:>11s}" for part in (*PARTS, "the rest")) + f" {'outside':>8s} {'at plan':>8s}")
        for plan in chosen(plan_files, args.cells):
            row = profile_cell(plan, args.rounds, workdir, prepared_meta_file(config, plan["dataset"]).parent,
                              timers)
            results.append(row)
            shares = row["share_outside_rounds"], row["share_outside_rounds_at_planned_rounds"]
            print(f"{row['cell_id']:16s} {row['label'][:30]:30s} {row['runs']:4d} {row['rounds_trained']:7d} "
                  f"{row['wall_seconds']:8.2f} " + " ".join(f"{row['seconds'][part]:11.2f}" for part in row["seconds"])
                  + f" {100 * shares[0]:7.1f}% {100 * shares[1]:7.1f}%", flush=True)
    write_result_file("run_profile", results, args.out or REPO / "benchmarks" / "results" / f"run_profile_{name}.json",
                      campaign=str(args.campaign), rounds_cap=args.rounds, share_target=PROFILE_TARGET)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
