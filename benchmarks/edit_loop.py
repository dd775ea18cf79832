"""The edit loop's rerun: the default campaign (config/config.yaml, its syn-L part) run once, then edited
one seed at a time and run again; alternately, each rerun with the worker of the run before lingering
as its seed (`worker.linger_seconds`, the default) and with a fresh worker (`linger_seconds: 0`).

    python benchmarks/edit_loop.py [--edits 6] [--cores 2] [--workdir DIR] [--out benchmarks/results/edit_loop.json]

Each rerun trains the new seed's final cells (one per configuration) and writes the tables, the report
and MLflow again. Printed per variant: the median of its reruns' wall times, and of the machine's CPU
time over each rerun (every process, read from /proc/stat: a worker forked by a seed is not a child of
Snakemake, whose resource usage would leave it out). Run it on a quiet machine. Not a test: nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
from campaign_throughput import snakemake  # noqa: E402
from result_file import write_result_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {"warm seed": 300, "fresh worker": 0}  # worker.linger_seconds of the rerun


def campaign(directory: Path, seeds: int, linger: float) -> dict:
    """The default campaign with `seeds` seeds, its files in `directory` (syn-L: no mirror, no Adult)."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["data"].update(raw_dir=str(directory / "raw"), prepared_dir=str(directory / "prepared"), mirror=None)
    config["tracking"]["uri"] = f"sqlite:///{directory / 'mlflow.db'}"
    config.update(results_dir=str(directory / "results"), seeds=list(range(seeds)),
                  worker={"linger_seconds": linger})
    return config


def busy_cpu_seconds() -> float:
    """The machine's CPU time so far, every core and process (/proc/stat: all but idle and I/O wait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def run(directory: Path, config: dict, cores: int) -> tuple[float, float]:
    """(wall seconds, machine CPU seconds) of one `snakemake` of `config`."""
    (directory / "campaign.yaml").write_text(yaml.safe_dump(config))
    cpu, start = busy_cpu_seconds(), time.perf_counter()
    done = snakemake(directory, "--configfile", str(directory / "campaign.yaml"), "--cores", str(cores))
    wall, cpu = time.perf_counter() - start, busy_cpu_seconds() - cpu
    if done.returncode != 0:
        sys.exit(f"snakemake failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return wall, cpu


def worker_was_forked_by_a_seed(directory: Path) -> bool:
    log = directory / "logs" / "default" / "worker.log"
    return "(by the seed, process" in log.read_text().rsplit(" listening on ", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edits", type=int, default=6, help="reruns, alternately of each variant (even)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "edit_loop.json"))
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="edit-loop-", dir=args.workdir))
    seeds = 3
    try:
        # The first run, then one edit: a seed lingers from it for the first warm rerun.
        run(directory, campaign(directory, seeds, VARIANTS["warm seed"]), args.cores)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
        for edit in range(args.edits):
            name = list(VARIANTS)[edit % len(VARIANTS)]
            seeds += 1
            samples[name].append(run(directory, campaign(directory, seeds, VARIANTS[name]), args.cores))
            if (name == "warm seed") != worker_was_forked_by_a_seed(directory):
                sys.exit(f"the {name} rerun's worker was {'not ' if name == 'warm seed' else ''}forked by a seed")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    results = []
    for name, values in samples.items():
        wall, cpu = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        print(f"rerun after adding a seed, {name:13s} {wall:5.1f} s of wall, {cpu:5.1f} s of the machine's CPU "
              f"(medians of {len(values)})")
        results.append({"variant": name, "linger_seconds": VARIANTS[name], "wall_seconds_median": wall,
                        "cpu_seconds_median": cpu, "wall_seconds": [v[0] for v in values],
                        "cpu_seconds": [v[1] for v in values]})
    write_result_file("edit_loop", results, args.out, cores=args.cores, edits=args.edits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
