"""Mechanism throughput: privatised values per second for every registered mechanism.

    python benchmarks/mechanism_throughput.py [--clients 1000] [--dims 100 10000] [--threads 1] [--references-only]

For each mechanism (and the non-default variants in VARIANTS, e.g. the flat anonymizer that
perturbs every coordinate) and d, privatises a [clients, d] cohort of values in [-1, 1] (ε = 2, or
the mechanism's example budget where ε = 2 is not valid for it, e.g. sqSGD; fresh streams each
repetition) and reports the median time of the repetitions and clients·d / time. The first row,
`streams.rand`, is the keyed per-client uniform draw every mechanism builds on; its references are
torch.rand and numpy's default generator (float32), measured in the same run. The per-coordinate
perturbers (PM, HM and Duchi with `anonymizer: true`: every coordinate at ε) are also timed against
a plain numpy implementation of the same law (benchmarks/numpy_reference.py); the `ratio` column is
ldpbench's values/s over the reference's (performance goal 3 in benchmarks/performance_goals.py: at least 5 for
the perturbers).
Results are printed and written as JSON to benchmarks/results/mechanism_throughput.json so later
runs can be compared. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from ldpbench import mechanisms
from ldpbench.rng import ClientStreams

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, however this file is loaded
from numpy_reference import REFERENCES  # noqa: E402
from result_file import write_result_file  # noqa: E402

# Settings whose cost differs from the default's.
VARIANTS = [("pm", {"anonymizer": True}), ("hm", {"anonymizer": True}), ("ldp-fl", {"anonymizer": True})]


def median_seconds(work, repetitions: int) -> float:
    """Median wall time of work(repetition) over the repetitions, after one warm-up call."""
    work("warm-up")
    times = []
    for repetition in range(repetitions):
        started = time.perf_counter()
        work(repetition)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _row(name: str, params: dict, privatises: str, epsilon, clients: int, dims: int, median: float,
         reference: str | None = None, reference_median: float | None = None) -> dict:
    row = {"mechanism": name, "params": params, "privatises": privatises, "epsilon": epsilon, "clients": clients,
           "dims": dims, "median_seconds": median, "values_per_second": clients * dims / median}
    if reference is not None:
        row.update(reference=reference, reference_values_per_second=clients * dims / reference_median,
                   ratio=reference_median / median)
    return row


def measure_streams(clients: int, dims: int, repetitions: int) -> list[dict]:
    """The keyed draw beside torch.rand and numpy's generator, each float32 uniform on [0, 1)."""
    import numpy as np

    median = median_seconds(lambda key: ClientStreams(("repetition", key), clients).rand((clients, dims)),
                            repetitions)
    torch_median = median_seconds(lambda key: torch.rand(clients, dims), repetitions)
    rng = np.random.default_rng(0)
    numpy_median = median_seconds(lambda key: rng.random((clients, dims), dtype=np.float32), repetitions)
    return [_row("streams.rand", {}, "-", None, clients, dims, median, "torch.rand", torch_median),
            _row("streams.rand", {}, "-", None, clients, dims, median, "numpy Generator.random", numpy_median)]


def measure_reference(name: str, clients: int, dims: int, repetitions: int) -> dict:
    """A per-coordinate perturber (anonymizer: every coordinate at ε) beside its numpy reference."""
    import numpy as np

    mine = measure(name, clients, dims, repetitions, {"anonymizer": True})
    values = (torch.rand(clients, dims, generator=torch.Generator().manual_seed(0)) * 2 - 1).double().numpy()
    rng = np.random.default_rng(0)
    reference_median = median_seconds(lambda key: REFERENCES[name](values, mine["epsilon"], rng), repetitions)
    return _row(name, {"anonymizer": True}, mine["privatises"], mine["epsilon"], clients, dims,
                mine["median_seconds"], "numpy reference", reference_median)


def measure(name: str, clients: int, dims: int, repetitions: int, params: dict | None = None) -> dict:
    epsilon = max(2.0, mechanisms.get(name).example_epsilon)
    mechanism = mechanisms.create(name, epsilon, dims, params, cohort_size=clients, classes=2)
    values = torch.rand(clients, dims, generator=torch.Generator().manual_seed(0)) * 2 - 1
    labels = torch.arange(clients) % 2
    release, updates = mechanism.stages()
    # A data release privatises [clients, d] records (and their labels), an update mechanism [clients, d] updates.
    if release is not None:
        def work(key):
            release.release(values, labels, ClientStreams(("repetition", key), clients))
    else:
        state = updates.initial_state(clients)

        def work(key):
            updates.privatize(values, ClientStreams(("repetition", key), clients), state)
    median = median_seconds(work, repetitions)
    return _row(name, params or {}, mechanism.privatises, epsilon, clients, dims, median)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--dims", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--references-only", action="store_true",
                        help="only the rows with a reference: streams.rand and the per-coordinate perturbers")
    parser.add_argument("--out", default="benchmarks/results/mechanism_throughput.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    results = []
    cases = [] if args.references_only else [(name, None) for name in mechanisms.names()] + VARIANTS
    for dims in args.dims:
        results += measure_streams(args.clients, dims, args.repetitions)
        results += [measure_reference(name, args.clients, dims, args.repetitions) for name in REFERENCES]
    for name, params in cases:
        for dims in args.dims:
            results.append(measure(name, args.clients, dims, args.repetitions, params))
    print(f"{'mechanism':32s} {'d':>6s} {'median s':>10s} {'values/s':>12s}  reference: values/s, ratio")
    for row in results:
        label = row["mechanism"] + "".join(f" {k}={v}" for k, v in row["params"].items())
        against = (f"  {row['reference']}: {row['reference_values_per_second']:.3e}, {row['ratio']:.2f}×"
                   if "reference" in row else "")
        print(f"{label:32s} {row['dims']:6d} {row['median_seconds']:10.5f} {row['values_per_second']:12.3e}{against}")
    write_result_file("mechanism_throughput", results, args.out, threads=args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
