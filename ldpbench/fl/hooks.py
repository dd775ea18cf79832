"""The round loop's hooks: what happens around the rounds without editing the loop.

The loop calls every hook's `on_start` once (before the first round, after the start weights are
set), `on_round_end` after each round's server step, then stops when any hook's `should_stop` says
so, and calls `on_end` once a run has finished (not when it raised). Hooks run in the order given;
the built-in ones come first: evaluation (fills the curve), progress (the log line), divergence
stop, with `training.stop` the plateau stop, and, with a checkpoint file, checkpointing
(ldpbench.fl.checkpoint).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ldpbench.durations import duration
from ldpbench.fl.settings import StopSettings

log = logging.getLogger("ldpbench")


@dataclass
class LoopState:
    """Where the round loop stands. The loop writes the round's facts; hooks read them and may write
    what they own (the curve, this round's metrics, the status, a resume point)."""

    rounds: int  # rounds planned
    weights: torch.Tensor  # the server weights after `round`
    reports_per_client: torch.Tensor  # int64 [clients]: reports each client has sent so far
    started: float  # time.perf_counter() when the run started
    round: int = 0  # the last round done; 0 before the first (or the round a resumed run continues after)
    epoch: int = 0  # the epoch (from 1) of the round just done; 0 before the first round of this process
    finite: bool = True  # the weights after this round are all finite
    metrics: dict[str, float] | None = None  # this round's evaluation; None when it was not evaluated
    curve: list[dict[str, Any]] = field(default_factory=list)  # evaluated rounds, from round 0
    status: str = "ok"  # "ok" or "diverged"
    stopped_early: bool = False  # the plateau stop ended the run before its planned rounds


class Hook:
    """A concern attached to the round loop; every method does nothing unless overridden."""

    def on_start(self, state: LoopState) -> None:
        """Before the first round, after the start weights are set."""

    def on_round_end(self, state: LoopState) -> None:
        """After the server step of round `state.round`."""

    def should_stop(self, state: LoopState) -> bool:
        """Whether the loop ends after this round (asked of every hook after all `on_round_end`)."""
        return False

    def on_end(self, state: LoopState) -> None:
        """After the last round of a run that finished (stopped early or not)."""


class Evaluation(Hook):
    """Evaluates round 0, every `every` rounds, the last round and any round with non-finite weights."""

    def __init__(self, evaluate: Callable[[torch.Tensor], dict[str, float]], every: int) -> None:
        self.evaluate, self.every = evaluate, every

    def on_start(self, state: LoopState) -> None:
        state.curve.append({"round": 0, "epoch": 0, **self.evaluate(state.weights)})

    def on_round_end(self, state: LoopState) -> None:
        if not state.finite or state.round % self.every == 0 or state.round == state.rounds:
            state.metrics = self.evaluate(state.weights)
            state.curve.append({"round": state.round, "epoch": state.epoch, **state.metrics})


class Progress(Hook):
    """A line in the cell's log for every evaluated round, naming the run (a cell's log holds its seeds
    and folds) and the time its remaining rounds take at this process's pace so far: long runs (LeNet,
    MLP) take minutes."""

    def __init__(self, run: str = "") -> None:
        self.prefix = f"{run}: " if run else ""
        self.first_round: int | None = None  # the first round this process ran (after a resumed checkpoint)

    def on_round_end(self, state: LoopState) -> None:
        if self.first_round is None:
            self.first_round = state.round - 1
        if state.metrics is not None:
            elapsed = time.perf_counter() - state.started
            left = elapsed / (state.round - self.first_round) * (state.rounds - state.round)
            log.info("%sround %d of %d: test accuracy %.4f, train loss %.4g (%s, %s left)", self.prefix,
                     state.round, state.rounds, state.metrics["test_accuracy"], state.metrics["train_loss"],
                     duration(elapsed), duration(left))



class ForwardRounds(Hook):
    """Hands round 0 and every evaluated round's metrics to `send(round, metrics)` (live progress,
    ldpbench.results.live), leaving out the values a tracking store cannot hold (∞, NaN)."""

    def __init__(self, send: Callable[[int, dict[str, float]], None]) -> None:
        self.send = send

    def _send(self, step: int, point: dict[str, Any]) -> None:
        self.send(step, {key: float(value) for key, value in point.items()
                         if key not in ("round", "epoch") and math.isfinite(float(value))})

    def on_start(self, state: LoopState) -> None:
        if state.curve:  # round 0, or the last round a resumed run had evaluated
            self._send(state.curve[-1]["round"], state.curve[-1])

    def on_round_end(self, state: LoopState) -> None:
        if state.metrics is not None:
            self._send(state.round, state.metrics)


class DivergenceStop(Hook):
    """Stops a run whose weights or evaluated `watched` metrics are no longer finite (the losses and
    accuracies of the sets that have records; AUC may be NaN legitimately)."""

    def __init__(self, watched: Sequence[str]) -> None:
        self.watched = tuple(watched)

    def on_round_end(self, state: LoopState) -> None:
        metrics = state.metrics or {}
        if not state.finite or not all(math.isfinite(metrics[key]) for key in self.watched if key in metrics):
            state.status = "diverged"

    def should_stop(self, state: LoopState) -> bool:
        return state.status == "diverged"


def plateau_reached(values: list[float], patience: int, min_delta: float, minimise: bool) -> bool:
    """Whether the last `patience` values brought no improvement of more than min_delta over the
    best value before them (NaN never improves)."""
    best, since = math.nan, 0
    for value in values:
        improved = math.isnan(best) and not math.isnan(value) or (
            value < best - min_delta if minimise else value > best + min_delta)
        if improved:
            best, since = value, 0
        else:
            since += 1
    return since >= patience


class PlateauStop(Hook):
    """Early stopping on a validation plateau (`training.stop`), decided from the evaluated curve alone:
    a run resumed from a checkpoint (which restores the curve) stops exactly where an uninterrupted
    one does, and one whose checkpoint already reached the plateau stops before another round."""

    def __init__(self, stop: StopSettings) -> None:
        self.stop = stop
        self.minimise = stop.metric.endswith("_loss")

    def _check(self, state: LoopState) -> None:
        values = [float(point[self.stop.metric]) for point in state.curve]
        state.stopped_early = state.round < state.rounds and plateau_reached(
            values, self.stop.patience, self.stop.min_delta, self.minimise)

    def on_start(self, state: LoopState) -> None:
        self._check(state)

    def on_round_end(self, state: LoopState) -> None:
        if state.metrics is not None:
            self._check(state)

    def should_stop(self, state: LoopState) -> bool:
        return state.stopped_early
