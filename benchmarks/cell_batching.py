"""What training a cell's runs together could gain (for performance goal 4 of benchmarks/performance_goals.py, the
default campaign's wall time): the measurement behind "where that pays".

    python benchmarks/cell_batching.py [--runs 10] [--rounds 100] [--out benchmarks/results/cell_batching.json]

A FedSel-grid cell: R runs (seeds 0..R-1) of logistic regression with FedSGD on 48,000 one-record
clients with d = 100 features (syn-L's shape; a random one-hot stand-in, since the cost does not
depend on the values), a cohort of 1 % (480) per round, and flat PM at ε = 2 or NP. For each round
index, on one thread, in this process, alternately and on the same cohorts:

* engine: ldpbench's round (FederatedTrainer.step and the server step) for each of the R runs in
  turn, with compiled draws, as the campaign's warm worker makes them;
* engine, together: the runs' round as `train_together` computes it (the "joint" step strategy:
  each run's updates, one privatise call over all the runs' cohorts, each run's aggregate and server
  step), the same bits;
* floor, run by run: the same arithmetic written by hand in a few torch lines
  (linear_round.floor_round, torch's global generator), R times;
* floor, batched: that arithmetic for the R runs at once, on [R, cohort, d] tensors.

The batched floor is the best a cell's runs trained together could reach: no keyed streams, no
bookkeeping, no per-run hooks. Engine ÷ batched floor therefore bounds what batching could save on a
cell's rounds, and engine ÷ together is what `train_together` saves; evaluation, set-up and writing
results are not in it. Results are printed and written as JSON. Not a test: nothing here asserts a
speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import linear_round  # noqa: E402
from result_file import write_result_file  # noqa: E402

from ldpbench import mechanisms, rng  # noqa: E402
from ldpbench.fl import clients as fl_clients  # noqa: E402
from ldpbench.fl.engine import ClientData, FederatedTrainer  # noqa: E402
from ldpbench.fl.model import build_network  # noqa: E402
from ldpbench.fl.settings import TrainingSettings  # noqa: E402
from ldpbench.fl.strategies import JointPrivatisation, RoundRequest  # noqa: E402

RECORDS, DIMS, COHORT = 48_000, 100, 480


def np_floor_round(x: torch.Tensor, signs: torch.Tensor, weights: torch.Tensor, cohort: torch.Tensor) -> torch.Tensor:
    """floor_round without the mechanism (NP: the gradients themselves are averaged)."""
    return weights - linear_round.LEARNING_RATE * linear_round.floor_gradients(x, signs, weights, cohort).mean(dim=0)


def batched_floor_round(x: torch.Tensor, signs: torch.Tensor, weights: torch.Tensor, cohorts: torch.Tensor,
                        private: bool) -> torch.Tensor:
    """The floor's round for R runs at once: weights [R, d], cohorts [R, clients]."""
    runs, clients = cohorts.shape
    flat = cohorts.reshape(-1)
    rows = x.index_select(0, flat).reshape(runs, clients, -1)
    s = signs.index_select(0, flat).reshape(runs, clients)
    margins = torch.bmm(rows, weights.unsqueeze(2)).squeeze(2)
    gradients = linear_round.lr_gradients(rows, s, margins, weights)
    reports = linear_round.floor_flat_pm(gradients) if private else gradients
    return weights - linear_round.LEARNING_RATE * reports.mean(dim=1)


def measure(mechanism_name: str, runs: int, rounds: int) -> dict:
    x, y = linear_round.one_hot_stand_in(RECORDS, DIMS)
    partition = fl_clients.partition("record", y.numpy(), 0)
    settings = TrainingSettings(learning_rate=linear_round.LEARNING_RATE, rounds=rounds, cohort_size=COHORT,
                                l2=linear_round.L2, eval_every=10**6)
    mechanism = mechanisms.create(mechanism_name, linear_round.EPSILON, DIMS, cohort_size=COHORT)
    trainers = [FederatedTrainer(build_network("lr", (DIMS,), 2, 0), mechanism, ClientData(x, y, partition),
                                 x[:10], y[:10], settings, seed=seed) for seed in range(runs)]
    # Each run's cohorts, round by round: [rounds][runs, cohort].
    per_run = [[cohort for _, _, cohort in fl_clients.cohorts("epoch", partition.clients, COHORT, rounds, seed)]
               for seed in range(runs)]
    cohorts = [torch.stack([per_run[run][index] for run in range(runs)]) for index in range(rounds)]
    signs = (2 * y - 1).float()
    weights = [trainer.initial_weights() for trainer in trainers]
    floor_weights = torch.stack(weights)
    one_floor = linear_round.floor_round if mechanism_name == "pm" else np_floor_round
    together_weights = list(weights)
    engine_times, together_times, floor_times, batched_times = [], [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for index, cohort in enumerate(cohorts):
            started = time.perf_counter()
            for run, trainer in enumerate(trainers):
                step = trainer.step(RoundRequest(weights[run], cohort[run], index + 1))
                weights[run] = trainer.algorithm.server_step(weights[run], step)
            engine_done = time.perf_counter()
            steps = JointPrivatisation().steps(trainers, [RoundRequest(together_weights[run], cohort[run], index + 1)
                                                          for run in range(runs)])
            together_weights = [trainer.algorithm.server_step(run_weights, step)
                                for trainer, run_weights, step in zip(trainers, together_weights, steps)]
            together_done = time.perf_counter()
            for run in range(runs):
                one_floor(x, signs, floor_weights[run], cohort[run])
            floor_done = time.perf_counter()
            batched_floor_round(x, signs, floor_weights, cohort, mechanism_name == "pm")
            batched_done = time.perf_counter()
            if index:  # the first round of each warms up
                engine_times.append(engine_done - started)
                together_times.append(together_done - engine_done)
                floor_times.append(floor_done - together_done)
                batched_times.append(batched_done - floor_done)
    finally:
        torch.set_num_threads(threads)
    if not all(torch.equal(a, b) for a, b in zip(weights, together_weights)):
        raise AssertionError("the runs trained together moved away from the runs trained one by one")
    engine, together, floor, batched = (statistics.median(t) for t in (engine_times, together_times, floor_times,
                                                                         batched_times))
    return {"mechanism": mechanism_name, "runs": runs, "cohort": COHORT, "dims": DIMS, "rounds": rounds,
            "engine_seconds": engine, "together_seconds": together, "floor_seconds": floor,
            "batched_floor_seconds": batched, "engine_over_floor": engine / floor,
            "engine_over_together": engine / together, "together_over_batched_floor": together / batched,
            "engine_over_batched_floor": engine / batched}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, nargs="+", default=[10, 50], help="runs trained together (R)")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--mechanisms", nargs="+", default=["pm", "np"], choices=["pm", "np"])
    parser.add_argument("--out", default="benchmarks/results/cell_batching.json")
    args = parser.parse_args(argv)
    rng.speed.every_draw = True  # the campaign's runs draw compiled (the warm worker loads the kernels)
    rows = [measure(name, runs, args.rounds) for name in args.mechanisms for runs in args.runs]
    print(f"{'mechanism':9s} {'runs':>5s} {'engine ms':>10s} {'together ms':>12s} {'floor ms':>9s} "
          f"{'batched ms':>11s} {'engine/together':>15s} {'together/batched':>16s}   (one round of every run)")
    for row in rows:
        print(f"{row['mechanism']:9s} {row['runs']:5d} {row['engine_seconds'] * 1e3:10.2f} "
              f"{row['together_seconds'] * 1e3:12.2f} {row['floor_seconds'] * 1e3:9.2f} "
              f"{row['batched_floor_seconds'] * 1e3:11.2f} {row['engine_over_together']:15.2f} "
              f"{row['together_over_batched_floor']:16.2f}")
    write_result_file("cell_batching", rows, args.out, threads=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
