"""The metric columns of a campaign's tables, keyed by what a run is (not by its run id).

Shared by the golden test and the script that records its expected values, one file per platform
(the CPU's vendor and torch's vector instruction set: its BLAS and vector kernels round differently):
    python tests/golden/metrics.py <campaign results dir> \
        > tests/golden/small_campaign.$(python tests/golden/metrics.py --platform).json
"""

from __future__ import annotations

import json
import math
import platform
import sys
from pathlib import Path

import pandas as pd

# What identifies a run across refactors (run ids may change when the plan's serialisation does).
RUN_KEY = ["dataset", "model", "label", "epsilon", "seed", "fold"]
RUN_METRICS = [
    "status", "test_accuracy", "test_auc", "test_loss", "train_loss", "rounds", "rounds_planned", "epochs",
    "clients", "records", "test_records", "dims", "classes", "epsilon_per_report", "epsilon_claimed_per_report",
    "epsilon_worst_case_per_report", "delta_claimed_per_report", "bits_per_report", "reports_per_client_max",
    "epsilon_claimed_client_max", "epsilon_worst_case_client_max", "uplink_bits_total",
]
CURVE_METRICS = ["round", "epoch", "test_accuracy", "test_auc", "test_loss", "train_loss"]


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _key(row) -> str:
    return "/".join(str(_plain(row[column])) for column in RUN_KEY)


def campaign_metrics(campaign_dir: str | Path) -> dict[str, dict]:
    """{run key: {metric: value, "curve": [[round, epoch, ...], ...]}} from tables/runs and curves."""
    tables = Path(campaign_dir) / "tables"
    runs = pd.read_parquet(tables / "runs.parquet")
    curves = pd.read_parquet(tables / "curves.parquet")
    result = {}
    for _, row in runs.iterrows():
        curve = curves[curves["run_id"] == row["run_id"]].sort_values("round")
        result[_key(row)] = {
            **{metric: _plain(row[metric]) for metric in RUN_METRICS},
            "curve": [[_plain(value) for value in values] for values in curve[CURVE_METRICS].itertuples(index=False)],
        }
    return dict(sorted(result.items()))


def platform_signature() -> str:
    """What decides the last bits of a campaign's numbers on this machine: the CPU's vendor (MKL takes
    other paths on other vendors) and the vector instruction set torch's kernels use, e.g.
    "GenuineIntel-AVX512"."""
    import torch

    vendor = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            vendor = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), vendor)
    except OSError:
        pass
    return f"{vendor}-{torch.backends.cpu.get_cpu_capability()}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--platform"]:
        print(platform_signature())
    else:
        json.dump(campaign_metrics(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
        print()
