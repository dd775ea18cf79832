"""The round loop's hooks: what happens around the rounds without editing the loop.

The loop calls every hook's `on_start` once (before the first round, after the start weights are
set), `on_round_end` after each round's server step, then stops when any hook's `should_stop` says
so, and calls `on_end` once a run has finished (not when it raised). Hooks run in the order given;
the built-in ones come first: evaluation (fills the curve), progress (the log line), divergence
stop, and, with a checkpoint file, checkpointing (ldpbench.fl.checkpoint).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

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
    """A line in the cell's log for every evaluated round: long runs (LeNet, MLP) take minutes."""

    def on_round_end(self, state: LoopState) -> None:
        if state.metrics is not None:
            log.info("round %d of %d: test accuracy %.4f, train loss %.4g (%.0f s)", state.round, state.rounds,
                     state.metrics["test_accuracy"], state.metrics["train_loss"],
                     time.perf_counter() - state.started)


class DivergenceStop(Hook):
    """Stops a run whose weights or evaluated losses are no longer finite (AUC may be NaN legitimately)."""

    def on_round_end(self, state: LoopState) -> None:
        metrics = state.metrics or {}
        if not state.finite or not all(math.isfinite(v) for k, v in metrics.items() if k != "test_auc"):
            state.status = "diverged"

    def should_stop(self, state: LoopState) -> bool:
        return state.status == "diverged"
