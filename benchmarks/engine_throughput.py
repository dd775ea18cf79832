"""Engine throughput: rounds per second and seconds per epoch, vectorised vs a per-client loop.

    python benchmarks/engine_throughput.py [--device cpu|cuda|auto] [--threads 1] [--quick] [--kernels]

Scenarios (each in its own process, so the peak resident memory is the scenario's own):
* fedsel-adult-lr-ps-pm — FedSel Algorithm 1 on Adult (N ≈ 39,000 training clients with one record,
  m = 1 % per round, one epoch = 99 rounds, LR, PS-PM at ε = 2). Uses the official files from
  data/raw/adult or ../shared/datasets; without them a random one-hot stand-in of the same shape.
* bitrand-mlp-768 — BitRand's MLP (768 → 1500 → 1500 → 4) with FedSGD: 100 clients of 50 records
  on 768-dim embeddings (random stand-ins: the cost does not depend on the values).
* lenet5-mnist-fedsgd-10 — LeNet-5 FedSGD, 10 clients of 600 28×28 images each per round
  (lenet5-mnist-fedsgd-10x32: of 32 images each).
* bitrand-mlp-fedavg-20 — the BitRand campaign's training: the MLP (384 → 1500 → 1500 → 4) with
  FedAvg, 20 clients of 304 records, one local epoch of batches of 64 (MiniLM-sized stand-ins).
Each is timed for the engine (a whole run: s/round, including its evaluations; and its rounds alone on
the loop's cohorts) and for a reference that does the same work with a plain Python loop over the
cohort's clients (autograd per client, the mechanism per client, the network's layers as plain PyTorch
writes them: textbook_network), both from the end of a first round, as pfl-research's rounds are
timed; the ratio, the loop's time over the
engine's rounds alone, is the gain of the engine's execution (performance goal 1 in
benchmarks/performance_goals.py: at least 1, every network's round no slower than the loop; goal 7:
at least 1.5 for the deep networks). Where pfl-research is installed, the deep scenarios are also
timed in it (benchmarks/pfl_reference.py: its own simulation of the same clients and rounds, on the
textbook network too). With --kernels, the engine's rounds of the deep scenarios are profiled once
more for the time of their matrix products and convolutions (KERNELS), which any implementation of the
same network computes: the reference's round over it bounds the ratio the engine can reach. The
strategy column is how the engine computed the clients' gradients (training.gradients: auto picks it
from the shapes). Results are printed and written as JSON (benchmarks/results/engine_throughput.json)
so later runs can be compared. Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from ldpbench import mechanisms
from ldpbench.fl import clients as fl_clients
from ldpbench.fl.engine import ClientData, FederatedTrainer
from ldpbench.fl.model import FlatModel, build_network
from ldpbench.fl.pooling import textbook_network
from ldpbench.fl.settings import TrainingSettings
from ldpbench.fl.strategies import RoundRequest
from ldpbench.rng import ClientStreams

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
import pfl_reference  # noqa: E402
from result_file import write_result_file  # noqa: E402

SCENARIOS = ("fedsel-adult-lr-ps-pm", "bitrand-mlp-768", "lenet5-mnist-fedsgd-10", "lenet5-mnist-fedsgd-10x32",
             "bitrand-mlp-fedavg-20")
ROOT = Path(__file__).resolve().parents[1]
# The scenarios pfl-research is measured on where it is installed: the deep networks (its per-user
# simulation of FedSel's 39,000 one-record clients would take hours a round).
PFL_SCENARIOS = ("lenet5-", "bitrand-mlp-")


def _adult(quick: bool):
    """Adult's training split as prepared by ldpbench, or a same-shaped stand-in."""
    from ldpbench.data.registry import get
    from ldpbench.data.split import train_test_indices
    from ldpbench.runner import load

    prepared = ROOT / "data" / "prepared" / "adult"
    source = "official Adult (a9a encoding)"
    try:
        if quick:
            raise LookupError("quick mode uses the stand-in")
        if not (prepared / "meta.json").exists():
            get("adult").prepare(prepared, ROOT / "data" / "raw", ROOT.parent / "shared" / "datasets")
        data = load(prepared)
        x, y = data.features, data.labels
    except Exception as error:  # no local copy: the cost does not depend on the values
        source = f"random one-hot stand-in ({type(error).__name__})"
        gen = torch.Generator().manual_seed(0)
        x = (torch.rand(48_842, 123, generator=gen) < 0.11).float()
        y = torch.randint(0, 2, (48_842,), generator=gen)
    train, test = train_test_indices(len(y), 0)
    if quick:
        train, test = train[:4000], test[:1000]
    return x[train], y[train], x[test], y[test], source


def _embeddings(clients: int, per_client: int, dim: int, gen: torch.Generator):
    """Random stand-in embeddings with 4 classes in an iid partition (the cost does not depend on the values)."""
    x = torch.randn(clients * per_client, dim, generator=gen)
    y = torch.randint(0, 4, (len(x),), generator=gen)
    partition = fl_clients.partition("iid", y.numpy(), 0, clients=clients)
    return x, y, x[:500], y[:500], f"random {dim}-dim stand-in embeddings", partition


def build(scenario: str, device: str, quick: bool):
    """(network, mechanism, client data, test x, test y, config, description)."""
    gen = torch.Generator().manual_seed(0)
    if scenario == "fedsel-adult-lr-ps-pm":
        x, y, tx, ty, source = _adult(quick)
        partition = fl_clients.partition("record", y.numpy(), 0)
        config = TrainingSettings(learning_rate=10.0, epochs=1, eval_every=10**6, device=device)
        network, mechanism_name, epsilon = build_network("lr", (x.shape[1],), 2, 0), "ps-pm", 2.0
    elif scenario == "bitrand-mlp-768":
        clients, per_client = (10, 50) if quick else (100, 50)
        x, y, tx, ty, source, partition = _embeddings(clients, per_client, 768, gen)
        config = TrainingSettings(learning_rate=0.1, rounds=3, cohort_size=clients, eval_every=10**6,
                                device=device)
        network, mechanism_name, epsilon = build_network("mlp", (768,), 4, 0), "np", None
    elif scenario in ("lenet5-mnist-fedsgd-10", "lenet5-mnist-fedsgd-10x32"):
        per_client = 32 if scenario.endswith("x32") else 60 if quick else 600
        x = torch.randint(0, 256, (10 * per_client, 1, 28, 28), generator=gen, dtype=torch.uint8)
        y = torch.randint(0, 10, (len(x),), generator=gen)
        tx, ty, source = x[:500], y[:500], "random 28×28 stand-in images"
        partition = fl_clients.partition("iid", y.numpy(), 0, clients=10)
        config = TrainingSettings(learning_rate=0.1, rounds=3, cohort_size=10, eval_every=10**6,
                                block_records=per_client, device=device)
        network, mechanism_name, epsilon = build_network("lenet5", (1, 28, 28), 10, 0), "np", None
    elif scenario == "bitrand-mlp-fedavg-20":
        clients, per_client = (4, 64) if quick else (20, 304)
        x, y, tx, ty, source, partition = _embeddings(clients, per_client, 384, gen)
        config = TrainingSettings(learning_rate=1.0, algorithm="fedavg", rounds=4, cohort_size=clients,
                                local_epochs=1, local_batch_size=64, local_learning_rate=0.3, l2=0.0,
                                eval_every=10**6, device=device)
        network, mechanism_name, epsilon = build_network("mlp", (384,), 4, 0), "np", None
    else:
        raise SystemExit(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    dims = FlatModel(network).dims
    mechanism = mechanisms.create(mechanism_name, epsilon or float("inf"), dims,
                                  cohort_size=config.cohort(partition.clients))
    return network, mechanism, ClientData(x, y, partition), tx, ty, config, source


def _loop_update(trainer: FederatedTrainer, model: FlatModel, weights: torch.Tensor,
                 records: torch.Tensor) -> torch.Tensor:
    """One client's update by plain autograd: its gradient (FedSGD) or its local-SGD delta (FedAvg)."""
    network, config = model.network, trainer.settings
    inputs = trainer.data.features[records]
    inputs = inputs.float() / 255 if inputs.dtype == torch.uint8 else inputs
    labels = trainer.data.labels[records]
    if config.algorithm == "fedsgd":
        w = weights.clone().requires_grad_(True)
        loss = network.per_example_loss(model.outputs(w, inputs), labels).mean()
        return torch.autograd.grad(loss, w)[0] + config.l2 * weights
    local = weights.clone()
    for _ in range(config.local_epochs):
        for start in range(0, len(records), config.local_batch_size):
            w = local.requires_grad_(True)
            batch = slice(start, start + config.local_batch_size)
            loss = network.per_example_loss(model.outputs(w, inputs[batch]), labels[batch]).mean()
            local = (local - config.local_learning_rate * torch.autograd.grad(loss, w)[0]).detach()
    return local - weights


def loop_reference(trainer: FederatedTrainer, rounds: int) -> float:
    """The same rounds with a Python loop over clients: autograd on the textbook network and the
    mechanism, one client at a time; seconds from the end of its first round (as engine_rounds)."""
    model = FlatModel(textbook_network(trainer.model.network))
    weights = trainer.initial_weights()
    started = None
    for round_index, _, cohort in fl_clients.cohorts(trainer.settings.sampler, trainer.partition.clients,
                                                     trainer.cohort_size, rounds + 1, trainer.seed):
        if round_index == 2:  # rounds count from 1
            started = time.perf_counter()
        reports = []
        for client in cohort.tolist():
            records = trainer.data.client_records(client)
            update = _loop_update(trainer, model, weights, records)
            state = None if trainer.client_state is None else trainer.client_state.read(torch.tensor([client]))
            one = ClientStreams((trainer.seed, round_index, "mechanism"), torch.tensor([client]))
            privatized = trainer.mechanism.privatize(update.unsqueeze(0), one, state)
            if trainer.client_state is not None:
                trainer.client_state.write(torch.tensor([client]), privatized.state)
            reports.append(privatized.reports)
        weights = trainer.algorithm.server_step(weights, trainer.mechanism.aggregate(torch.cat(reports)))
    return time.perf_counter() - started


def engine_rounds(trainer: FederatedTrainer, rounds: int, timed=contextlib.nullcontext) -> float:
    """The engine's rounds alone (cohort, updates, mechanism, server step; no evaluation), as the loop's:
    seconds of `rounds` rounds from the end of a first one (inside `timed()`). pfl-research's rounds
    are timed so too (pfl_reference): a trainer's first round allocates what the next ones reuse (its
    update rows, the worker), which a run's hundreds of rounds amortise."""
    weights = trainer.initial_weights()
    cohorts = fl_clients.cohorts(trainer.settings.sampler, trainer.partition.clients, trainer.cohort_size,
                                 rounds + 1, trainer.seed)

    def train(steps):
        nonlocal weights
        for round_index, _, cohort in steps:
            step = trainer.step(RoundRequest(weights, cohort.to(trainer.device), round_index))
            weights = trainer.algorithm.server_step(weights, step)
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()

    train([next(cohorts)])
    with timed():
        started = time.perf_counter()
        train(cohorts)
        return time.perf_counter() - started


# The matrix products and convolutions of a deep network's round: what any implementation of the same
# network and clients computes, in the same torch kernels (--kernels).
KERNELS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution",
           "aten::convolution_backward")


def kernel_seconds(trainer: FederatedTrainer, rounds: int) -> tuple[float, float]:
    """(seconds per round the engine's rounds spend inside KERNELS (their own time under torch.profiler),
    seconds per round of those same profiled rounds). A reference that computes the same kernels cannot
    be faster than the first per round, so the reference's round over it bounds how much faster than that
    reference the engine can become; the second, of the same run, holds the first."""
    from torch.profiler import ProfilerActivity, profile

    profiled = profile(activities=[ProfilerActivity.CPU])
    wall = engine_rounds(trainer, rounds, timed=lambda: profiled)
    kernels = sum(event.self_cpu_time_total for event in profiled.key_averages() if event.key in KERNELS) / 1e6
    return kernels / rounds, wall / rounds


def pfl_round(network, data: ClientData, config: TrainingSettings, rounds: int) -> float:
    """pfl-research's seconds per round of the scenario (its clients, cohort, algorithm, rates)."""
    partition = data.partition
    client_records = [data.dataset_rows(partition.records[partition.offsets[client]:partition.offsets[client + 1]])
                      for client in range(partition.clients)]
    return pfl_reference.seconds_per_round(
        network, data.features, data.labels, client_records, config.algorithm, config.learning_rate,
        config.cohort(partition.clients), rounds, config.local_learning_rate, config.local_batch_size)


def run_scenario(scenario: str, device: str, quick: bool, kernels: bool = False) -> dict:
    network, mechanism, data, tx, ty, config, source = build(scenario, device, quick)

    def trainer():
        return FederatedTrainer(network, mechanism, data, tx, ty, config, seed=0)

    warm = TrainingSettings(**{**config.__dict__, "rounds": 1})
    FederatedTrainer(network, mechanism, data, tx, ty, warm, seed=0).run()  # imports, allocator warm-up
    engine = trainer()
    result = engine.run()
    rounds = result.final["rounds"]
    per_round = result.final["train_seconds"] / rounds
    rounds_per_epoch = fl_clients.rounds_per_epoch(data.partition.clients, config.cohort(data.partition.clients))
    loop_rounds = min(rounds, 10)
    reference = trainer()
    torch.set_num_threads(1)  # the engine computes with one thread; so does the reference
    loop_per_round = loop_reference(reference, loop_rounds) / loop_rounds
    step_per_round = engine_rounds(trainer(), loop_rounds) / loop_rounds
    deep = scenario.startswith(PFL_SCENARIOS)
    pfl_version = pfl_reference.available() if deep else None
    pfl_per_round = None if pfl_version is None else pfl_round(textbook_network(network), data, config,
                                                                    loop_rounds)
    kernel_per_round, profiled_per_round = (kernel_seconds(trainer(), loop_rounds) if kernels and deep
                                            and device == "cpu" else (None, None))
    return {
        "scenario": scenario, "data": source, "device": str(engine.device),
        "device_name": torch.cuda.get_device_name() if engine.device.type == "cuda" else platform.processor(),
        "clients": data.partition.clients, "cohort": config.cohort(data.partition.clients),
        "params": FlatModel(network).dims, "rounds_timed": rounds,
        "seconds_per_round": per_round, "rounds_per_second": 1 / per_round,
        "seconds_per_epoch": per_round * rounds_per_epoch, "rounds_per_epoch": rounds_per_epoch,
        "loop_seconds_per_round": loop_per_round, "loop_rounds_timed": loop_rounds,
        # The engine's rounds without evaluation, on the loop's cohorts: the like-for-like comparison.
        "engine_round_seconds": step_per_round, "vectorisation_ratio": loop_per_round / step_per_round,
        # pfl-research doing the same rounds, where it is installed (benchmarks/pfl_reference.py).
        "pfl_version": pfl_version, "pfl_seconds_per_round": pfl_per_round,
        # The round's matrix products and convolutions (--kernels): a floor for anyone computing them.
        "kernel_seconds_per_round": kernel_per_round,
        # The rounds those kernels were timed in, under the profiler: a round of the same run.
        "kernel_profiled_round_seconds": profiled_per_round,
        "final_test_accuracy": result.final["test_accuracy"], "gradients": result.final["gradients"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if engine.device.type == "cuda" else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--kernels", action="store_true",
                        help="also time the deep scenarios' matrix products and convolutions (torch.profiler, CPU)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one scenario, print JSON
    parser.add_argument("--out", default="benchmarks/results/engine_throughput.json")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_scenario(args.one, args.device, args.quick, args.kernels)))
        return 0
    results = []
    print(f"{'scenario':26s} {'device':6s} {'strategy':11s} {'s/round':>9s} {'rounds/s':>9s} {'s/epoch':>9s} "
          f"{'round alone':>11s} {'loop s/round':>12s} {'ratio':>7s} {'pfl s/round':>11s} {'peak MiB':>9s}")
    for scenario in args.scenarios:
        command = [sys.executable, __file__, "--one", scenario, "--device", args.device]
        flags = (["--quick"] if args.quick else []) + (["--kernels"] if args.kernels else [])
        output = subprocess.run(command + flags, check=True, capture_output=True, text=True).stdout
        row = json.loads(output.strip().splitlines()[-1])
        results.append(row)
        print(f"{scenario:26s} {row['device']:6s} {row['gradients']:11s} {row['seconds_per_round']:9.4f} "
              f"{row['rounds_per_second']:9.1f} {row['seconds_per_epoch']:9.3f} {row['engine_round_seconds']:11.4f} "
              f"{row['loop_seconds_per_round']:12.4f} {row['vectorisation_ratio']:7.1f} "
              f"{'-' if row['pfl_seconds_per_round'] is None else format(row['pfl_seconds_per_round'], '.4f'):>11s} "
              f"{row['peak_rss_mib']:9.0f}",
              flush=True)
        if row["kernel_seconds_per_round"]:
            floor = row["kernel_seconds_per_round"]
            peer = "" if row["pfl_seconds_per_round"] is None else \
                f", pfl-research at most {row['pfl_seconds_per_round'] / floor:.2f}x"
            print(f"{'':26s} kernels {floor:.4f} s/round ({floor / row['engine_round_seconds']:.0%} of the round): "
                  f"with nothing else the engine could be at most {row['loop_seconds_per_round'] / floor:.2f}x "
                  f"the loop{peer}", flush=True)
    write_result_file("engine_throughput", results, args.out, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
