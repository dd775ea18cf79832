"""The federated engine: the round loop of whole-cohort FedSGD and FedAvg, chunked, resumable.

A round: the sampler picks the cohort; the algorithm (ldpbench.fl.algorithms) computes each client's
update for a chunk of clients at once; the mechanism privatises the chunk's updates; the reports of
the whole cohort are gathered in cohort order and `mechanism.aggregate` turns them into the step the
algorithm applies to the server weights. Without a mechanism (data releases: the records themselves
were privatised before training) the reports are the updates and the step is their mean. After each
round the hooks (ldpbench.fl.hooks) evaluate, log, stop a diverged run and checkpoint; callers may
add their own. How a round's reports are computed is a named step strategy
(ldpbench.fl.strategies), which builds on the trainer's public round API: `step`, and its parts
`updates`, `streams`, `read_state`/`write_state` and `estimate`.

Determinism. Every random draw is keyed by (seed, round, client, purpose) (`ClientStreams`), so a
client's draws — its local shuffles and its mechanism noise — and its report given its update are
the same whatever chunk or shard it is computed in (the mechanism contract suite checks chunks of 1,
7 and all bit for bit). Records are processed in fixed blocks of `block_records`, and the cohort's
reports are reduced once, in cohort order. What is not bit-invariant is the network arithmetic
itself: BLAS/oneDNN kernels round the last bits of a product differently for different batch
shapes, so changing `chunk_clients` moves results at float rounding level (tested to agree within
1e-4 relative). `chunk_clients` is therefore part of the run
plan, and a given plan gives bit-identical numbers in any process, cell, shard, and after a resume
(ldpbench.fl.checkpoint). On CPU the engine computes with one intra-op thread (results would
otherwise depend on the thread count; campaigns parallelise across runs instead); on CUDA runs
repeat for a fixed configuration but are not bit-identical to CPU.

Runs trained together. Where a round is small (FedSel's grids: 480 clients × 100 weights) its cost is
mostly per call, and `train_together` trains the runs of a cell round by round as one group: each run
keeps its own loop, and one privatise call serves all of their cohorts (the "joint" step strategy;
ClientStreams.joined keeps each row on its own run's key). Each run's numbers are those it gives
alone, bit for bit; which runs train together is decided from their shapes (`together_limit`), never
from timings.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ldpbench import rng
from ldpbench.fl.algorithms import ClientRecords, create_algorithm
from ldpbench.fl.checkpoint import Checkpoint, Checkpointing
from ldpbench.fl.client_state import ClientStateStore, spill_path
from ldpbench.fl.clients import Partition, cohorts
from ldpbench.fl.hooks import DivergenceStop, Evaluation, Hook, LoopState, PlateauStop, Progress
from ldpbench.fl.memory import keep_freed_memory
from ldpbench.fl.metrics import Evaluator
from ldpbench.fl.model import FlatModel, take_rows
from ldpbench.fl.networks import Network
from ldpbench.fl.settings import TrainingSettings
from ldpbench.fl.strategies import RoundRequest, SequentialPrivatisation, StepStrategy, step_strategy
from ldpbench.mechanisms.base import Mechanism
from ldpbench.rng import ClientStreams, generator


@dataclass
class RunResult:
    curve: list[dict[str, Any]]
    final: dict[str, Any]
    status: str  # "ok" or "diverged"
    # Rounds each client took part in [clients] (one report each to an update mechanism); the runner's
    # privacy stage turns them into its ledger and gives the accounting.
    reports_per_client: torch.Tensor = field(repr=False)
    weights: torch.Tensor = field(repr=False)  # the server's weights after the last round [dims], on CPU
    stopped_early: bool = False  # the plateau stop (training.stop) ended the run


@contextlib.contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Compute with one intra-op thread on CPU (results would otherwise depend on the thread count)."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class ClientData:
    """Training records, their labels and their partition into clients (features may be uint8 images).

    With `rows`, features and labels are a whole dataset and training record i is its row rows[i]
    (a run's training split, without copying it); without, they are the training records themselves.
    """

    features: torch.Tensor
    labels: torch.Tensor
    partition: Partition
    rows: torch.Tensor | None = None

    @property
    def record_count(self) -> int:
        """How many training records there are."""
        return len(self.labels) if self.rows is None else len(self.rows)

    def dataset_rows(self, records: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The rows of features and labels that hold training records `records`."""
        records = torch.as_tensor(records)
        return records if self.rows is None else take_rows(self.rows, records)


class FederatedTrainer:
    """One run's training: `run()` trains `network` on `data` under `mechanism` (None: the updates are
    reported as they are) and returns the curve, the final metrics and weights and the report counts.

    Its round API (`step` and the parts it is made of) is public so that step strategies
    (ldpbench.fl.strategies) compose rounds from it; it is the `RoundTrainer` protocol.
    """

    def __init__(self, network: Network, mechanism: Mechanism | None, data: ClientData, test_features,
                 test_labels, settings: TrainingSettings, seed: int, dtype: torch.dtype = torch.float32,
                 checkpoint_path: Path | None = None, state_memory_limit_bytes: int = 2**30,
                 hooks: Sequence[Hook] = (), validation: tuple[torch.Tensor, torch.Tensor] | None = None,
                 run_name: str = "") -> None:
        self.settings, self.seed, self.dtype = settings, seed, dtype
        self.device = settings.resolved_device()
        self.model = FlatModel(network.to(self.device))
        self.mechanism = mechanism
        self.partition = data.partition
        self.data = ClientRecords(data.features.to(self.device), data.labels.to(self.device),
                                  data.dataset_rows(self.partition.records).to(self.device),
                                  torch.from_numpy(self.partition.offsets).to(self.device), dtype)
        self.algorithm = create_algorithm(self.model, self.data, settings, seed)
        self.corrects = mechanism is not None and type(mechanism).correct is not Mechanism.correct
        clients = self.partition.clients
        self.cohort_size = settings.cohort(clients)
        self.rounds = settings.total_rounds(clients)
        self.client_state = None
        if mechanism is not None and mechanism.stateful:
            spill = None if checkpoint_path is None else spill_path(checkpoint_path)
            self.client_state = ClientStateStore(clients, mechanism.state_dims, dtype, state_memory_limit_bytes,
                                                 spill)
        sample = torch.randperm(data.record_count, generator=generator(seed, "train-loss sample"))
        train_sample = data.dataset_rows(sample[: settings.eval_train_records].sort().values).to(self.device)
        validation_features, validation_labels = (None, None) if validation is None else (
            validation[0].to(self.device), validation[1].to(self.device))
        self.evaluate = Evaluator(self.model, take_rows(self.data.features, train_sample),
                                  take_rows(self.data.labels, train_sample),
                                  test_features.to(self.device), test_labels.to(self.device), settings.l2, dtype,
                                  validation_features, validation_labels)
        self.checkpoint = None if checkpoint_path is None else Checkpoint(
            checkpoint_path, self._checkpoint_identity(), self.rounds, self.model.dims, clients,
            None if self.client_state is None else (clients, mechanism.state_dims))
        self.hooks: list[Hook] = [Evaluation(self.evaluate, settings.eval_every), Progress(run_name),
                                  DivergenceStop(self.evaluate.finite_metrics)]
        if settings.stop is not None:
            self.hooks.append(PlateauStop(settings.stop))
        if self.checkpoint is not None:
            self.hooks.append(Checkpointing(self.checkpoint, settings.checkpoint_every, self.client_state))
        self.hooks.extend(hooks)

    def _checkpoint_identity(self) -> dict[str, Any]:
        """What a checkpoint must have been written by: this run's seed, shape, mechanism and training,
        and the gradients' arithmetic that ran (training.gradients: auto resolves by the code's version,
        and a run must not continue in another arithmetic than it began)."""
        mechanism = self.mechanism
        return {"seed": self.seed, "rounds": self.rounds, "clients": self.partition.clients,
                "dims": self.model.dims, "mechanism": None if mechanism is None else mechanism.name,
                "epsilon": None if mechanism is None else float(mechanism.epsilon), "training": repr(self.settings),
                "gradients": self.algorithm.gradients}

    def initial_weights(self) -> torch.Tensor:
        return self.model.starting_weights().to(self.device, self.dtype)

    # -- one round: the public round API (strategies.RoundTrainer) ----------------------------
    def updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """Clients `ids`' updates [clients, dims] at `weights` in round `round_index` (the algorithm's)."""
        return self.algorithm.updates(weights, ids, round_index)

    def streams(self, ids: torch.Tensor, round_index: int) -> ClientStreams:
        """The mechanism's keyed streams of clients `ids` in round `round_index`."""
        return ClientStreams((self.seed, round_index, "mechanism"), ids)

    def read_state(self, ids: torch.Tensor) -> torch.Tensor | None:
        """The local state rows of clients `ids` (None for a stateless mechanism)."""
        return None if self.client_state is None else self.client_state.read(ids.cpu()).to(self.device)

    def write_state(self, ids: torch.Tensor, state: torch.Tensor | None) -> None:
        """Keep clients `ids`' new local state rows (nothing for a stateless mechanism)."""
        if self.client_state is not None:
            self.client_state.write(ids.cpu(), state)

    def _reports(self, updates: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """The report rows of clients `ids` for their updates (the updates themselves without a mechanism)."""
        if self.mechanism is None:
            return updates
        privatized = self.mechanism.privatize(updates, self.streams(ids, round_index), self.read_state(ids))
        self.write_state(ids, privatized.state)
        return privatized.reports

    def estimate(self, reports: torch.Tensor, cohort_updates: torch.Tensor | None) -> torch.Tensor:
        """The server's update estimate from the whole cohort's report rows, in cohort order."""
        if self.mechanism is None:
            return reports.mean(dim=0)  # what the "np" mechanism's aggregate does
        step = self.mechanism.aggregate(reports)
        if self.corrects:
            # Per-worker post-processing of the released estimate with each worker's own update
            # (DiffSketch's error correction); with one global model the corrected estimates are
            # averaged over the cohort.
            step = self.mechanism.correct(step, cohort_updates).mean(dim=0)
        return step

    def step(self, request: RoundRequest) -> torch.Tensor:
        """The server's update estimate for the request's cohort: its updates privatised chunk by chunk
        (`chunk_clients`), the reports gathered in cohort order."""
        rows, cohort_updates = [], []
        kept = self.algorithm.update_rows
        with kept.reuse():  # each chunk's updates written where the last round's were
            for ids in request.cohort.split(self.settings.chunk_clients or len(request.cohort)):
                updates = self.updates(request.weights, ids, request.round_index)
                if self.corrects:
                    cohort_updates.append(updates)
                rows.append(self._reports(updates, ids, request.round_index))
            reports = rows[0] if len(rows) == 1 else torch.cat(rows)
            step = self.estimate(reports, torch.cat(cohort_updates) if self.corrects else None)
        # The next round overwrites the kept rows: a step that is one of them (an aggregate returning
        # a report row as it is) leaves as a copy.
        return step.clone() if kept.holds(step) else step

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> RunResult:
        return _drive([self], SequentialPrivatisation())[0]

    def _loop(self) -> Generator[RoundRequest, torch.Tensor, RunResult]:
        """The round loop: yields each round's request for the server's step, is sent that step, and
        returns the run's result. A step strategy answers the requests: `run()` the sequential one,
        `train_together` the one it is given for several runs."""
        started = time.perf_counter()
        clients = self.partition.clients
        state = LoopState(self.rounds, self.initial_weights(), torch.zeros(clients, dtype=torch.int64), started)
        for hook in self.hooks:
            hook.on_start(state)
        first_round = state.round + 1
        # A resumed run whose checkpoint already met a stop condition trains no further round.
        finished = any([hook.should_stop(state) for hook in self.hooks])
        for round_index, epoch, cohort in cohorts(self.settings.sampler, clients, self.cohort_size,
                                                  self.rounds, self.seed):
            if finished:
                break
            if round_index < first_round:
                continue
            cohort = cohort.to(self.device)
            step = yield RoundRequest(state.weights, cohort, round_index)
            state.reports_per_client[cohort.cpu()] += 1
            state.weights = self.algorithm.server_step(state.weights, step)
            state.round, state.epoch, state.metrics = round_index, epoch + 1, None
            state.finite = bool(torch.isfinite(state.weights).all())
            for hook in self.hooks:
                hook.on_round_end(state)
            if any([hook.should_stop(state) for hook in self.hooks]):  # a list: every hook is asked
                break
        self.algorithm.update_rows.release()
        final = dict(state.curve[-1])
        final.update(rounds=state.round, rounds_planned=self.rounds, train_seconds=time.perf_counter() - started,
                     gradients=self.algorithm.gradients)
        for hook in self.hooks:
            hook.on_end(state)
        return RunResult(state.curve, final, state.status, state.reports_per_client, state.weights.cpu(),
                         state.stopped_early)


# -- runs trained together -----------------------------------------------------------------------
# Runs train together where the per-call cost of privatising a round dominates: while a round's
# updates of all the runs together hold at most this many values. FedSel's grid runs (480 clients ×
# 100 weights) then go in tens; a network of a million weights stays alone, where one call's cost is
# nothing beside its arithmetic and another run's [clients, d] would only add memory.
TOGETHER_MAX_VALUES = 1 << 19
TOGETHER_MAX_RUNS = 16


def together_limit(trainer: FederatedTrainer) -> int:
    """How many runs of this one's shape train together (1: it trains alone).

    A run can join others only where its mechanism privatises each round's whole cohort in one call
    (no `chunk_clients` below the cohort); data releases and runs without a mechanism have nothing to
    join. Decided from shapes alone, so a plan's grouping never depends on timings.
    """
    if trainer.mechanism is None or (trainer.settings.chunk_clients or trainer.cohort_size) < trainer.cohort_size:
        return 1
    values = trainer.cohort_size * max(trainer.model.dims, trainer.mechanism.report_dims)
    return max(1, min(TOGETHER_MAX_RUNS, TOGETHER_MAX_VALUES // values))


def can_train_together(first: FederatedTrainer, other: FederatedTrainer) -> bool:
    """Whether `other` can join a group led by `first`: the same mechanism (class and parameters,
    ε included), device and dtype, each able to join at all."""
    return (together_limit(first) > 1 and together_limit(other) > 1 and first.mechanism == other.mechanism
            and type(first.mechanism) is type(other.mechanism)
            and first.device == other.device and first.dtype == other.dtype)


def train_together(trainers: Sequence[FederatedTrainer], strategy: str = "joint") -> list[RunResult]:
    """Train runs that `can_train_together` round by round together; each run's result is the one its
    own `run()` gives, bit for bit.

    Each run keeps its own loop (cohorts, server step, evaluation, stops, checkpoints); a run that
    stops leaves the group. Every round the step strategy named `strategy` (ldpbench.fl.strategies)
    computes the steps of the runs still training: by default "joint", one mechanism call for all of
    their cohorts, each run then aggregating its own rows; "sequential" computes each run's step on
    its own. A result's train_seconds spans the group's training (the runner gives each run its share).
    """
    for trainer in trainers[1:]:
        if not can_train_together(trainers[0], trainer):
            raise ValueError("train_together needs runs with the same mechanism, device and dtype, each "
                             "privatising a whole cohort in one call")
    return _drive(trainers, step_strategy(strategy))


def _drive(trainers: Sequence[FederatedTrainer], strategy: StepStrategy) -> list[RunResult]:
    """Run the trainers' round loops side by side, answering each round's requests of the runs still
    training with `strategy`, on one thread; each run's result."""
    results: list[RunResult | None] = [None] * len(trainers)
    keep_freed_memory()  # a step's temporaries then reuse the last step's pages (ldpbench.fl.memory)
    with one_thread(trainers[0].device):
        loops, requests = {}, {}
        for index, trainer in enumerate(trainers):
            rng.speed.note_rounds(trainer.rounds)
            loops[index] = trainer._loop()
            try:
                requests[index] = next(loops[index])
            except StopIteration as finished:
                results[index] = finished.value
        while requests:
            indices = list(requests)
            answers = strategy.steps([trainers[index] for index in indices], [requests[index] for index in indices])
            for index, step in zip(indices, answers):
                try:
                    requests[index] = loops[index].send(step)
                except StopIteration as finished:
                    results[index] = finished.value
                    del requests[index]
    return results

