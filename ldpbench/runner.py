"""Execute one run plan: load the prepared data, split, train, write the run's Parquet files.

curve.parquet (per-round metrics), ledger.parquet (per-client privacy ledger) and, last,
summary.parquet (one row), each written atomically.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import glob
import json
import logging
import math
import os
import secrets
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

import ldpbench
from ldpbench import mechanisms
from ldpbench.atomic import write_json, write_parquet
from ldpbench.data.prepared import load_arrays, recorded_digests
from ldpbench.data.split import run_indices, split_digest
from ldpbench.errors import ConfigError
from ldpbench.fl import clients
from ldpbench.fl.engine import (
    ClientData,
    FederatedTrainer,
    RunResult,
    can_train_together,
    together_limit,
    train_together,
)
from ldpbench.fl.hooks import ForwardRounds, Hook
from ldpbench.fl.model import FlatModel, build_network, take_rows
from ldpbench.launch import processes
from ldpbench.layout import (
    ATTEMPT_FILE,
    CURVE_FILE,
    FINAL,
    LEDGER_FILE,
    PHASES,
    RUN_FILES,
    SUMMARIES,
    SUMMARY_FILE,
    attempt_dir,
    attempt_prefix,
    attempts_dir,
    checkpoint_file,
    run_dir,
    run_file,
    staged_run_dir,
)
from ldpbench.mechanisms.base import Accounting, RegisteredMechanism
from ldpbench.plan import RunPlan
from ldpbench.results.live import LiveRun, LiveTarget
from ldpbench.results.mlflow_common import param_text
from ldpbench.results.schema import CURVE_SCHEMA, LEDGER_SCHEMA, SUMMARY_SCHEMA
from ldpbench.rng import ClientStreams

log = logging.getLogger("ldpbench")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class LoadedDataset:
    features: torch.Tensor  # [n, ...]
    labels: torch.Tensor  # [n] int64
    meta: dict
    natural_clients: np.ndarray | None = None  # the dataset's own user ids, when it has them


def load(prepared_dir: str | Path) -> LoadedDataset:
    """A prepared dataset or feature cache, in memory as tensors (images stay uint8)."""
    arrays = load_arrays(prepared_dir, mmap=False)
    if arrays.features.dtype.kind == "S":
        raise ConfigError(f"'{prepared_dir}' holds raw text; runs need numbers: set the dataset's "
                          "`features:` to an encoder (e.g. minilm) in the campaign config")
    if arrays.labels.ndim != 1:
        raise ConfigError(f"'{prepared_dir}' has multi-label targets {arrays.labels.shape}; the engine "
                          "trains single-label classifiers (use a single-label variant, e.g. celeba-smiling)")
    return LoadedDataset(torch.from_numpy(np.ascontiguousarray(arrays.features)),
                         torch.from_numpy(np.ascontiguousarray(arrays.labels)).to(torch.int64),
                         arrays.meta, arrays.clients)


@dataclass(frozen=True)
class TrainedRun:
    """What training one plan gives: the engine's result and the privacy stage's ledger and accounting."""

    result: RunResult
    accounting: Accounting  # the cost of one report
    reports_per_client: torch.Tensor  # [clients] the ledger's reports
    sizes: dict[str, Any]  # the split's sizes, digests and facts (summary columns)
    client_ids: np.ndarray


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: its trainer, and what the privacy stage needs once it has trained."""

    trainer: FederatedTrainer
    privacy: RegisteredMechanism
    sizes: dict[str, Any]  # the split's sizes, digests and facts (summary columns)

    def finish(self, result: RunResult) -> TrainedRun:
        """The trained run: the engine's `result` with the privacy stage's ledger and accounting."""
        return TrainedRun(result, self.privacy.accounting(), self.privacy.reports_per_client(result.reports_per_client),
                          self.sizes, np.arange(self.sizes["clients"]))


def train(plan: RunPlan, data: LoadedDataset | str | Path, checkpoint_path: Path | None = None,
          label: str | None = None, hooks: Sequence[Hook] = ()) -> TrainedRun:
    """Train one run plan: split, partition, release the records and/or privatise the rounds, train.
    `label` (the configuration's, from the campaign) names the run in its log lines; `hooks` go
    into the round loop after the built-in ones."""
    prepared = prepare(plan, data, checkpoint_path, label, hooks)
    return prepared.finish(prepared.trainer.run())


def prepare(plan: RunPlan, data: LoadedDataset | str | Path, checkpoint_path: Path | None = None,
            label: str | None = None, hooks: Sequence[Hook] = ()) -> PreparedRun:
    """Everything of `train` before the rounds: split, partition, release, the trainer."""
    if not isinstance(data, LoadedDataset):
        data = load(data)
    x, y, meta = data.features, data.labels, data.meta
    train_idx, test_idx = run_indices(len(y), plan.seed, plan.folds, plan.fold, plan.test_fraction,
                                      plan.public_fraction, plan.data_part)
    settings = plan.training
    classes = len(meta["classes"])
    partition = clients.partition(
        settings.partition.scheme, take_rows(y, train_idx).numpy(), plan.seed, settings.partition.clients,
        settings.partition.alpha, None if data.natural_clients is None else data.natural_clients[train_idx])
    validation_idx = train_idx[:0]
    if settings.validation_fraction > 0:
        # Whole clients of the training split; the test split is never touched.
        held_out = clients.hold_out_clients(partition, settings.validation_fraction, plan.seed)
        partition, validation_idx = held_out.partition, train_idx[held_out.validation_records]
        train_idx = train_idx[held_out.training_records]
    network = build_network(plan.model, tuple(x.shape[1:]), classes, plan.seed, plan.network_params)
    dims = FlatModel(network).dims
    privacy = mechanisms.create(
        plan.mechanism, plan.epsilon_per_report(partition.clients),
        mechanisms.get(plan.mechanism).input_dims(dims, int(np.prod(x.shape[1:]))), plan.mechanism_params,
        cohort_size=settings.cohort(partition.clients), classes=classes,
    )
    stages = privacy.stages()
    if stages.release is None:
        # The training split is read in place, through its rows (no copy of it for every run).
        client_data = ClientData(x, y, partition, rows=torch.as_tensor(train_idx))
    else:
        # The client data set is released once; training on it is post-processing (no noise).
        released = stages.release.release(take_rows(x, train_idx), take_rows(y, train_idx),
                                          ClientStreams((plan.seed, "data release"), len(train_idx)))
        client_data = ClientData(*released, partition)
    validation = None if settings.validation_fraction == 0 else (take_rows(x, validation_idx),
                                                                  take_rows(y, validation_idx))
    trainer = FederatedTrainer(network, stages.updates, client_data,
                               take_rows(x, test_idx), take_rows(y, test_idx), settings, plan.seed,
                               checkpoint_path=checkpoint_path, validation=validation,
                               run_name=run_name(plan, label), hooks=hooks)
    data_digests = recorded_digests(meta)
    sizes = {"clients": partition.clients, "records": len(train_idx), "test_records": len(test_idx),
             "validation_records": len(validation_idx), "dims": dims, "classes": classes,
             "test_majority_accuracy": majority_accuracy(take_rows(y, train_idx), take_rows(y, test_idx), classes),
             # Which records each split holds (MLflow's dataset inputs of the run, by context).
             **{f"{split}_digest": split_digest(data_digests, indices)
                for split, indices in (("training", train_idx), ("validation", validation_idx), ("test", test_idx))}}
    return PreparedRun(trainer, privacy, sizes)


def majority_accuracy(train_labels: torch.Tensor, test_labels: torch.Tensor, classes: int) -> float:
    """Test accuracy of the constant predictor of the training split's most frequent class (the
    smallest such class on a tie): the rate a trivial model reaches, beside which a result is read."""
    if len(test_labels) == 0:
        return math.nan
    majority = int(torch.bincount(train_labels.long().reshape(-1), minlength=classes).argmax())
    return float((test_labels.long().reshape(-1) == majority).double().mean())


def ledger(accounting: Accounting, reports_per_client: torch.Tensor, client_ids) -> pd.DataFrame:
    """Per-client ledger: reports sent and their basic composition (claimed and worst case)."""
    reports = reports_per_client.numpy()
    sent = reports > 0

    def composed(per_report: float) -> np.ndarray:
        # A client that sent nothing spent nothing, even where one report's ε is ∞ (∞·0 is NaN).
        return np.where(sent, per_report * np.maximum(reports, 1), 0.0)

    claimed = composed(accounting.epsilon_claimed) if accounting.claimed_composes else \
        np.where(sent, accounting.epsilon_claimed, 0.0)
    return pd.DataFrame({
        "client": np.asarray(client_ids, dtype=np.int64),
        "reports": reports.astype(np.int64),
        "epsilon_claimed": claimed.astype(np.float64),
        "epsilon_worst_case": composed(accounting.epsilon_worst_case).astype(np.float64),
    })


def summary_row(plan: RunPlan, trained: TrainedRun, client_ledger: pd.DataFrame, started_at: str,
                wall_seconds: float, provenance: dict | None = None, trained_together: int = 1) -> dict:
    """The run's summary row; `trained_together` is the size of the group it trained in (1: alone)."""
    result, accounting, sizes = trained.result, trained.accounting, trained.sizes
    return {
        "run_id": plan.run_id,
        "dataset": plan.dataset,
        "model": plan.model,
        "mechanism": plan.mechanism,
        "mechanism_params": json.dumps(plan.mechanism_params, sort_keys=True),
        "epsilon": plan.epsilon_value,
        "seed": plan.seed,
        "fold": plan.fold,
        "plan": plan.canonical_json(),
        "status": result.status,
        "test_accuracy": result.final["test_accuracy"],
        "test_auc": result.final["test_auc"],
        "test_loss": result.final["test_loss"],
        "train_loss": result.final["train_loss"],
        "validation_accuracy": result.final["validation_accuracy"],
        "validation_auc": result.final["validation_auc"],
        "validation_loss": result.final["validation_loss"],
        "stopped_early": result.stopped_early,
        "rounds": result.final["rounds"],
        "rounds_planned": result.final["rounds_planned"],
        "epochs": plan.training.epochs,
        **sizes,
        "epsilon_per_report": plan.epsilon_per_report(sizes["clients"]),
        "epsilon_claimed_per_report": accounting.epsilon_claimed,
        "epsilon_worst_case_per_report": accounting.epsilon_worst_case,
        "delta_claimed_per_report": accounting.delta_claimed,
        "bits_per_report": float(accounting.bits),
        "reports_per_client_max": int(client_ledger["reports"].max()),
        # The ledger's worst client (basic composition over the reports it sent).
        "epsilon_claimed_client_max": float(client_ledger["epsilon_claimed"].max()),
        "epsilon_worst_case_client_max": float(client_ledger["epsilon_worst_case"].max()),
        "uplink_bits_total": float(accounting.bits) * float(trained.reports_per_client.sum()),
        "train_seconds": result.final["train_seconds"],
        "gradients": result.final["gradients"],  # how the clients' gradients were computed (training.gradients)
        "wall_seconds": wall_seconds,
        "trained_together": trained_together,
        "started_at": started_at,
        "finished_at": _now(),
        "ldpbench_version": ldpbench.__version__,
        "torch_version": torch.__version__,
        "features_provenance": None if provenance is None else json.dumps(provenance, sort_keys=True),
    }


def live_params(plan: RunPlan, label: str | None = None) -> dict[str, str]:
    """What a live run shows of its plan, as typed in a filter (ε 2 is "2")."""
    epsilon = math.inf if plan.epsilon is None else float(plan.epsilon)
    return {"dataset": plan.dataset, "model": plan.model, "mechanism": plan.mechanism,
            "label": label or plan.mechanism, "epsilon": param_text(epsilon), "seed": str(plan.seed),
            "fold": str(plan.fold)}


def run_name(plan: RunPlan, label: str | None = None) -> str:
    """How a run's log lines name it: its configuration's label (or mechanism), ε, seed and fold."""
    parts = [label or plan.mechanism]
    if plan.epsilon is not None:
        parts.append(f"ε={plan.epsilon:g}")
    parts.append(f"seed {plan.seed}")
    if plan.folds >= 2:
        parts.append(f"fold {plan.fold}")
    return " ".join(parts)


def execute(plan: RunPlan, data: LoadedDataset | str | Path, out_dir: str | Path,
            checkpoint_dir: str | Path | None = None, label: str | None = None,
            live: LiveTarget | None = None) -> dict:
    """Run `plan`; write curve, ledger and (last) summary Parquet files atomically into out_dir.

    With `checkpoint_dir`, a run whose training sets checkpoint_every resumes from
    checkpoint_dir/<run_id>.pt (kept outside out_dir, which the workflow deletes when a job fails).
    With `live`, its evaluated rounds go to the tracking server while it trains (results.live).
    """
    torch.set_num_threads(1)  # runs are parallelised by the scheduler, one core each
    if not isinstance(data, LoadedDataset):
        data = load(data)
    pending = _PendingRun.begin(plan, data, checkpoint_dir, label, live)
    return pending.complete(*_train_group([pending])[0], out_dir, data.meta.get("provenance"))


@dataclass
class _PendingRun:
    """A run of `execute` or `execute_cell` between its preparation and its files."""

    plan: RunPlan
    prepared: PreparedRun
    stream: LiveRun | None
    started_at: str
    own_seconds: float  # what the run took outside training (preparing, then writing)

    @classmethod
    def begin(cls, plan: RunPlan, data: LoadedDataset, checkpoint_dir: str | Path | None, label: str | None,
              live: LiveTarget | None) -> _PendingRun:
        started_at, clock = _now(), time.perf_counter()
        checkpoint = None if checkpoint_dir is None else checkpoint_file(checkpoint_dir, plan.run_id)
        stream = None if live is None else LiveRun(live, plan.run_id, run_name(plan, label), live_params(plan, label))
        try:
            prepared = prepare(plan, data, checkpoint, label, hooks=[ForwardRounds(stream.add)] if stream else ())
        except BaseException:
            if stream:
                stream.close("FAILED")
            raise
        return cls(plan, prepared, stream, started_at, time.perf_counter() - clock)

    def fail(self) -> None:
        """Close its live run as failed (it will not complete)."""
        if self.stream:
            self.stream.close("FAILED")

    def complete(self, result: RunResult, train_seconds: float, together: int, out_dir: str | Path,
                 provenance: dict | None) -> dict:
        """Close its live run and write its curve, ledger and (last) summary."""
        clock = time.perf_counter()
        if self.stream:
            self.stream.close("FINISHED" if result.status == "ok" else "FAILED")
        plan, trained = self.plan, self.prepared.finish(result)
        out_dir = Path(out_dir)
        # The run files are written from rows and columns, not DataFrames, and plainly encoded (their
        # values hardly repeat): about a third of the time DataFrames took.
        write_parquet(out_dir / CURVE_FILE, [{"run_id": plan.run_id, **point} for point in result.curve],
                      CURVE_SCHEMA, dictionary=False)
        client_ledger = ledger(trained.accounting, trained.reports_per_client, trained.client_ids)
        write_parquet(out_dir / LEDGER_FILE, {name: client_ledger[name].to_numpy() for name in client_ledger},
                      LEDGER_SCHEMA, dictionary=False)
        result.final["train_seconds"] = train_seconds
        wall_seconds = self.own_seconds + train_seconds + time.perf_counter() - clock
        row = summary_row(plan, trained, client_ledger, self.started_at, wall_seconds, provenance, together)
        # The summary is written last: its presence marks a complete run.
        write_parquet(out_dir / SUMMARY_FILE, [row], SUMMARY_SCHEMA, dictionary=False)
        return row


def _train_group(group: list[_PendingRun]) -> list[tuple[RunResult, float, int]]:
    """Train a group of runs (one alone, or several that can train together): each run's result, its
    share of the training time and the group's size."""
    clock = time.perf_counter()
    trainers = [pending.prepared.trainer for pending in group]
    try:
        results = [trainers[0].run()] if len(group) == 1 else train_together(trainers)
    except BaseException:
        for pending in group:
            pending.fail()
        raise
    share = (time.perf_counter() - clock) / len(group)
    return [(result, result.final["train_seconds"] if len(group) == 1 else share, len(group)) for result in results]


@dataclass(frozen=True)
class CellResult:
    """What `execute_cell` did: the summary rows of the runs it trained, the runs the store had already."""

    trained: list[dict]
    reused: list[str]


def stored_runs(plans: Sequence[RunPlan], runs_dir: str | Path, phase: str) -> list[str]:
    """The run ids of `plans` whose runs are in the store in `phase`; a run stored only in the other phase
    (a trial whose plan is also a final run's) is linked into this one first. A run is stored once its
    summary is (layout: the summary is published last)."""
    found = []
    for plan in plans:
        where = (plan.dataset, plan.mechanism, phase, plan.run_id)
        if run_file(runs_dir, SUMMARIES, *where).exists():
            found.append(plan.run_id)
            continue
        other = next(p for p in PHASES if p != phase)
        if run_file(runs_dir, SUMMARIES, plan.dataset, plan.mechanism, other, plan.run_id).exists():
            _link_run(runs_dir, plan, other, phase)
            found.append(plan.run_id)
    return found


def _link_run(runs_dir: str | Path, plan: RunPlan, source: str, target: str) -> None:
    """A stored run's files in phase `source`, hard-linked (copied where links fail) into phase `target`,
    summary last; staged outside the trees, so that a process killed meanwhile leaves nothing in them."""
    for kind in RUN_FILES:  # RUN_FILES' order: the summary, which marks the run stored, last
        origin = run_file(runs_dir, kind, plan.dataset, plan.mechanism, source, plan.run_id)
        staged = attempts_dir(runs_dir) / f"link-{plan.run_id}-{os.getpid()}-{secrets.token_hex(4)}"
        staged.mkdir(parents=True)
        try:
            os.link(origin, staged / origin.name)
        except OSError:
            shutil.copy2(origin, staged / origin.name)
        _place(staged, run_dir(runs_dir, kind, plan.dataset, plan.mechanism, target, plan.run_id))


def _place(staged: Path, destination: Path) -> None:
    """Rename a run's staged directory into the store; if the run is there already (another attempt
    stored it meanwhile: the same plan gives the same numbers), keep that one."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staged, destination)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        shutil.rmtree(staged, ignore_errors=True)


def execute_cell(plans: list[RunPlan], prepared_dir: str | Path, runs_dir: str | Path, cell_id: str,
                 phase: str = FINAL, checkpoint_dir: str | Path | None = None, label: str | None = None,
                 live: LiveTarget | None = None) -> CellResult:
    """Run the plans of a cell (one configuration's seeds and folds, or its trials) that the run store lacks.

    Runs are stored by id (ldpbench.layout): a run already stored, by an earlier cell of the
    campaign (before an edit of it) or by this cell's earlier attempt, is not trained again. The
    others are trained on one load of the dataset, in groups that train together where they can, in
    an attempt directory of this process (runs/.attempts/); each is published into the store as soon
    as it is complete (its curve and ledger, then its summary), so an interrupted cell keeps the runs
    it finished. attempt.json in the attempt directory says whose it is and which runs train now,
    for `ldpbench status`. Attempts of the same cell left by killed processes are removed first. The
    numbers do not depend on which cell or process a run is executed in: every draw is keyed by the
    run's own seed.
    """
    reused = stored_runs(plans, runs_dir, phase)
    stored = set(reused)
    missing = [plan for plan in plans if plan.run_id not in stored]
    if not missing:
        return CellResult([], reused)
    data = load(prepared_dir)
    remove_stale_attempts(runs_dir, cell_id)
    attempt = attempt_dir(runs_dir, cell_id, os.getpid(), secrets.token_hex(4))
    attempt.mkdir(parents=True)
    record = {"cell_id": cell_id, "phase": phase, "label": label, **processes.identity(),
              "started_at": _now(), "runs": [plan.run_id for plan in missing], "training": []}
    try:
        write_json(attempt / ATTEMPT_FILE, record)
        rows = []
        with contextlib.closing(_groups(missing, data, checkpoint_dir, label, live)) as groups:
            for group in groups:
                write_json(attempt / ATTEMPT_FILE, {**record, "training": [p.plan.run_id for p in group]})
                for pending, trained in zip(group, _train_group(group)):
                    staged = staged_run_dir(attempt, pending.plan.run_id)
                    rows.append(pending.complete(*trained, staged, data.meta.get("provenance")))
                    _publish(staged, runs_dir, pending.plan, phase)
    finally:
        shutil.rmtree(attempt, ignore_errors=True)
    return CellResult(rows, reused)


def _groups(plans: list[RunPlan], data: LoadedDataset, checkpoint_dir: str | Path | None, label: str | None,
            live: LiveTarget | None) -> Iterator[list[_PendingRun]]:
    """The cell's runs in order, prepared, in groups that train together (ldpbench.fl.engine.
    together_limit: runs whose rounds are small) or alone. A group is handed out once the run after
    it is prepared (or the cell ends), so at most a group and one more run are held. Runs prepared
    but not handed out have their live runs closed as failed if preparing fails or the caller stops."""
    group: list[_PendingRun] = []  # prepared, not handed out yet
    try:
        for plan in plans:
            pending = _PendingRun.begin(plan, data, checkpoint_dir, label, live)
            leader = group[0].prepared.trainer if group else None
            if leader is not None and (len(group) == together_limit(leader)
                                       or not can_train_together(leader, pending.prepared.trainer)):
                full, group = group, [pending]
                yield full
            else:
                group.append(pending)
        if group:
            full, group = group, []
            yield full
    except BaseException:  # GeneratorExit included: the caller stopped after a group failed
        for held in group:
            held.fail()
        raise


def remove_stale_attempts(runs_dir: str | Path, cell_id: str) -> None:
    """Remove the attempt directories of a cell left by processes that were killed.

    The workflow runs one job per cell at a time and its runs stop with it (ldpbench.launch.parent_watch), so
    another attempt of this cell is a dead one's.
    """
    for stale in attempts_dir(runs_dir).glob(glob.escape(attempt_prefix(cell_id)) + "*"):
        log.info("removing '%s', left by an earlier attempt of this cell", stale)
        shutil.rmtree(stale, ignore_errors=True)


def _publish(staged: Path, runs_dir: str | Path, plan: RunPlan, phase: str) -> None:
    """Move a complete run's files from its staged directory into the store, one directory per tree,
    summary last (its presence marks the run stored)."""
    for kind, name in RUN_FILES.items():
        destination = run_dir(runs_dir, kind, plan.dataset, plan.mechanism, phase, plan.run_id)
        part = staged.with_name(f"{staged.name}.{kind}")
        part.mkdir()
        os.rename(staged / name, part / name)
        _place(part, destination)
    staged.rmdir()
