"""FedSGD as in FedSel Algorithm 1, vectorised over each round's cohort.

Every epoch the training clients (one record each) are shuffled and partitioned into batches of
m ≈ batch_fraction·N; each batch is one round, so every client reports exactly once per epoch and
spends ε' = ε/E per report. In a round the whole cohort's gradients are one tensor op, the
mechanism privatises the [m, d] batch at once, and the server steps w ← w − α·mean(reports).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ldpbench.fl.models import LinearModel
from ldpbench.mechanisms.base import Accounting, Mechanism
from ldpbench.rng import ClientStreams, generator


@dataclass(frozen=True)
class TrainingConfig:
    learning_rate: float
    epochs: int = 1
    batch_fraction: float = 0.01
    l2: float = 1e-4
    eval_every: int = 10

    def cohort_size(self, clients: int) -> int:
        """m: clients per round (FedSel: m = 0.01·N)."""
        return max(1, round(self.batch_fraction * clients))

    def rounds_per_epoch(self, clients: int) -> int:
        return max(1, clients // self.cohort_size(clients))


@dataclass
class RunResult:
    curve: list[dict[str, Any]]
    final: dict[str, Any]
    status: str  # "ok" or "diverged"
    accounting: Accounting
    reports_per_client: torch.Tensor = field(repr=False)


def _evaluate(model, weights, train_x, train_s, test_x, test_s) -> dict[str, float]:
    return {
        "train_loss": float(model.loss(weights, train_x, train_s)),
        "test_loss": float(model.loss(weights, test_x, test_s)),
        "test_accuracy": float(model.accuracy(weights, test_x, test_s)),
    }


def run_fedsgd(
    model: LinearModel,
    mechanism: Mechanism,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    config: TrainingConfig,
    seed: int,
) -> RunResult:
    """Train from w = 0 and return the evaluation curve, final metrics and the privacy ledger.

    Labels are {0, 1}; randomness is keyed by (seed, epoch or round, purpose).
    """
    clients, dims = train_x.shape
    train_s = train_y.to(train_x.dtype) * 2 - 1
    test_s = test_y.to(test_x.dtype) * 2 - 1
    weights = torch.zeros(dims, dtype=train_x.dtype)
    state = mechanism.initial_state(clients, train_x.dtype)
    reports = torch.zeros(clients, dtype=torch.int64)
    rounds_per_epoch = config.rounds_per_epoch(clients)
    total_rounds = rounds_per_epoch * config.epochs

    started = time.perf_counter()
    curve = [{"round": 0, "epoch": 0, **_evaluate(model, weights, train_x, train_s, test_x, test_s)}]
    status = "ok"
    round_index = 0
    for epoch in range(config.epochs):
        order = torch.randperm(clients, generator=generator(seed, epoch, "cohorts"))
        for cohort in torch.tensor_split(order, rounds_per_epoch):
            round_index += 1
            gradients = model.per_example_gradients(weights, train_x[cohort], train_s[cohort])
            privatized = mechanism.privatize(
                gradients, ClientStreams((seed, round_index, "mechanism"), cohort),
                None if state is None else state[cohort],
            )
            if state is not None:
                state[cohort] = privatized.state
            reports[cohort] += 1
            weights = weights - config.learning_rate * privatized.reports.mean(dim=0)
            if round_index % config.eval_every == 0 or round_index == total_rounds:
                metrics = _evaluate(model, weights, train_x, train_s, test_x, test_s)
                curve.append({"round": round_index, "epoch": epoch + 1, **metrics})
                if not all(math.isfinite(v) for v in metrics.values()):
                    status = "diverged"
                    break
        if status != "ok":
            break

    final = dict(curve[-1])
    final["rounds"] = round_index
    final["rounds_planned"] = total_rounds
    final["train_seconds"] = time.perf_counter() - started
    return RunResult(curve, final, status, mechanism.accounting(), reports)
