"""The result file every benchmark script writes (JSON, under benchmarks/results/): its numbers with the versions,
machine and time they were measured on, so that later runs can be compared.

The scripts import it as a sibling (`sys.path` takes this directory however a script is loaded); the package
does not need it."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ldpbench import __version__
from ldpbench.atomic import write_json


def write_result_file(benchmark: str, results: list[dict[str, Any]], out: str | Path,
                           **settings: Any) -> None:
    """Write results with the versions, machine and time they were measured on; print where."""
    record = {
        "benchmark": benchmark, "ldpbench_version": __version__, "torch_version": torch.__version__,
        "python": sys.version.split()[0], "machine": platform.machine(),
        "processor": platform.processor(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **settings, "results": results,
    }
    write_json(Path(out), record)
    print(f"written to {out}")
