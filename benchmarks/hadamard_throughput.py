"""Randomised Walsh–Hadamard rotation (sqSGD §3.4): time per rotation for d = 2^10 … 2^20.

    python benchmarks/hadamard_throughput.py [--log2-dims 10 20] [--clients 1 10] [--threads 1]

For each d and cohort size, rotates a [clients, d] float32 batch with R = H·A/√d (fast transform,
O(d log d) per row) and reports the median time of the repetitions, clients·d / time, and the time
per butterfly (clients·d·log2 d / time). For d up to --dense-max the same rotation as a dense
matrix product is timed beside it, for scale. Results are printed and written as JSON to
benchmarks/results/hadamard_throughput.json. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from ldpbench.mechanisms.hadamard import hadamard_matrix, rotate, rotation_signs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
from result_file import write_result_file  # noqa: E402


def median_seconds(function, repetitions: int) -> float:
    function()  # warm-up (allocations, sign cache)
    times = []
    for _ in range(repetitions):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(log2_dims: int, clients: int, repetitions: int, dense_max: int) -> dict:
    d = 2**log2_dims
    x = torch.randn(clients, d, generator=torch.Generator().manual_seed(0))
    fast = median_seconds(lambda: rotate(x, seed=0), repetitions)
    row = {"log2_dims": log2_dims, "dims": d, "clients": clients, "median_seconds": fast,
           "values_per_second": clients * d / fast,
           "nanoseconds_per_butterfly": fast / (clients * d * max(log2_dims, 1)) * 1e9}
    if d <= dense_max:
        matrix = (hadamard_matrix(d, torch.float32) * rotation_signs(0, d, torch.float32)) / math.sqrt(d)
        row["dense_median_seconds"] = median_seconds(lambda: x @ matrix.T, repetitions)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2-dims", type=int, nargs=2, default=[10, 20], metavar=("LOW", "HIGH"))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--dense-max", type=int, default=2**12, help="largest d also timed as a dense product")
    parser.add_argument("--out", default="benchmarks/results/hadamard_throughput.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    results = []
    print(f"{'d':>9s} {'clients':>7s} {'median s':>11s} {'values/s':>11s} {'ns/butterfly':>12s} {'dense s':>10s}")
    for log2_dims in range(args.log2_dims[0], args.log2_dims[1] + 1):
        for clients in args.clients:
            row = measure(log2_dims, clients, args.repetitions, args.dense_max)
            results.append(row)
            dense = f"{row['dense_median_seconds']:10.5f}" if "dense_median_seconds" in row else f"{'-':>10s}"
            print(f"{row['dims']:9d} {clients:7d} {row['median_seconds']:11.6f} {row['values_per_second']:11.3e} "
                  f"{row['nanoseconds_per_butterfly']:12.3f} {dense}", flush=True)
    write_result_file("hadamard_throughput", results, args.out, threads=args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
