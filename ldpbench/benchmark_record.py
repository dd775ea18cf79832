"""The JSON record every benchmark script writes, so later runs can be compared."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ldpbench import __version__
from ldpbench.atomic import write_json


def write_benchmark_record(benchmark: str, results: list[dict[str, Any]], out: str | Path,
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
