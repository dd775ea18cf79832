"""CPU and wall time of the workflow's start: `snakemake --dry-run` of the default campaign from scratch
(config/config.yaml, its syn-L part: UCI Adult is left out as where its files are not at hand), beside
the same dry run in a process that imports torch first, as the parse did while the registries'
modules imported it (before ldpbench.deferred_import); fresh interpreters, alternately.

    python benchmarks/workflow_parse.py [--repeats 5] [--out benchmarks/results/workflow_parse.json]

Every Snakemake a campaign starts pays this start: each run, each dry run, each SLURM job's Snakemake.
Each figure is the median of `repeats` processes (user + system CPU, and wall). Not a test: nothing
here asserts a speed.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
from result_file import write_result_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Snakemake as its command runs it; the variant's imports first.
SNAKEMAKE = ("import runpy, sys\n{imports}sys.argv = ['snakemake', *sys.argv[1:]]\n"
             "runpy.run_module('snakemake', run_name='__main__')\n")
VARIANTS = {
    "the workflow's dry run": "",
    "the same, torch imported first (the parse before)": "import torch\n",
}


def campaign_file(directory: Path) -> Path:
    """The default campaign file with its data directories in `directory` (nothing prepared, no mirror)."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["data"].update(raw_dir=str(directory / "raw"), prepared_dir=str(directory / "prepared"), mirror=None)
    path = directory / "campaign.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def dry_run(imports: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one dry run from scratch in a fresh directory."""
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        command = [sys.executable, "-c", SNAKEMAKE.format(imports=imports), "-s", str(REPO / "Snakefile"),
                   "-d", str(workdir), "--configfile", str(campaign_file(workdir)), "--dry-run", "--cores", "2"]
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "workflow_parse.json"))
    args = parser.parse_args(argv)
    dry_run("")  # file caches warm before the clock
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, imports in VARIANTS.items():
            samples[name].append(dry_run(imports))
    results = []
    for name, values in samples.items():
        cpu, wall = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        print(f"{name:52s} {cpu:5.2f} s of CPU, {wall:5.2f} s of wall (medians of {args.repeats})")
        results.append({"variant": name, "cpu_seconds_median": cpu, "wall_seconds_median": wall,
                        "cpu_seconds": [v[0] for v in values], "wall_seconds": [v[1] for v in values]})
    write_result_file("workflow_parse", results, args.out, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
