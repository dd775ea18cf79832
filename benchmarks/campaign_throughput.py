"""Campaign throughput: whole campaigns end to end, with the warm worker beside every job started as
a fresh process (`worker.enabled: false`), and how the wall time grows with the number of runs.

    python benchmarks/campaign_throughput.py [--default] [--campaigns FILE ...] [--grids 1 2 4] [--seeds 1] [--cores 2]
        [--reference-grids 1] [--workdir DIR] [--out benchmarks/results/campaign_throughput.json]

--default: the default campaign (config/config.yaml: tuning, audits, report, MLflow) from scratch,
its datasets prepared inside the clock, as a user runs it: syn-L alone (no mirror) with the worker and
with fresh processes, then with UCI Adult from the mirror (where ../shared/datasets holds it). No warm
seed of an earlier campaign is left to fork the worker (each is stopped first), so the worker imports
everything inside the clock; the installation's compiled kernels are cached, as after a first campaign.
--campaigns FILE...: each campaign file (e.g. a paper campaign, config/campaigns/fedsel-table3.yaml)
from scratch as a user runs it, `snakemake --cores N --configfile FILE` over config/config.yaml, in a
fresh directory: its datasets prepared and its features extracted inside the clock, from the mirror
the file names (relative to the repository, as the user's command reads it); its results, data and
MLflow store in the directory, and no seed lingering after it. The wall time is the campaign's
(performance goal 8 compares it with the issue's recorded times).
--grids K...: a FedSel-shaped grid (syn-L LR/SVM, NP + PM, HM, Duchi, PS-PM at 6 ε, 5 folds per seed,
FedSGD, one epoch) over K (dataset, model) pairs: 125 runs per pair and seed, tracking and audit
off, the datasets prepared before the clock starts; measured with the worker, and with fresh
processes at the --reference-grids sizes. Printed: runs, wall seconds, runs per second, seconds per
run, and the share of the cores' time the runs spent training. Not a test: nothing here asserts a
speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # its sibling result_file.py, however this file is loaded
from result_file import write_result_file  # noqa: E402

DEFAULT_SYN_L = "default campaign, syn-L"
DEFAULT_WITH_ADULT = "default campaign, syn-L and Adult"
GRID_PAIRS = [(dataset, model) for dataset in ("syn-L-0.01-0.9", "syn-L-0.1-0.9", "syn-L-0.01-0.6",
                                               "syn-L-0.1-0.6") for model in ("lr", "svm")]
GRID_MECHANISMS = [{"name": "np"}, {"name": "pm"}, {"name": "hm"}, {"name": "duchi"},
                   {"name": "ps-pm", "params": {"k_fraction": 0.1, "mu": 0.1, "eta": 0.5}}]


def grid(root: Path, pairs: int, seeds: int, worker: bool) -> dict:
    datasets = sorted({dataset for dataset, _ in GRID_PAIRS[:pairs]})
    models = sorted({model for _, model in GRID_PAIRS[:pairs]})
    assert len(datasets) * len(models) == pairs, f"--grids takes 1, 2, 4 or 8 (got {pairs})"
    return {
        "campaign": "grid",
        "results_dir": str(root / "results"),
        "data": {"raw_dir": str(root / "raw"), "prepared_dir": str(REPO / "benchmarks" / "results" / "prepared"),
                 "mirror": None},
        "datasets": [{"name": name} for name in datasets],
        "models": models,
        "mechanisms": GRID_MECHANISMS,
        "epsilons": [0.5, 1, 2, 4, 8, 16],
        "seeds": list(range(seeds)),
        "split": {"folds": 5},
        "training": {"epochs": 1, "batch_fraction": 0.01, "learning_rate": 0.1, "l2": 1e-4, "eval_every": 10},
        "tracking": {"enabled": False},
        "audit": {"enabled": False},
        # From scratch: no warm seed of an earlier measurement, and none left for the next one.
        "worker": {"enabled": worker, "linger_seconds": 0},
    }


def relocated(config: dict, directory: Path) -> dict:
    """`config`, a campaign file as read, with everything it writes (its data, features, results and
    MLflow store) in `directory`, and its mirror, its own or config/config.yaml's, resolved from the
    repository, where the user's command reads it."""
    data = {**yaml.safe_load((REPO / "config" / "config.yaml").read_text())["data"], **config.get("data", {})}
    mirror = data.get("mirror")
    config["data"] = {**data, "raw_dir": str(directory / "raw"), "prepared_dir": str(directory / "prepared"),
                      "mirror": None if mirror is None else str((REPO / mirror).resolve())}
    config["features"] = {**config.get("features", {}), "dir": str(directory / "features")}
    config["results_dir"] = str(directory / "results")
    config["tracking"] = {**config.get("tracking", {}), "uri": f"sqlite:///{directory / 'mlflow.db'}"}
    return config


def from_scratch(campaign_file: Path, directory: Path) -> dict:
    """Campaign file `campaign_file` as the workflow reads it over config/config.yaml, relocated to
    `directory` (emptied), and no seed lingering after it."""
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(REPO / "config", directory / "config")  # the Snakefile's `configfile:`
    config = relocated(yaml.safe_load(campaign_file.read_text()), directory)
    config["worker"] = {**config.get("worker", {}), "linger_seconds": 0}
    return config


def snakemake(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(root), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True)


def stop_warm_seeds(wait_seconds: float = 30.0) -> None:
    """End every lingering seed of this user's campaigns (a campaign forked from one starts warm)."""
    from ldpbench.launch.fork_server import living_seeds, stop_seeds

    stop_seeds()
    deadline = time.monotonic() + wait_seconds
    while living_seeds():
        if time.monotonic() > deadline:
            sys.exit(f"seeds {living_seeds()} did not end within {wait_seconds:g} s of SIGTERM")
        time.sleep(0.1)


def measure(root: Path, config: dict | None, cores: int, targets: list[str] = ()) -> dict:
    """One campaign from an empty results directory; the datasets already prepared (grid) or not."""
    stop_warm_seeds()
    shutil.rmtree(root / "results", ignore_errors=True)
    shutil.rmtree(root / "logs", ignore_errors=True)
    shutil.rmtree(root / ".snakemake", ignore_errors=True)
    args = ["--cores", str(cores)]
    if config is not None:
        (root / "campaign.yaml").write_text(yaml.safe_dump(config))
        args += ["--configfile", str(root / "campaign.yaml")]
    started = time.perf_counter()
    result = snakemake(root, *args, *targets)
    wall = time.perf_counter() - started
    (root / "snakemake.out").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        sys.exit(f"snakemake failed (exit {result.returncode}); see {root / 'snakemake.out'}")
    campaign = (config or yaml.safe_load((REPO / "config" / "config.yaml").read_text()))["campaign"]
    results_dir = root / (config["results_dir"] if config else "results") / campaign
    runs = pd.read_parquet(results_dir / "tables" / "runs.parquet")
    trials = pd.read_parquet(results_dir / "tables" / "tuning.parquet") if (
        results_dir / "tables" / "tuning.parquet").exists() else None
    trained = float(runs["wall_seconds"].sum())
    count = len(runs) + (len(trials) if trials is not None else 0)
    return {"runs": count, "wall_seconds": round(wall, 1), "runs_per_second": round(count / wall, 2),
            "seconds_per_run": round(wall / count, 4),
            "training_share_of_core_time": round(trained / (wall * cores), 3) if trials is None else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--default", action="store_true", help="the default campaign, worker on and off")
    parser.add_argument("--campaigns", type=Path, nargs="*", default=[], help="campaign files, each from scratch")
    parser.add_argument("--grids", type=int, nargs="*", default=[1, 2, 4], help="(dataset, model) pairs")
    parser.add_argument("--seeds", type=int, default=1, help="seeds of the grid (x 5 folds)")
    parser.add_argument("--reference-grids", type=int, nargs="*", default=[1],
                        help="grid sizes also measured with every job a fresh process")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", type=Path, default=REPO / "benchmarks" / "results" / "campaign_throughput")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "campaign_throughput.json"))
    args = parser.parse_args()
    root = args.workdir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    results = []

    def record(workload: str, worker: bool, row: dict) -> None:
        row = {"workload": workload, "worker": worker, **row}
        results.append(row)
        print(json.dumps(row), flush=True)

    if args.default:
        mirror = (REPO / yaml.safe_load((REPO / "config" / "config.yaml").read_text())["data"]["mirror"]).resolve()
        variants = [(DEFAULT_SYN_L, None, True), (DEFAULT_SYN_L, None, False)]
        if (mirror / "adult").is_dir():
            variants.append((DEFAULT_WITH_ADULT, mirror, True))
        for workload, data_mirror, worker in variants:
            directory = root / "default"
            # The default campaign as a user runs it: its own config file, data prepared inside the clock.
            config = from_scratch(REPO / "config" / "config.yaml", directory)
            config["data"]["mirror"] = None if data_mirror is None else str(data_mirror)
            config["worker"]["enabled"] = worker
            record(workload, worker, measure(directory, config, args.cores))
    for campaign_file in args.campaigns:
        directory = root / f"campaign-{campaign_file.stem}"
        record(f"campaign {campaign_file.stem}", True,
               measure(directory, from_scratch(campaign_file.resolve(), directory), args.cores))
    for pairs in args.grids:
        for worker in (True, False) if pairs in args.reference_grids else (True,):
            directory = root / f"grid-{pairs}"
            directory.mkdir(parents=True, exist_ok=True)
            config = grid(directory, pairs, args.seeds, worker)
            # The datasets are prepared before the clock starts (once, shared by every size).
            (directory / "prepare.yaml").write_text(yaml.safe_dump(config))
            metas = [f"{config['data']['prepared_dir']}/{entry['name']}/meta.json" for entry in config["datasets"]]
            prepared = snakemake(directory, "--configfile", str(directory / "prepare.yaml"), "--cores",
                                 str(args.cores), *metas)
            if prepared.returncode != 0:
                sys.exit(f"preparing the grid's datasets failed:\n{prepared.stdout[-3000:]}{prepared.stderr[-3000:]}")
            record(f"FedSel grid, {pairs} (dataset, model) pairs x {args.seeds} seeds", worker,
                   measure(directory, config, args.cores))
    print(f"\n{'workload':58s} {'worker':>6s} {'runs':>6s} {'wall s':>8s} {'runs/s':>7s} {'s/run':>7s}")
    for row in results:
        print(f"{row['workload']:58s} {'on' if row['worker'] else 'off':>6s} {row['runs']:6d} "
              f"{row['wall_seconds']:8.1f} {row['runs_per_second']:7.2f} {row['seconds_per_run']:7.3f}")
    write_result_file("campaign_throughput", results, args.out, cores=args.cores, seeds=args.seeds)


if __name__ == "__main__":
    main()
