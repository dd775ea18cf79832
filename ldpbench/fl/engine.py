"""The federated engine: whole-cohort FedSGD and FedAvg with torch.func, chunked, resumable.

A round: the sampler picks the cohort; each client's update is computed — FedSGD: the gradient of
its records' mean loss; FedAvg: the model delta after E local epochs of minibatch SGD — for a chunk
of clients at once with `vmap(grad(...))` over `functional_call`; the mechanism privatises the chunk's
updates; the reports of the whole cohort are gathered in cohort order and `mechanism.aggregate`
turns them into the server's step (FedSGD: w ← w − η·g; FedAvg: w ← w + η·Δ).

Determinism. Every random draw is keyed by (seed, round, client, purpose) (`ClientStreams`), so a
client's draws — its local shuffles and its mechanism noise — and its report given its update are
the same whatever chunk or shard it is computed in (the mechanism contract suite checks chunks of 1,
7 and all bit for bit). Records are processed in fixed blocks of `block_records`, and the cohort's
reports are reduced once, in cohort order. What is not bit-invariant is the network arithmetic
itself: BLAS/oneDNN kernels round the last bits of a product differently for different batch
shapes, so changing `chunk_clients` moves results at float rounding level (tested to agree within
1e-4 relative). `chunk_clients` is therefore part of the run
plan, and a given plan gives bit-identical numbers in any process, cell, shard, and after a resume. On
CPU the engine computes with one intra-op thread (results would otherwise depend on the thread count;
campaigns parallelise across runs instead); on CUDA runs repeat for a fixed configuration but are not
bit-identical to CPU.

Resume. With `checkpoint_every = K`, the weights, the per-client state, the privacy ledger and the
curve are written atomically every K rounds; a restarted run continues from the last checkpoint and,
since no random state is carried, ends with exactly the numbers of an uninterrupted run. A checkpoint
that cannot be loaded, or was written by another run, is set aside as <name>.corrupt-<time> (named in
the log) and the run starts from round 0 instead of failing on every rerun.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import rankdata
from torch.func import functional_call, grad, vmap

from ldpbench.atomic import atomic_path
from ldpbench.errors import ConfigError
from ldpbench.fl.clients import Partition, cohorts
from ldpbench.fl.networks import Network, create_network
from ldpbench.fl.settings import TrainingSettings
from ldpbench.mechanisms.base import Mechanism
from ldpbench.rng import ClientStreams, derive_seed, generator

log = logging.getLogger("ldpbench")

LINEAR_NETWORKS = ("lr", "svm", "softmax")


def build_network(name: str, input_shape: tuple[int, ...], classes: int, seed: int,
                  params: dict[str, Any] | None = None) -> Network:
    """The network with its initial parameters drawn from a generator keyed by the run seed only."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "init"))
        return create_network(name, tuple(input_shape), classes, **(params or {}))


@dataclass
class RunResult:
    curve: list[dict[str, Any]]
    final: dict[str, Any]
    status: str  # "ok" or "diverged"
    # Rounds each client took part in [clients] (one report each to an update mechanism); the runner's
    # privacy stage turns them into its ledger and gives the accounting.
    reports_per_client: torch.Tensor = field(repr=False)


@dataclass(frozen=True)
class ClientData:
    """Training records, their labels and their partition into clients (features may be uint8 images)."""

    features: torch.Tensor
    labels: torch.Tensor
    partition: Partition


# ---------------------------------------------------------------------------- flat parameters
class FlatModel:
    """A network seen as a function of one flat parameter vector (what mechanisms privatise)."""

    def __init__(self, network: Network) -> None:
        self.network = network
        named = list(network.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.dims = sum(self.sizes)

    def initial(self, zero: bool) -> torch.Tensor:
        flat = torch.cat([p.detach().reshape(-1) for p in self.network.parameters()])
        return torch.zeros_like(flat) if zero else flat.clone()

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: part.view(shape) for name, part, shape in
                zip(self.names, flat.split(self.sizes), self.shapes)}

    def outputs(self, flat: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(self.network, self.unflatten(flat), (inputs,))

    def summed_loss(self, flat, inputs, targets, mask):
        """Sum of the per-example losses over the unmasked examples of one unit."""
        losses = self.network.per_example_loss(self.outputs(flat, inputs), targets)
        return (losses * mask).sum()


def _as_inputs(features: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 pixels → [0, 1]; token ids stay integers; everything else to the working dtype."""
    if features.dtype == torch.uint8:
        return features.to(dtype) / 255.0
    if not features.is_floating_point():
        return features
    return features.to(dtype)


# ---------------------------------------------------------------------------- per-client state
class ClientStateStore:
    """The mechanism's per-client vectors (N × d): in memory, or memory-mapped on disk when large."""

    def __init__(self, clients: int, dims: int, dtype: torch.dtype, memory_limit_bytes: int,
                 spill_path: Path | None) -> None:
        self.dtype = dtype
        numpy_dtype = np.float64 if dtype == torch.float64 else np.float32
        size = clients * dims * np.dtype(numpy_dtype).itemsize
        if size > memory_limit_bytes:
            if spill_path is None:
                raise ConfigError(f"the client state needs {size / 2**20:.0f} MiB, above the memory limit; "
                                  "give the run a checkpoint directory to spill it to disk")
            spill_path.parent.mkdir(parents=True, exist_ok=True)
            self.array = np.lib.format.open_memmap(spill_path, mode="w+", dtype=numpy_dtype,
                                                   shape=(clients, dims))
            self.memory = None
        else:
            self.array, self.memory = None, torch.zeros(clients, dims, dtype=dtype)

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        if self.memory is not None:
            return self.memory[ids]
        return torch.from_numpy(np.ascontiguousarray(self.array[ids.numpy()]))

    def write(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        if self.memory is not None:
            self.memory[ids] = values
        else:
            self.array[ids.numpy()] = values.cpu().numpy()

    def snapshot(self) -> torch.Tensor:
        return self.memory.clone() if self.memory is not None else torch.from_numpy(np.array(self.array))

    def restore(self, values: torch.Tensor) -> None:
        if self.memory is not None:
            self.memory.copy_(values)
        else:
            self.array[:] = values.numpy()


# ---------------------------------------------------------------------------- the engine
class FederatedTrainer:
    def __init__(self, network: Network, mechanism: Mechanism | None, data: ClientData, test_features,
                 test_labels, config: TrainingSettings, seed: int, dtype: torch.dtype = torch.float32,
                 checkpoint_path: Path | None = None, state_memory_limit_bytes: int = 2**30) -> None:
        self.config, self.seed, self.dtype = config, seed, dtype
        self.device = config.resolved_device()
        self.model = FlatModel(network.to(self.device))
        self.mechanism = mechanism
        self.partition = data.partition
        self.features = data.features.to(self.device)
        self.labels = data.labels.to(self.device)
        self.test_features = test_features.to(self.device)
        self.test_labels = test_labels.to(self.device)
        self.offsets = torch.from_numpy(self.partition.offsets).to(self.device)
        self.records = torch.from_numpy(self.partition.records).to(self.device)
        self.checkpoint_path = checkpoint_path
        self.corrects = mechanism is not None and type(mechanism).correct is not Mechanism.correct
        clients = self.partition.clients
        self.cohort_size = config.cohort(clients)
        self.rounds = config.total_rounds(clients)
        self.state = None
        if mechanism is not None and mechanism.stateful:
            spill = None if checkpoint_path is None else checkpoint_path.with_suffix(".state.npy")
            self.state = ClientStateStore(clients, mechanism.state_dims, dtype, state_memory_limit_bytes, spill)
        sample = torch.randperm(len(self.labels), generator=generator(seed, "train-loss sample"))
        self.train_sample = sample[: config.eval_train_records].sort().values.to(self.device)
        max_records = int(self.partition.sizes.max())
        self.block = max(1, min(config.block_records, max_records))

    # -- per-client updates -------------------------------------------------------------
    def _shuffled_positions(self, ids: torch.Tensor, sizes: torch.Tensor, longest: int, key) -> torch.Tensor:
        """Each client's own random order of its record positions 0..size-1, [clients, longest].

        A client's k-th sort key depends only on (key, client, k), so its order ignores the padding
        and the chunk it is computed in; padded columns sort last.
        """
        streams = ClientStreams(key, ids)
        valid = torch.arange(longest, device=self.device).unsqueeze(0) < sizes.unsqueeze(1)
        keys = torch.where(valid, streams.rand((len(ids), longest), torch.float64), 2.0)
        return torch.argsort(keys, dim=1, stable=True)

    def _fedsgd_units(self, ids: torch.Tensor, round_index: int):
        """The vmapped units of a FedSGD round: (record ids, mask, unit's client, records per client).

        Whole clients are cut into fixed blocks of `block_records`; with `client_batch_size` R each
        client is one unit holding a fresh uniform sample of min(R, size) of its records.
        """
        starts, ends = self.offsets[ids], self.offsets[ids + 1]
        sizes = ends - starts
        batch = self.config.client_batch_size
        if batch:
            longest = int(sizes.max())
            order = self._shuffled_positions(ids, sizes, longest, (self.seed, round_index, "client batch"))
            columns = torch.arange(batch, device=self.device).clamp(max=longest - 1)
            mask = torch.arange(batch, device=self.device).unsqueeze(0) < sizes.unsqueeze(1)
            record_ids = self.records[starts.unsqueeze(1) + torch.where(mask, order[:, columns], 0)]
            return record_ids, mask, torch.arange(len(ids), device=self.device), sizes.clamp(max=batch)
        blocks = (sizes + self.block - 1) // self.block
        unit_client = torch.repeat_interleave(torch.arange(len(ids), device=self.device), blocks)
        first_block = torch.cumsum(blocks, 0) - blocks
        unit_offset = (torch.arange(len(unit_client), device=self.device) - first_block[unit_client]) * self.block
        positions = starts[unit_client, None] + unit_offset[:, None] + torch.arange(self.block, device=self.device)
        mask = positions < ends[unit_client, None]
        record_ids = self.records[torch.where(mask, positions, starts[unit_client, None])]
        return record_ids, mask, unit_client, sizes

    def _fedsgd_updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """Each client's gradient of its mean loss (+ l2·w), [clients, d]."""
        record_ids, mask, unit_client, counts = self._fedsgd_units(ids, round_index)
        inputs = _as_inputs(self.features[record_ids], self.dtype)
        targets = self.labels[record_ids]
        # The server weights are shared by every unit (in_dims None): vmap folds the units into
        # large matrix products instead of one small product per unit.
        unit_grads = vmap(grad(self.model.summed_loss), in_dims=(None, 0, 0, 0))(
            weights, inputs, targets, mask.to(self.dtype))
        sums = torch.zeros(len(ids), weights.numel(), dtype=self.dtype, device=self.device)
        sums.index_add_(0, unit_client, unit_grads)
        means = sums / counts.to(self.dtype).unsqueeze(1)
        return means + self.config.l2 * weights if self.config.l2 else means

    def _fedavg_updates(self, weights: torch.Tensor, ids: torch.Tensor, round_index: int) -> torch.Tensor:
        """Each client's model delta after local_epochs of minibatch SGD on its records, [clients, d]."""
        config = self.config
        starts, sizes = self.offsets[ids], self.offsets[ids + 1] - self.offsets[ids]
        batch, longest = config.local_batch_size, int(sizes.max())
        steps = (longest + batch - 1) // batch
        local = weights.expand(len(ids), -1).clone()

        def step_loss(flat, inputs, targets, mask):
            count = mask.sum().clamp_min(1.0)
            loss = self.model.summed_loss(flat, inputs, targets, mask) / count
            return loss + 0.5 * config.l2 * flat.dot(flat) if config.l2 else loss

        step_grad = vmap(grad(step_loss))
        for local_epoch in range(config.local_epochs):
            order = self._shuffled_positions(ids, sizes, longest,
                                             (self.seed, round_index, "local shuffle", local_epoch))
            for step in range(steps):
                cols = torch.arange(step * batch, (step + 1) * batch, device=self.device).clamp_(max=longest - 1)
                mask = (step * batch + torch.arange(batch, device=self.device)).unsqueeze(0) < sizes.unsqueeze(1)
                record_ids = self.records[starts.unsqueeze(1) + torch.where(mask, order[:, cols], 0)]
                inputs = _as_inputs(self.features[record_ids], self.dtype)
                gradients = step_grad(local, inputs, self.labels[record_ids], mask.to(self.dtype))
                # In place: local is [clients, d], and every temporary of that size is a full pass
                # over memory (for a 2.8M-parameter MLP these passes cost as much as the gradients).
                gradients.mul_(config.local_learning_rate)
                active = mask.any(dim=1, keepdim=True)
                if not bool(active.all()):  # clients whose records ran out take no step
                    gradients = torch.where(active, gradients, 0.0)
                local.sub_(gradients)
        return local - weights

    # -- evaluation -----------------------------------------------------------------------
    @torch.no_grad()
    def _predict(self, weights, features, batch: int = 4096):
        outputs = [self.model.outputs(weights, _as_inputs(features[i:i + batch], self.dtype))
                   for i in range(0, len(features), batch)]
        return torch.cat(outputs) if outputs else torch.empty(0)

    @torch.no_grad()
    def evaluate(self, weights: torch.Tensor) -> dict[str, float]:
        network = self.model.network
        outputs = self._predict(weights, self.test_features)
        train_outputs = self._predict(weights, self.features[self.train_sample])
        penalty = 0.5 * self.config.l2 * float(weights.dot(weights))
        return {
            "train_loss": float(network.per_example_loss(train_outputs, self.labels[self.train_sample]).mean())
                          + penalty,
            "test_loss": float(network.per_example_loss(outputs, self.test_labels).mean()) + penalty,
            "test_accuracy": float((network.predict(outputs) == self.test_labels).to(torch.float64).mean()),
            "test_auc": area_under_curve(network.scores(outputs), self.test_labels, network.task),
        }

    # -- checkpoints -----------------------------------------------------------------------
    def _checkpoint_identity(self) -> dict[str, Any]:
        """What a checkpoint must have been written by: this run's seed, shape, mechanism and training."""
        return {"seed": self.seed, "rounds": self.rounds, "clients": self.partition.clients,
                "dims": self.model.dims, "mechanism": None if self.mechanism is None else self.mechanism.name,
                "epsilon": None if self.mechanism is None else float(self.mechanism.epsilon),
                "training": repr(self.config)}

    def _save_checkpoint(self, round_index, weights, reports, curve) -> None:
        payload = {"round": round_index, "weights": weights.cpu(), "reports": reports.cpu(), "curve": curve,
                   "state": None if self.state is None else self.state.snapshot(),
                   "identity": self._checkpoint_identity()}
        with atomic_path(self.checkpoint_path) as tmp:
            torch.save(payload, tmp)

    def _checkpoint_problem(self, payload: Any) -> str | None:
        """Why `payload` cannot be resumed by this run, or None when it can."""
        if not isinstance(payload, dict):
            return f"it holds a {type(payload).__name__}, not a checkpoint"
        if payload.get("identity") != self._checkpoint_identity():
            return f"it was written by another run ({payload.get('identity')!r})"
        round_index, weights, reports, curve = (payload.get(key)
                                                for key in ("round", "weights", "reports", "curve"))
        if not isinstance(round_index, int) or not 0 < round_index < self.rounds:
            return f"its round {round_index!r} is not in 1..{self.rounds - 1}"
        if not isinstance(weights, torch.Tensor) or tuple(weights.shape) != (self.model.dims,):
            return f"its weights are not a vector of {self.model.dims} parameters"
        if not isinstance(reports, torch.Tensor) or tuple(reports.shape) != (self.partition.clients,):
            return f"its report counts are not a vector of {self.partition.clients} clients"
        if not isinstance(curve, list) or not curve or not all(isinstance(row, dict) for row in curve):
            return "its curve is not a list of rows"
        state = payload.get("state")
        expected = None if self.state is None else (self.partition.clients, self.mechanism.state_dims)
        if (None if state is None else tuple(getattr(state, "shape", ()))) != expected:
            return f"its client state does not have the shape {expected}"
        return None

    def _set_aside(self, reason: str) -> None:
        """Rename an unusable checkpoint out of the way (kept for inspection) and say so in the log."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = self.checkpoint_path.with_name(f"{self.checkpoint_path.name}.corrupt-{stamp}")
        os.replace(self.checkpoint_path, aside)
        log.warning("checkpoint '%s' cannot be resumed: %s; set aside as '%s', the run starts from round 0",
                    self.checkpoint_path, reason, aside)

    def _load_checkpoint(self):
        if self.checkpoint_path is None or not self.checkpoint_path.exists():
            return None
        try:
            payload = torch.load(self.checkpoint_path, weights_only=True)
        except OSError:
            raise
        except Exception as error:  # torch.load raises many types for a torn or foreign file
            self._set_aside(f"it cannot be loaded ({type(error).__name__}: {str(error)[:200]})")
            return None
        problem = self._checkpoint_problem(payload)
        if problem is not None:
            self._set_aside(problem)
            return None
        if self.state is not None:
            self.state.restore(payload["state"])
        return payload

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> RunResult:
        threads = torch.get_num_threads()
        if self.device.type == "cpu":
            torch.set_num_threads(1)
        try:
            return self._run()
        finally:
            torch.set_num_threads(threads)

    def _initial_weights(self) -> torch.Tensor:
        # Linear models start at w = 0 as in FedSel; deeper networks from their seeded init
        # (see build_network).
        linear = self.model.network.name in LINEAR_NETWORKS
        return self.model.initial(zero=linear).to(self.device, self.dtype)

    def _run(self) -> RunResult:
        started = time.perf_counter()
        clients = self.partition.clients
        updates_of = self._fedsgd_updates if self.config.algorithm == "fedsgd" else self._fedavg_updates
        weights = self._initial_weights()
        reports_per_client = torch.zeros(clients, dtype=torch.int64)
        curve = [{"round": 0, "epoch": 0, **self.evaluate(weights)}]
        first_round = 1
        resumed = self._load_checkpoint()
        if resumed is not None:
            weights = resumed["weights"].to(self.device, self.dtype)
            reports_per_client, curve = resumed["reports"], resumed["curve"]
            first_round = resumed["round"] + 1
            log.info("resumed from checkpoint %s at round %d of %d", self.checkpoint_path,
                     resumed["round"], self.rounds)
        status = "ok"
        last_round = first_round - 1
        for round_index, epoch, cohort in cohorts(self.config.sampler, clients, self.cohort_size,
                                                  self.rounds, self.seed):
            if round_index < first_round:
                continue
            cohort = cohort.to(self.device)
            rows, cohort_updates = [], []
            for ids in cohort.split(self.config.chunk_clients or len(cohort)):
                updates = updates_of(weights, ids, round_index)
                if self.corrects:
                    cohort_updates.append(updates)
                if self.mechanism is None:  # the updates are sent as they are
                    rows.append(updates)
                    continue
                state = None if self.state is None else self.state.read(ids.cpu()).to(self.device)
                privatized = self.mechanism.privatize(
                    updates, ClientStreams((self.seed, round_index, "mechanism"), ids), state)
                if self.state is not None:
                    self.state.write(ids.cpu(), privatized.state)
                rows.append(privatized.reports)
            # Without an update mechanism the server takes the updates' mean, as `np` does.
            step = torch.cat(rows).mean(dim=0) if self.mechanism is None else self.mechanism.aggregate(torch.cat(rows))
            if self.corrects:
                # Per-worker post-processing of the released estimate with each worker's own update
                # (DiffSketch's error correction); with one global model the corrected estimates are
                # averaged over the cohort.
                step = self.mechanism.correct(step, torch.cat(cohort_updates)).mean(dim=0)
            reports_per_client[cohort.cpu()] += 1
            sign = -1.0 if self.config.algorithm == "fedsgd" else 1.0
            weights = weights + sign * self.config.learning_rate * step
            last_round = round_index
            finite = bool(torch.isfinite(weights).all())
            if not finite or round_index % self.config.eval_every == 0 or round_index == self.rounds:
                metrics = self.evaluate(weights)
                curve.append({"round": round_index, "epoch": epoch + 1, **metrics})
                # Progress in the cell's log: long runs (LeNet, MLP) take minutes.
                log.info("round %d of %d: test accuracy %.4f, train loss %.4g (%.0f s)", round_index,
                         self.rounds, metrics["test_accuracy"], metrics["train_loss"],
                         time.perf_counter() - started)
                if not finite or not all(math.isfinite(v) for k, v in metrics.items() if k != "test_auc"):
                    status = "diverged"
                    break
            if (self.checkpoint_path is not None and self.config.checkpoint_every
                    and round_index % self.config.checkpoint_every == 0 and round_index < self.rounds):
                self._save_checkpoint(round_index, weights, reports_per_client, curve)
        self.weights = weights.cpu()
        final = dict(curve[-1])
        final.update(rounds=last_round, rounds_planned=self.rounds,
                     train_seconds=time.perf_counter() - started)
        if self.checkpoint_path is not None:
            self.checkpoint_path.unlink(missing_ok=True)
            self.checkpoint_path.with_suffix(".state.npy").unlink(missing_ok=True)
        return RunResult(curve, final, status, reports_per_client)


def area_under_curve(scores: torch.Tensor, labels: torch.Tensor, task: str) -> float:
    """ROC AUC (ties count one half): binary, or the macro one-vs-rest mean over the classes present."""
    scores, labels = scores.double().cpu().numpy(), labels.cpu().numpy()
    if not np.isfinite(scores).all():
        return float("nan")

    def binary(score, positive) -> float:
        positives = int(positive.sum())
        negatives = len(positive) - positives
        if positives == 0 or negatives == 0:
            return float("nan")
        ranks = rankdata(score)
        return float((ranks[positive].sum() - positives * (positives + 1) / 2) / (positives * negatives))

    if task == "binary":
        return binary(scores, labels == 1)
    present = [c for c in np.unique(labels) if 0 < (labels == c).sum() < len(labels)]
    values = [binary(scores[:, c], labels == c) for c in present]
    return float(np.mean(values)) if values else float("nan")
