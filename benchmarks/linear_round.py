"""A linear model's FedSGD round beside a hand-written floor (performance goals 2 and 5 in
benchmarks/performance_goals.py).

    python benchmarks/linear_round.py [--repetitions 200] [--scaling]

The round: a cohort of clients, one record each (FedSel's setting), computes the logistic-regression
gradient at the server weights; each report is flat PM (ε = 2: one coordinate sampled, perturbed at ε
and scaled by d); the server averages the reports and descends. ldpbench's round is the engine's own
(`FederatedTrainer.step` and the server step, keyed streams, chunking, the mechanism registry); the
floor is the same arithmetic written by hand in a few torch lines, with torch's global generator
instead of keyed streams: what a round costs with nothing but the work. Both run on one thread, in
this process, alternately, and the table gives the median over the repetitions and the ratio
(goal 2: at most 2 at Adult's shape, cohort 488, d = 123). Adult's round is timed twice: with
the keyed draws of a process that trains few rounds (numpy) and of one that trains many (compiled,
rng.speed.rounds_for_small_draws); the values are the same.

--scaling times the same round on random one-hot data of d = 10³, 10⁴ and 10⁵ features (--dims) with
cohorts of 100 and 1,000 clients (--cohorts), to show how the cost grows with clients × d (goal 5:
linear, within 1.5× of the floor). Results are printed and written as JSON to
benchmarks/results/linear_round.json. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from ldpbench import mechanisms, rng
from ldpbench.fl import clients as fl_clients
from ldpbench.fl.engine import ClientData, FederatedTrainer
from ldpbench.fl.model import build_network
from ldpbench.fl.settings import TrainingSettings
from ldpbench.fl.strategies import RoundRequest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
from result_file import write_result_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EPSILON, LEARNING_RATE, L2 = 2.0, 10.0, 1e-4


def adult_features() -> tuple[torch.Tensor, torch.Tensor, str]:
    """Adult's prepared training records, or a one-hot stand-in of the same shape (the cost does not
    depend on the values)."""
    from ldpbench.runner import load

    try:
        data = load(ROOT / "data" / "prepared" / "adult")
        return data.features.float(), data.labels, "official Adult (a9a encoding)"
    except Exception as error:
        x, y = one_hot_stand_in(48_842, 123)
        return x, y, f"random one-hot stand-in ({type(error).__name__})"


def one_hot_stand_in(records: int, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(records, dims, generator=gen) < min(0.11, 14 / dims)).float()
    return x, torch.randint(0, 2, (records,), generator=gen)


def floor_round(x: torch.Tensor, signs: torch.Tensor, weights: torch.Tensor, cohort: torch.Tensor) -> torch.Tensor:
    """The round by hand: LR gradients (+ l2·w), flat PM on one coordinate each (ε = 2), mean, descent."""
    return weights - LEARNING_RATE * floor_flat_pm(floor_gradients(x, signs, weights, cohort)).mean(dim=0)


def floor_gradients(x: torch.Tensor, signs: torch.Tensor, weights: torch.Tensor, cohort: torch.Tensor) -> torch.Tensor:
    """Each cohort client's LR gradient (one record each) + l2·w, by hand: [clients, d]."""
    rows, s = x[cohort], signs[cohort]
    return lr_gradients(rows, s, rows @ weights, weights)


def lr_gradients(rows: torch.Tensor, signs: torch.Tensor, margins: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """LR gradients + l2·w from the rows [..., clients, d], their signs and margins [..., clients], weights [..., d]."""
    return (-signs * torch.sigmoid(-signs * margins)).unsqueeze(-1) * rows + L2 * weights.unsqueeze(-2)


def floor_flat_pm(gradients: torch.Tensor) -> torch.Tensor:
    """Flat PM by hand (ε = 2) on [..., clients, d] gradients: one coordinate of each row, perturbed and
    scaled by d, in a row of zeros (torch's global generator)."""
    dims = gradients.shape[-1]
    chosen = torch.randint(dims, (*gradients.shape[:-1], 1))
    value = gradients.gather(-1, chosen).clamp_(-1.0, 1.0)
    z = math.exp(EPSILON / 2)
    c = (z + 1) / (z - 1)
    left = (c + 1) / 2 * value - (c - 1) / 2
    position = torch.rand(chosen.shape)
    walked = position * (c + 1)  # along [-c, c] with the centre [left, left + c - 1] cut out
    outside = torch.where(walked < left + c, walked - c, walked - 1)
    noisy = torch.where(torch.rand(chosen.shape) < z / (z + 1), left + (c - 1) * position, outside)
    return torch.zeros(gradients.shape).scatter_(-1, chosen, noisy * dims)


def measure(x: torch.Tensor, y: torch.Tensor, cohort_size: int, repetitions: int) -> dict:
    """Median seconds of ldpbench's round and of the floor on the same cohorts, alternately."""
    dims = x.shape[1]
    partition = fl_clients.partition("record", y.numpy(), 0)
    settings = TrainingSettings(learning_rate=LEARNING_RATE, rounds=repetitions + 1, cohort_size=cohort_size,
                                l2=L2, eval_every=10**6)
    mechanism = mechanisms.create("pm", EPSILON, dims, cohort_size=cohort_size)
    trainer = FederatedTrainer(build_network("lr", (dims,), 2, 0), mechanism, ClientData(x, y, partition),
                               x[:10], y[:10], settings, seed=0)
    signs = (2 * y - 1).float()
    weights = trainer.initial_weights()
    cohorts = [c for _, _, c in fl_clients.cohorts("epoch", partition.clients, cohort_size, repetitions + 1, 0)]
    engine_times, floor_times = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for index, cohort in enumerate(cohorts):
            started = time.perf_counter()
            step = trainer.step(RoundRequest(weights, cohort, index + 1))
            trainer.algorithm.server_step(weights, step)
            middle = time.perf_counter()
            floor_round(x, signs, weights, cohort)
            ended = time.perf_counter()
            if index:  # the first round of each warms up
                engine_times.append(middle - started)
                floor_times.append(ended - middle)
    finally:
        torch.set_num_threads(threads)
    engine, floor = statistics.median(engine_times), statistics.median(floor_times)
    return {"cohort": cohort_size, "dims": dims, "values": cohort_size * dims, "repetitions": repetitions,
            "seconds_per_round": engine, "floor_seconds_per_round": floor, "ratio": engine / floor}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=200)
    parser.add_argument("--scaling", action="store_true", help="also the round at --dims × --cohorts")
    parser.add_argument("--dims", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--cohorts", type=int, nargs="+", default=[100, 1_000])
    parser.add_argument("--out", default="benchmarks/results/linear_round.json")
    args = parser.parse_args(argv)
    x, y, source = adult_features()
    # A process that trains few rounds keeps its small keyed draws in numpy; one that trains many
    # (rng.speed.rounds_for_small_draws, as a long run or a large cell does) compiles them.
    rows = [{"data": source, "draws": "numpy (short process)", **measure(x, y, 488, args.repetitions)}]
    rng.speed.note_rounds(rng.speed.rounds_for_small_draws)
    rows.append({"data": source, "draws": "compiled (long process)", **measure(x, y, 488, args.repetitions)})
    if args.scaling:
        for dims in args.dims:
            for cohort in args.cohorts:
                records = max(cohort * 4, 2_000)
                sx, sy = one_hot_stand_in(records, dims)
                rows.append({"data": f"one-hot stand-in, {records} records", "draws": "compiled (long process)",
                             **measure(sx, sy, cohort, max(5, args.repetitions // (1 + dims * cohort // 10**6)))})
    print(f"{'data':36s} {'keyed draws':24s} {'cohort':>6s} {'d':>7s} {'ms/round':>9s} {'floor ms':>9s} "
          f"{'ratio':>6s} {'ns/value':>9s}")
    for row in rows:
        print(f"{row['data'][:36]:36s} {row['draws']:24s} {row['cohort']:6d} {row['dims']:7d} "
              f"{row['seconds_per_round'] * 1e3:9.3f} {row['floor_seconds_per_round'] * 1e3:9.3f} {row['ratio']:6.2f} "
              f"{row['seconds_per_round'] / row['values'] * 1e9:9.2f}")
    write_result_file("linear_round", rows, args.out, threads=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
