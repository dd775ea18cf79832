"""Step strategies: how the server steps of the runs training side by side are computed each round.

The engine's round loop (ldpbench.fl.engine) asks, each round, for the server step of every run still
training, one `RoundRequest` per run; a step strategy answers them all. It computes with the trainer's
public round API (`RoundTrainer`) and nothing else, so a new way of computing a round is a new
strategy here, not an edit of the loop (the shape of Flower's `Strategy`). Two, chosen by name
(`step_strategy`):

* "sequential" (`SequentialPrivatisation`): each run computes its own step, one after the other: its
  cohort's updates chunk by chunk (`chunk_clients`), each chunk privatised in its own mechanism call.
  What a run trained alone does (`FederatedTrainer.run`).
* "joint" (`JointPrivatisation`): the runs' whole cohorts are privatised in one mechanism call, on
  streams joined from each run's own keyed streams (`ClientStreams.joined`); each run then writes
  back its own state and aggregates its own rows. A client's report depends only on its key, its id
  and its update (the mechanism contract suite checks joined runs bit for bit), so each run's step
  is the sequential one, bit for bit, for a fraction of the per-call cost where rounds are small
  (runs trained together, `engine.train_together`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from ldpbench.mechanisms.base import Mechanism
from ldpbench.rng import ClientStreams


@dataclass(frozen=True)
class RoundRequest:
    """What a run's round loop asks for: the server's step for `cohort` at `weights` in round `round_index`."""

    weights: torch.Tensor
    cohort: torch.Tensor
    round_index: int


class RoundTrainer(Protocol):
    """The trainer's public round API (ldpbench.fl.engine.FederatedTrainer): one round's parts, which a
    step strategy composes. `ids` are client ids, a whole cohort or a chunk of one."""

    mechanism: Mechanism | None  # the update mechanism (None: the updates are reported as they are)

    def step(self, request: RoundRequest) -> torch.Tensor:
        """The server's update estimate for the request, privatised chunk by chunk."""
        ...

    def updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """Clients `ids`' updates [clients, dims] at `weights` in round `round_index`."""
        ...

    def streams(self, ids: torch.Tensor, round_index: int) -> ClientStreams:
        """The mechanism's keyed streams of clients `ids` in round `round_index`."""
        ...

    def read_state(self, ids: torch.Tensor) -> torch.Tensor | None:
        """Clients `ids`' local state rows (None for a stateless mechanism)."""
        ...

    def write_state(self, ids: torch.Tensor, state: torch.Tensor | None) -> None:
        """Keep clients `ids`' new local state rows (nothing for a stateless mechanism)."""
        ...

    def estimate(self, reports: torch.Tensor, cohort_updates: torch.Tensor | None) -> torch.Tensor:
        """The server's update estimate from the whole cohort's report rows, in cohort order."""
        ...


class StepStrategy(Protocol):
    """Computes the server steps of several runs' rounds; each run's step must be the one its own
    `RoundTrainer.step` gives, bit for bit."""

    name: ClassVar[str]

    def steps(self, trainers: Sequence[RoundTrainer], requests: Sequence[RoundRequest]) -> list[torch.Tensor]:
        """The server step of each trainer's request, in order."""
        ...


class SequentialPrivatisation:
    """Each run's own step, one run after the other: a mechanism call per chunk of each cohort."""

    name: ClassVar[str] = "sequential"

    def steps(self, trainers: Sequence[RoundTrainer], requests: Sequence[RoundRequest]) -> list[torch.Tensor]:
        return [trainer.step(request) for trainer, request in zip(trainers, requests)]


class JointPrivatisation:
    """One mechanism call for all the runs' whole cohorts; the runs must share one mechanism (class
    and parameters, ε included), device and dtype (engine.can_train_together)."""

    name: ClassVar[str] = "joint"

    def steps(self, trainers: Sequence[RoundTrainer], requests: Sequence[RoundRequest]) -> list[torch.Tensor]:
        updates = [trainer.updates(request.weights, request.cohort, request.round_index)
                   for trainer, request in zip(trainers, requests)]
        streams = ClientStreams.joined([trainer.streams(request.cohort, request.round_index)
                                        for trainer, request in zip(trainers, requests)])
        states = [trainer.read_state(request.cohort) for trainer, request in zip(trainers, requests)]
        privatized = trainers[0].mechanism.privatize(updates[0] if len(updates) == 1 else torch.cat(updates),
                                                     streams, None if states[0] is None else torch.cat(states))
        sizes = [len(request.cohort) for request in requests]
        reports = privatized.reports.split(sizes)
        states = [None] * len(sizes) if privatized.state is None else privatized.state.split(sizes)
        steps = []
        for trainer, request, own_updates, own_reports, own_state in zip(trainers, requests, updates, reports,
                                                                         states):
            trainer.write_state(request.cohort, own_state)
            steps.append(trainer.estimate(own_rows(own_reports), own_updates))
        return steps


# The strategies by name: engine code chooses one (train_together's `strategy`), never a campaign file.
STEP_STRATEGIES: dict[str, type[StepStrategy]] = {strategy.name: strategy
                                                  for strategy in (SequentialPrivatisation, JointPrivatisation)}


def step_strategy(name: str) -> StepStrategy:
    """The step strategy named `name`; a ValueError naming the known ones for any other name."""
    try:
        return STEP_STRATEGIES[name]()
    except KeyError:
        raise ValueError(f"unknown step strategy {name!r}; known: {', '.join(sorted(STEP_STRATEGIES))}") from None


def own_rows(rows: torch.Tensor) -> torch.Tensor:
    """A run's rows cut from the joint ones, where its own call would have had them: a slice that
    starts off the allocator's 64-byte alignment is copied (vectorised kernels may peel an unaligned
    start and round differently)."""
    return rows if rows.data_ptr() % 64 == 0 else rows.clone()
