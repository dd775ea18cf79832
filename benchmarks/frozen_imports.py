"""CPU time of a process that imports what the workflow's parse imports and then exits, with those
objects left to the garbage collector and frozen (gc.freeze, as workflow/rules/common.smk does), in
fresh interpreters, alternately.

    python benchmarks/frozen_imports.py [--repeats 7] [--imports ldpbench.campaign]
        [--out benchmarks/results/frozen_imports.json]

The imports: ldpbench.campaign (pandas, numpy, jsonschema; torch no longer: ldpbench.deferred_import). At a
normal exit Python runs a full collection over every object still tracked; frozen ones are not scanned.
The reference: the same imports ended by os._exit (no teardown at all), and an interpreter importing
nothing. Each figure is the median of `repeats` processes' user + system CPU. Not a test: nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
from result_file import write_result_file  # noqa: E402


def variants(imports: str) -> dict[str, str]:
    """Each variant's code: the imports ended in three ways, and the interpreter alone."""
    imported = f"import {imports}\n"
    return {
        "imports, then a normal exit": imported,
        "imports, frozen, then a normal exit": imported + "import gc\ngc.freeze()\n",
        "imports, then os._exit (no teardown)": imported + "import os\nos._exit(0)\n",
        "an interpreter importing nothing": "pass\n",
    }


def process_cpu(code: str) -> float:
    """User + system CPU seconds of a fresh interpreter running `code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--imports", default="ldpbench.campaign", help="the modules imported, comma-separated")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "frozen_imports.json"))
    args = parser.parse_args(argv)
    codes = variants(args.imports)
    process_cpu(codes["imports, then a normal exit"])  # file caches warm before the clock
    samples: dict[str, list[float]] = {name: [] for name in codes}
    for _ in range(args.repeats):
        for name, code in codes.items():
            samples[name].append(process_cpu(code))
    results = []
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:40s} {median:5.2f} s of CPU (median of {args.repeats})")
        results.append({"variant": name, "cpu_seconds_median": median, "cpu_seconds": values})
    write_result_file("frozen_imports", results, args.out, repeats=args.repeats, imports=args.imports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
