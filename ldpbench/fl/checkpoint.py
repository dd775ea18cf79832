"""Resumable runs: the checkpoint file and the hook that saves it every K rounds and resumes from it.

With `checkpoint_every = K`, the weights, the per-client state, the report counts and the curve are
written atomically every K rounds; a restarted run continues from the last checkpoint and, since no
random state is carried, ends with exactly the numbers of an uninterrupted run. A checkpoint that
cannot be loaded, or was written by another run, is set aside as <name>.corrupt-<time> (named in the
log) and the run starts from round 0 instead of failing on every rerun.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ldpbench.atomic import atomic_path
from ldpbench.fl.client_state import ClientStateStore, spill_path
from ldpbench.fl.hooks import Hook, LoopState

log = logging.getLogger("ldpbench")


@dataclass(frozen=True)
class ResumePoint:
    """A validated checkpoint: the loop's state after `round`."""

    round: int
    weights: torch.Tensor
    reports_per_client: torch.Tensor
    curve: list[dict[str, Any]]
    client_state: torch.Tensor | None


@dataclass(frozen=True)
class Checkpoint:
    """One run's checkpoint file; `identity` is what a checkpoint must have been written by (the run's
    seed, shape, mechanism and training), the rest the shapes a resumable payload has."""

    path: Path
    identity: dict[str, Any]
    rounds: int
    dims: int
    clients: int
    client_state_shape: tuple[int, int] | None

    def save(self, round_index: int, weights: torch.Tensor, reports_per_client: torch.Tensor,
             curve: list[dict[str, Any]], client_state: torch.Tensor | None) -> None:
        payload = {"round": round_index, "weights": weights.cpu(), "reports": reports_per_client.cpu(),
                   "curve": curve, "state": client_state, "identity": self.identity}
        with atomic_path(self.path) as tmp:
            torch.save(payload, tmp)

    def load(self) -> ResumePoint | None:
        """The checkpoint to resume from, or None (none there, or set aside as unusable)."""
        if not self.path.exists():
            return None
        try:
            payload = torch.load(self.path, weights_only=True)
        except OSError:
            raise
        except Exception as error:  # torch.load raises many types for a torn or foreign file
            self.set_aside(f"it cannot be loaded ({type(error).__name__}: {str(error)[:200]})")
            return None
        problem = self.problem(payload)
        if problem is not None:
            self.set_aside(problem)
            return None
        return ResumePoint(payload["round"], payload["weights"], payload["reports"], payload["curve"],
                           payload.get("state"))

    def problem(self, payload: Any) -> str | None:
        """Why `payload` cannot be resumed by this run, or None when it can."""
        if not isinstance(payload, dict):
            return f"it holds a {type(payload).__name__}, not a checkpoint"
        if payload.get("identity") != self.identity:
            return f"it was written by another run ({payload.get('identity')!r})"
        round_index, weights, reports, curve = (payload.get(key)
                                                for key in ("round", "weights", "reports", "curve"))
        if not isinstance(round_index, int) or not 0 < round_index < self.rounds:
            return f"its round {round_index!r} is not in 1..{self.rounds - 1}"
        if not isinstance(weights, torch.Tensor) or tuple(weights.shape) != (self.dims,):
            return f"its weights are not a vector of {self.dims} parameters"
        if not isinstance(reports, torch.Tensor) or tuple(reports.shape) != (self.clients,):
            return f"its report counts are not a vector of {self.clients} clients"
        if not isinstance(curve, list) or not curve or not all(isinstance(row, dict) for row in curve):
            return "its curve is not a list of rows"
        state = payload.get("state")
        if (None if state is None else tuple(getattr(state, "shape", ()))) != self.client_state_shape:
            return f"its client state does not have the shape {self.client_state_shape}"
        return None

    def set_aside(self, reason: str) -> None:
        """Rename an unusable checkpoint out of the way (kept for inspection) and say so in the log."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        os.replace(self.path, aside)
        log.warning("checkpoint '%s' cannot be resumed: %s; set aside as '%s', the run starts from round 0",
                    self.path, reason, aside)

    def remove(self) -> None:
        """Delete the checkpoint and the spilled client state of a finished run."""
        self.path.unlink(missing_ok=True)
        spill_path(self.path).unlink(missing_ok=True)


class Checkpointing(Hook):
    """Resumes from the checkpoint at start, saves it every `every` rounds (0: never) while the run
    goes on, and removes it when the run has finished."""

    def __init__(self, checkpoint: Checkpoint, every: int, client_state: ClientStateStore | None) -> None:
        self.checkpoint, self.every, self.client_state = checkpoint, every, client_state

    def on_start(self, state: LoopState) -> None:
        resumed = self.checkpoint.load()
        if resumed is None:
            return
        if self.client_state is not None:
            self.client_state.restore(resumed.client_state)
        state.weights = resumed.weights.to(state.weights.device, state.weights.dtype)
        state.reports_per_client, state.curve, state.round = resumed.reports_per_client, resumed.curve, resumed.round
        log.info("resumed from checkpoint %s at round %d of %d", self.checkpoint.path, resumed.round, state.rounds)

    def on_round_end(self, state: LoopState) -> None:
        # A diverged run stops after this round: nothing to resume.
        if (self.every and state.round % self.every == 0 and state.round < state.rounds
                and state.status == "ok"):
            snapshot = None if self.client_state is None else self.client_state.snapshot()
            self.checkpoint.save(state.round, state.weights, state.reports_per_client, state.curve, snapshot)

    def on_end(self, state: LoopState) -> None:
        self.checkpoint.remove()
