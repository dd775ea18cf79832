"""Scheduler jobs and wall time of a 500-run campaign: local vs SLURM, with and without grouping,
or as array jobs.

    python benchmarks/cluster_grouping.py --mode local|slurm-grouped|slurm-ungrouped|slurm-array
        [--workdir DIR] [--group-size 25] [--cores 2] [--seeds 5]

The campaign: syn-S-0.1-0.9, LR and SVM, NP, NP-RS and 8 private mechanisms at 6 ε, 5 seeds =
100 cells x 5 runs = 500 runs (--seeds 1: 100 runs, the same 100 cells). slurm-array submits the
cells ungrouped as SLURM array jobs (`--slurm-array-jobs run_cell`). The dataset is prepared
before the clock starts, tracking and the privacy audit are off.
The SLURM modes need a running cluster (for a one-node test cluster on localhost, see
tests/slurm_cluster.py) and use profiles/slurm plus the settings a cluster without
accounting needs (squeue for status, short status intervals). Scheduler jobs are counted from
Snakemake's "submitted with SLURM jobid" lines. Results are printed and appended as JSON to
benchmarks/results/cluster_grouping.json. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CI_SETTINGS = {
    "slurm-status-command": "squeue",
    "slurm-no-account": True,
    "slurm-init-seconds-before-status-checks": 1,
    "seconds-between-status-checks": 1,
}


def campaign(root: Path, seeds: int = 5) -> dict:
    return {
        "campaign": "grid500",
        "results_dir": str(root / "results"),
        "data": {"raw_dir": str(root / "raw"), "prepared_dir": str(root / "prepared"), "mirror": None},
        "datasets": [{"name": "syn-S-0.1-0.9"}],
        "models": ["lr", "svm"],
        "mechanisms": [{"name": n} for n in ("np", "np-rs", "laplace", "duchi", "pm", "hm",
                                               "three-outputs", "exp-pm", "pe-pm", "ps-pm")],
        "epsilons": [0.5, 1, 2, 4, 8, 16],
        "seeds": list(range(seeds)),
        "training": {"eval_every": 10},
        "tracking": {"enabled": False},
        "audit": {"enabled": False},  # what is measured is the scheduling of the cells
    }


def profile(root: Path, mode: str, group_size: int, cores: int) -> Path:
    settings = yaml.safe_load((REPO / "profiles" / "slurm" / "profile.yaml").read_text())
    settings.update(CI_SETTINGS, cores=cores)
    settings["slurm-logdir"] = str(root / "logs" / "slurm")  # relative: to where Snakemake starts
    if mode == "slurm-grouped":
        settings["group-components"] = {"runs": group_size}
    else:
        settings.pop("groups"), settings.pop("group-components")
    if mode == "slurm-array":
        settings["slurm-array-jobs"] = "run_cell"
    directory = root / "profile"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "profile.yaml").write_text(yaml.safe_dump(settings))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["local", "slurm-grouped", "slurm-ungrouped", "slurm-array"], required=True)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--group-size", type=int, default=25)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seeds", type=int, default=5, help="seeds per cell (100 cells)")
    args = parser.parse_args()
    root = (args.workdir or Path("benchmarks/results/cluster_grouping") / args.mode).resolve()
    root.mkdir(parents=True, exist_ok=True)
    config = root / "campaign.yaml"
    config.write_text(yaml.safe_dump(campaign(root, args.seeds)))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    base = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--configfile", str(config),
            "-d", str(root)]
    subprocess.run(base + ["--cores", "1", f"{root}/prepared/syn-S-0.1-0.9/meta.json"], env=env,
                   check=True, capture_output=True)
    command = base + (["--cores", str(args.cores)] if args.mode == "local" else
                      ["--workflow-profile", str(profile(root, args.mode, args.group_size, args.cores))])
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    (root / "snakemake.out").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        sys.exit(f"snakemake failed (exit {result.returncode}); see {root / 'snakemake.out'}")
    output = result.stdout + result.stderr
    submitted = re.findall(r"submitted with SLURM jobid (\d+)", output)
    arrays = re.findall(r"Submitted array job with Snakemake IDs ([\d,]+) and SLURM job ID (\d+)", output)
    run_jobs = len(re.findall(r"^rule run_cell:|^localrule run_cell:", output, flags=re.M))
    runs = len(json.loads((root / "results" / "grid500" / "manifest.json").read_text())["runs"])
    record = {"mode": args.mode, "runs": runs, "snakemake_run_jobs": run_jobs,
              "slurm_jobs": len(submitted) + sum(len(ids.split(",")) for ids, _ in arrays),
              "sbatch_calls": len(submitted) + len(arrays), "wall_seconds": round(wall, 1), "cores": args.cores,
              "group_size": args.group_size if args.mode == "slurm-grouped" else None,
              "command": " ".join(command)}
    print(json.dumps(record, indent=2))
    out = REPO / "benchmarks" / "results" / "cluster_grouping.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(history + [record], indent=2) + "\n")


if __name__ == "__main__":
    main()
