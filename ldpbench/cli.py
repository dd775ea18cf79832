"""Command-line entry points, one per workflow stage (the Snakemake rules call these)."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ldpbench.errors import ConfigError, LdpbenchError
from ldpbench.layout import SERVER_ARTIFACTS, SERVER_STORE
from ldpbench.status import DEFAULT_WINDOW_SECONDS

log = logging.getLogger("ldpbench")


def _validate(args) -> None:
    from ldpbench.campaign import LARGE_GRID_RUNS, check_devices, count_runs, load_config

    config = load_config(args.config)
    runs = count_runs(config)
    print(f"'{args.config}' is valid: campaign '{config['campaign']}', {runs:,} runs")
    try:
        check_devices(config)
    except ConfigError as error:  # the jobs may run elsewhere (GPU nodes); the workflow refuses it where they run here
        print(f"warning: {error}. The workflow refuses it when it runs the jobs on this machine; jobs on "
              f"GPU nodes are unaffected", file=sys.stderr)
    if runs > LARGE_GRID_RUNS:
        print(f"warning: {runs:,} runs is more than {LARGE_GRID_RUNS:,}; the workflow builds every run's "
              f"plan before scheduling (a dry run takes minutes) and runs each one", file=sys.stderr)
    if args.estimate:
        _estimate(args, config)
    elif args.measured or args.workflow_profile:
        raise ConfigError("--measured and --workflow-profile size a campaign: give --estimate with them")


def _estimate(args, config: dict) -> None:
    from ldpbench.campaign import runnable_datasets
    from ldpbench.estimate import Measurements, estimate
    from ldpbench.layout import CampaignLayout

    measured = args.measured
    if not measured:  # the campaign's own run store, where an earlier run of it left one
        own = CampaignLayout(config["results_dir"], config["campaign"]).runs_dir
        measured = [own] if (own / "summaries").is_dir() else []
    datasets, skipped = runnable_datasets(config)
    found = estimate(config, datasets, skipped, Measurements.read(measured) if measured else None,
                     args.workflow_profile)
    print("\n".join(found.lines()))


def _mechanisms(args) -> None:
    from ldpbench import mechanisms

    if args.epsilon is None:
        for name in mechanisms.names():
            cls = mechanisms.get(name)
            params = ", ".join(f"{k}={v!r}" for k, v in mechanisms.parameters(name).items()) or "-"
            print(f"{name:14s} {cls.description}\n{'':14s} privatises: {cls.privatises}; parameters: {params}")
        return
    # Accounting of one report at the given ε and d, default parameters.
    print(f"one report at ε = {args.epsilon:g}, d = {args.dims}, cohort m = {args.cohort}, default parameters")
    print(f"{'mechanism':14s} {'claimed ε':>12s} {'worst-case ε':>14s} {'uplink bits':>12s}")
    for name in mechanisms.names():
        epsilon = args.epsilon if mechanisms.get(name).private else float("inf")
        try:
            accounting = mechanisms.create(name, epsilon, args.dims, cohort_size=args.cohort, classes=2).accounting()
        except ConfigError as error:  # e.g. sqSGD's PrivQuant has no valid (κ, p) at small ε
            print(f"{name:14s} not available at these settings: {error}")
            continue
        except ArithmeticError as error:  # e.g. PE's selection law underflows at ε in the hundreds
            print(f"{name:14s} accounting out of floating-point range at these settings ({error})")
            continue
        print(f"{name:14s} {accounting.epsilon_claimed:12.4g} {accounting.epsilon_worst_case:14.6g} "
              f"{accounting.bits:12.0f}")


def _datasets(args) -> None:
    from ldpbench.data import registry

    for name in registry.names():
        print(f"{name:18s} {registry.get(name).description}")


def _checksum_overrides(values: list[str]) -> dict[str, str]:
    overrides = {}
    for value in values:
        key, sep, digest = value.partition("=")
        if not sep or not key or not digest:
            raise LdpbenchError(f"--sha256 {value!r}: expected <dataset dir>/<file name>=<sha256>")
        overrides[key] = digest
    return overrides


def _prepare(args) -> None:
    from ldpbench.data import registry

    started = time.perf_counter()
    dataset = registry.get(args.dataset).prepare(args.out, args.raw_dir, args.mirror, args.allow_download,
                                                 _checksum_overrides(args.sha256))
    log.info("prepared '%s': features %s %s in %.1f s -> %s", args.dataset,
             "x".join(map(str, dataset.features.shape)), dataset.features.dtype,
             time.perf_counter() - started, args.out)


def _features(args) -> None:
    from ldpbench.features.extract import extract_features

    started = time.perf_counter()
    meta = extract_features(args.prepared, args.out, args.encoder, batch_size=args.batch_size,
                            device=args.device, weights=args.weights, random_init=args.random_init,
                            raw_dir=args.raw_dir, mirror=args.mirror,
                            allow_download=args.allow_download, threads=args.threads)
    log.info("features '%s' of '%s': n=%d, dim=%d on %s in %.1f s -> %s", args.encoder, args.dataset,
             meta["n"], meta["shape"][0], meta["provenance"]["device"], time.perf_counter() - started,
             args.out)


def _run_cell(args) -> None:
    from ldpbench.atomic import write_json
    from ldpbench.launch.parent_watch import stop_with_workflow
    from ldpbench.plan import RunPlan
    from ldpbench.results.live import target_from_environment
    from ldpbench.runner import execute_cell, run_name

    cell = _read_cell_file(args.cell)
    plans = [RunPlan.from_dict(entry["plan"]) for entry in cell["runs"]]
    live = target_from_environment()  # set by the workflow with tracking.live and a tracking server
    stop_with_workflow()  # no orphan runs when Snakemake or the job's shell is killed
    result = execute_cell(plans, args.prepared, args.runs_root, cell["cell_id"], cell["phase"],
                          args.checkpoint_dir, args.label, live)
    log.info("cell %s: %d run(s) trained, %d already in the run store", cell["cell_id"], len(result.trained),
             len(result.reused))
    for row in result.trained:
        plan = next(plan for plan in plans if plan.run_id == row["run_id"])
        log.info("run %s (%s): %s, test accuracy %.4f, %d rounds in %.2f s", row["run_id"],
                 run_name(plan, args.label), row["status"], row["test_accuracy"], row["rounds"],
                 row["wall_seconds"])
    audited = _audit_cell(cell, plans, args.runs_root)
    # Written last: the cell's job is done (the workflow's output of it).
    write_json(args.marker, {"cell_id": cell["cell_id"], "phase": cell["phase"],
                             "runs": [plan.run_id for plan in plans], "trained": len(result.trained),
                             "reused": len(result.reused), "audited": audited})


def _read_cell_file(path: str) -> dict:
    """A cell's plan file (the workflow's plans/<cell_id>.json), checked for what run-cell reads."""
    try:
        cell = json.loads(Path(path).read_text())
    except OSError as error:
        raise LdpbenchError(f"--cell: cannot read '{path}': {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise LdpbenchError(f"--cell: '{path}' is not valid JSON: {error}") from None
    if not isinstance(cell, dict) or not {"cell_id", "phase", "runs"} <= set(cell) or not cell["runs"]:
        raise LdpbenchError(f"--cell: '{path}' must hold a cell's plan file: an object with cell_id, phase and "
                            "a non-empty list of runs")
    return cell


def _audit_cell(cell: dict, plans: list, runs_root: str) -> list[dict]:
    """The private configurations a final cell ran; with the workflow's audit settings in the environment
    ($LDPBENCH_AUDIT), their audits too, computed here unless cached or being computed by another job
    (the campaign's audit-table job reads them, computes any still missing and judges them)."""
    from ldpbench.audit import audited_configurations, cached_audits, settings_from_environment
    from ldpbench.layout import FINAL, SUMMARIES, run_file

    if cell["phase"] != FINAL:
        return []
    configurations = audited_configurations([run_file(runs_root, SUMMARIES, plan.dataset, plan.mechanism, FINAL,
                                                      plan.run_id) for plan in plans])
    audit = settings_from_environment()
    if audit is not None and configurations:
        settings, directory = audit
        started = time.perf_counter()
        results = cached_audits(configurations, directory, settings, wait=False)
        log.info("audited %d of %d private configuration(s) in %.3f s (the others are being audited by another "
                 "job)", len(results), len(configurations), time.perf_counter() - started)
    return configurations


def _audit_table(args) -> int:
    from ldpbench.audit import AuditSettings, cached_audits, defects, write_table

    settings = AuditSettings(args.samples, args.dims, args.alpha, args.random_pairs, args.seed)
    configurations = {}
    for marker in args.cells:
        for configuration in json.loads(Path(marker).read_text())["audited"]:
            configurations[json.dumps(configuration, sort_keys=True)] = configuration
    results = cached_audits([configurations[key] for key in sorted(configurations)], args.audits, settings)
    log.info("%d audited configuration(s)", len(results))
    found = defects(results)
    if found:
        log.error("audited ε above the reported worst case (a defect): %s", "; ".join(found))
        if not args.warn:
            return 1
    write_table(args.out, results)
    return 0


def _aggregate(args) -> None:
    from ldpbench.results.tables import aggregate

    counts = aggregate(args.manifest, args.runs_root, args.tables_dir, args.selected)
    log.info("aggregated %s", counts)


def _select(args) -> None:
    from ldpbench.tuning import select_tables

    log.info("selected the settings of the tuned configurations: %s",
             select_tables(args.trials, args.runs_root, args.tables_dir))


def _audit(args) -> int:
    import torch

    from ldpbench.audit import audit_registry, defects, write_table

    if args.threads:
        torch.set_num_threads(args.threads)
    options = {"dims": args.dims, "samples": args.samples, "seed": args.seed, "alpha": args.alpha,
               "random": args.random_pairs}
    options.update(epsilon=args.epsilon, params=json.loads(args.params) if args.params else None)
    # Options left out take the audit's defaults (kept in ldpbench.audit alone).
    results = audit_registry(args.mechanism or None, **{key: value for key, value in options.items()
                                                        if value is not None})
    print(f"{'mechanism':14s} {'ε':>6s} {'claimed':>9s} {'worst case':>11s} {'audited ≥':>10s}  verdict")
    for result in results:
        print(f"{result.mechanism:14s} {result.epsilon:6g} {result.claimed:9.4g} {result.worst_case:11.4g} "
              f"{result.audited_lower_bound:10.4f}  {result.verdict} ({result.pair}: {result.event})")
    found = defects(results)
    if found:
        log.error("audited ε above the reported worst case (a defect): %s", "; ".join(found))
    if args.out and (args.warn or not found):
        write_table(args.out, results)
    return 1 if found and not args.warn else 0


def _check(args) -> int:
    from ldpbench import mechanisms
    from ldpbench.audit import DEFECT, audit_registry
    from ldpbench.mechanisms.contract import ContractViolation, checks

    cls = mechanisms.get(args.mechanism)
    try:
        params = json.loads(args.params) if args.params else None
    except json.JSONDecodeError as error:
        raise LdpbenchError(f"--params is not JSON ({error}): {args.params!r}") from None
    found = checks(args.mechanism, params)
    print(f"'{args.mechanism}' ({cls.__module__}): the contract of {cls.privatises} mechanisms, {len(found)} checks")
    failed = 0
    for check in found:
        try:
            check.run()
            print(f"  ok      {check.description}")
        except ContractViolation as violation:
            failed += 1
            print(f"  FAILED  {check.description}: {violation}")
        except Exception as error:  # noqa: BLE001 - a plugin's own failure is a failed check, reported
            failed += 1
            print(f"  FAILED  {check.description}: {type(error).__name__}: {error}")
    if not cls.private:
        print("privacy audit: none (a non-private mechanism)")
    elif args.samples == 0:
        print("privacy audit: skipped (--samples 0)")
    else:
        [result] = audit_registry([args.mechanism], epsilon=args.epsilon, samples=args.samples, params=params)
        print(f"privacy audit at ε = {result.epsilon:g}, {result.samples:,} reports per input of {result.pairs} "
              f"pairs: claimed {result.claimed:.4g}, worst case {result.worst_case:.4g}, audited ≥ "
              f"{result.audited_lower_bound:.4f} ({result.pair}: {result.event})")
        print(f"audit: {result.verdict}")
        failed += result.verdict == DEFECT
    print(f"{'all checks passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


def _scorecard(args) -> None:
    from ldpbench.scorecard import write_scorecard

    table = write_scorecard(args.tables_dir, args.claims, args.out)
    log.info("scorecard: %s", table["status"].value_counts().to_dict())


def _findings(args) -> None:
    from ldpbench.results.findings import write_findings

    for path in write_findings(args.campaign, args.scorecards, args.claims, args.out, args.analysis_template,
                               args.analysis):
        log.info("scorecard written to %s", path)
    log.info("findings page written to %s", args.out)


def _compare(args) -> None:
    from ldpbench.results.compare import compare_tables

    log.info("compared the mechanisms: %s", compare_tables(args.tables_dir, args.alpha, args.test))


def _report(args) -> None:
    from ldpbench.results.report import build_report

    log.info("report written to %s", build_report(args.tables_dir, args.out_dir, args.audit, args.scorecard))


def _track(args) -> None:
    from ldpbench.results.tracking import resolve_uri, track

    datasets = {}
    for pair in args.dataset:
        name, separator, meta = pair.partition("=")
        if not separator or not name or not meta:
            raise LdpbenchError(f"--dataset expects NAME=META (a dataset and its meta.json), got '{pair}'")
        datasets[name] = meta
    result = track(args.tables_dir, args.report_dir, resolve_uri(args.uri), args.experiment,
                   args.artifact_dir, args.marker, datasets=datasets, campaign_file=args.campaign_file)
    for level, counts in (("runs", result), ("configurations", result["configurations"]),
                          ("curves", result["curves"]), ("tuning runs", result["tunings"]),
                          ("tuning trials", result["trials"]), ("campaign run", result["campaign"])):
        log.info("MLflow experiment %s, %s: %d created, %d already logged, %d re-logged, %d restored, "
                 "%d moved under their parent, %d removed (left the tables: soft-deleted, restorable)",
                 result["experiment_id"], level, counts["created"], counts["skipped"], counts["replaced"],
                 counts["restored"], counts["reparented"], counts["removed"])
    if args.uri.startswith(("http://", "https://")):
        for what, view in (("configurations", "configurations_view"), ("accuracy against ε", "curves_view")):
            log.info("%s: %s/%s", what, args.uri.rstrip("/"), result[view])
    else:
        log.info("`ldpbench ui %s` serves the store and prints the addresses of the configurations and of "
                 "the accuracy against ε", args.uri.removeprefix("sqlite:///"))


def _track_report(args) -> None:
    from ldpbench.results.tracking import attach_report, resolve_uri

    result = attach_report(args.report_dir, resolve_uri(args.uri), args.experiment, args.tracking_marker, args.marker)
    log.info("report attached to the MLflow campaign run %s: %d files", result["campaign_run_id"],
             len(result["report_files"]))


def _tracking_init(args) -> None:
    from ldpbench.results.tracking import init_store, resolve_uri

    result = init_store(resolve_uri(args.uri), args.experiment, args.artifact_dir, args.marker)
    log.info("MLflow store %s ready: experiment '%s' (id %s)", result["uri"], result["experiment"],
             result["experiment_id"])


def _tracking_server(args) -> None:
    import os

    from ldpbench.results.tracking import server_command, server_environment

    command = server_command(args.store, args.host, args.port, args.artifacts, args.workers,
                             args.allowed_hosts)
    Path(args.store).resolve().parent.mkdir(parents=True, exist_ok=True)
    Path(args.artifacts).mkdir(parents=True, exist_ok=True)
    env = server_environment()
    log.info("serving %s at http://%s:%d (Ctrl-C stops it); campaigns use "
             "`tracking: {uri: http://%s:%d}`", args.store, args.host, args.port, args.host, args.port)
    # exec: the server replaces this process, so signals (Ctrl-C, kill of the group) reach it.
    sys.stderr.flush()
    os.execve(command[0], command, env)


def _ui(args) -> int:
    from ldpbench.results.tracking import browse

    return browse(args.store, args.host, args.port, args.open)


def _status(args) -> None:
    from ldpbench.status import campaign_status, format_status

    while True:
        status = campaign_status(args.campaign, args.window)
        print(format_status(status), flush=True)
        if not args.watch or status.ended_state:
            return
        time.sleep(args.watch)
        print()


def _worker(args) -> None:
    from ldpbench.launch.fork_server import PRELOAD, TRACKING_PRELOAD, linger_as_seed, preloaded, serve

    log.info("worker listening on %s for Snakemake (process %d)", args.socket, args.owner)
    preload = tuple(step for step in PRELOAD if not (args.without_tracking and step in TRACKING_PRELOAD))
    serve(args.socket, args.owner, preload, run=main)
    if args.linger > 0 and args.seed_key and preloaded(preload):
        linger_as_seed(args.seed_key, args.linger, run=main)
    # Its children are stopped and it holds no file of results: skip the interpreter's teardown of
    # torch, MLflow and the rest, over a second that Snakemake's onsuccess would wait for.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _version() -> str:
    """ldpbench's version beside torch's and Python's (read from the installed metadata: no torch import)."""
    from importlib.metadata import PackageNotFoundError, version

    from ldpbench import __version__

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"ldpbench {__version__} (torch {torch_version}, Python {sys.version.split()[0]})"


@dataclass(frozen=True)
class Command:
    """One subcommand: its name and one-line help, the function that adds its arguments to its parser, and the
    function that runs it on the parsed arguments (returning the exit status, None for 0)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command that takes none."""


def _validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config")
    parser.add_argument("--estimate", action="store_true",
                        help="also print its cells, its jobs and the core-time of its runs, from measured runs")
    parser.add_argument("--measured", action="append", default=[], metavar="DIR",
                        help="results of earlier runs to estimate from (repeatable; default: this campaign's own "
                             "run store, where it has one)")
    parser.add_argument("--workflow-profile", default=None, metavar="DIR",
                        help="with --estimate: count the SLURM jobs this profile submits (e.g. profiles/slurm)")


def _mechanisms_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epsilon", type=float, default=None,
                        help="print claimed vs worst-case ε and bits of one report at this ε")
    parser.add_argument("--dims", type=int, default=100)
    parser.add_argument("--cohort", type=int, default=1000, help="clients per round (for mu: auto)")


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mechanism", action="append",
                        help="a registered mechanism (repeatable; default: all private ones)")
    parser.add_argument("--epsilon", type=float, default=None,
                        help="budget of one report (default: each one's example ε)")
    parser.add_argument("--dims", type=int, default=None, help="input width (default 4)")
    parser.add_argument("--params", default=None,
                        help="the mechanism's parameters as JSON, e.g. '{\"k_fraction\": 0.5}'")
    parser.add_argument("--samples", type=int, default=None, help="reports drawn per input of each pair (default 10^6)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draws and random pairs (default 0)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="false-alarm level of each mechanism's bound (default 0.01)")
    parser.add_argument("--random-pairs", type=int, default=None,
                        help="random input pairs tried beside the mechanism's own (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch; default: all)")
    parser.add_argument("--out", default=None,
                        help="write the table (Parquet) here; not written on a defect unless --warn")
    parser.add_argument("--warn", action="store_true", help="exit 0 even when a bound exceeds a worst case")


def _audit_table_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", nargs="+", required=True, metavar="CELL_MARKER",
                        help="the final cells' markers (cells/.../<cell_id>.json)")
    parser.add_argument("--audits", required=True, help="the campaign's audit directory (<campaign>/audit)")
    parser.add_argument("--out", required=True, help="the table (Parquet); not written on a defect unless --warn")
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--dims", type=int, required=True)
    parser.add_argument("--alpha", type=float, required=True)
    parser.add_argument("--random-pairs", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--warn", action="store_true", help="exit 0 even when a bound exceeds a worst case")


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mechanism")
    parser.add_argument("--params", default=None, help="the mechanism's parameters as JSON")
    parser.add_argument("--epsilon", type=float, default=None, help="budget of one report for the audit "
                        "(default: the mechanism's example ε)")
    parser.add_argument("--samples", type=int, default=1_000_000,
                        help="audit reports per input of each pair (default 10^6; 0 skips the audit)")


def _prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset")
    parser.add_argument("--out", required=True, help="prepared dataset directory")
    parser.add_argument("--raw-dir", default="data/raw")
    parser.add_argument("--mirror", default=None)
    parser.add_argument("--allow-download", action="store_true")
    parser.add_argument("--sha256", action="append", default=[], metavar="DIR/FILE=SHA256",
                        help="sha256 of a file whose checksum is unknown here (repeatable)")


def _features_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset")
    parser.add_argument("--encoder", required=True, help="minilm, bert-base-uncased or resnet18")
    parser.add_argument("--prepared", required=True, help="prepared dataset directory")
    parser.add_argument("--out", required=True, help="features directory (array format)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:1")
    parser.add_argument("--weights", default=None,
                        help="weights file (resnet18) or model directory (text encoders); default: "
                             "the encoder's own source")
    parser.add_argument("--random-init", action="store_true",
                        help="random weights (tests only; recorded as 'random-init' in the provenance)")
    parser.add_argument("--raw-dir", default="data/raw", help="where downloaded weights are kept")
    parser.add_argument("--mirror", default=None)
    parser.add_argument("--allow-download", action="store_true")


def _run_cell_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cell", required=True, help="the cell's plan file (plans/<cell_id>.json): its id, phase "
                        "and runs")
    parser.add_argument("--prepared", required=True, help="prepared dataset directory")
    parser.add_argument("--runs-root", required=True, help="the campaign's run store (<campaign>/runs)")
    parser.add_argument("--marker", required=True, help="written last, when the cell is done: its runs and the "
                        "private configurations they ran")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="where runs with training.checkpoint_every > 0 keep <run_id>.pt to resume from")
    parser.add_argument("--label", default=None, help="the configuration's label, naming the runs in the log")


def _aggregate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--runs-root", required=True)
    parser.add_argument("--tables-dir", required=True)
    parser.add_argument("--selected", default=None,
                        help="a tuned campaign's tables/selected.parquet, merged into the summary")


def _select_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", required=True, help="the trials manifest (trials.json)")
    parser.add_argument("--runs-root", required=True)
    parser.add_argument("--tables-dir", required=True, help="where tuning.parquet and selected.parquet go")


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables-dir", required=True, help="the campaign's tables (runs and summary are read)")
    parser.add_argument("--alpha", type=float, default=0.05, help="family-wise error rate within a family (Holm)")
    parser.add_argument("--test", choices=["t", "wilcoxon"], default="t", help="the paired test")


def _scorecard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables-dir", required=True, help="the campaign's tables (summary and comparisons are read)")
    parser.add_argument("--claims", nargs="+", required=True, metavar="CLAIMS_FILE",
                        help="paper claims files (config/paper_claims/*.yaml)")
    parser.add_argument("--out", required=True, help="the scorecard table (Parquet)")


def _findings_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--campaign", action="append", default=[], metavar="CAMPAIGN_DIR",
                        help="a finished campaign's results directory: its tables/scorecard.parquet is written to "
                             "the scorecards directory as <campaign>.csv first (repeatable)")
    parser.add_argument("--scorecards", default="docs/scorecards", help="the scorecard CSVs (default docs/scorecards)")
    parser.add_argument("--claims", nargs="+", default=None, metavar="CLAIMS_FILE",
                        help="the paper claims files the page covers, in its order "
                             "(default config/paper_claims/*.yaml)")
    parser.add_argument("--out", default="docs/findings.md", help="the page (default docs/findings.md)")
    parser.add_argument("--analysis-template", default="docs/templates/analysis.md",
                        help="the analysis page's template, its numbers as placeholders filled from the scorecards "
                             "(default docs/templates/analysis.md)")
    parser.add_argument("--analysis", default="docs/analysis.md", help="the analysis page (default docs/analysis.md)")


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--audit", default=None, help="the campaign's audit table (tables/audit.parquet), if audited")
    parser.add_argument("--scorecard", default=None,
                        help="the campaign's scorecard (tables/scorecard.parquet), if it covers paper claims")


def _track_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables-dir", required=True)
    parser.add_argument("--report-dir", default=None,
                        help="the campaign's report, attached to the campaign run (the workflow attaches it "
                             "afterwards, with track-report)")
    _tracking_init_arguments(parser)
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME=META",
                        help="a dataset of the campaign and its prepared meta.json (logged as a run input "
                             "with its digest); repeatable")
    parser.add_argument("--campaign-file", default=None,
                        help="the resolved campaign configuration, attached to the campaign run")


def _track_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report-dir", required=True)
    parser.add_argument("--uri", required=True)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--tracking-marker", required=True, help="the marker that `track` wrote")
    parser.add_argument("--marker", required=True)


def _tracking_init_arguments(parser: argparse.ArgumentParser) -> None:
    """The store and experiment `tracking-init` prepares and `track` logs into."""
    parser.add_argument("--uri", required=True)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--artifact-dir", required=True)
    parser.add_argument("--marker", required=True)


def _tracking_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", default=str(SERVER_STORE), help="SQLite file of the store")
    parser.add_argument("--artifacts", default=str(SERVER_ARTIFACTS),
                        help="artifact directory served to clients without a shared file system")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to listen on; 0.0.0.0 to serve cluster nodes")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--allowed-hosts", default=None,
                        help="Host headers MLflow accepts besides localhost (e.g. submit-host:5000)")


def _ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", nargs="?", default=str(SERVER_STORE.parent),
                        help="a campaign's results directory (its mlflow.db), a SQLite store, or a tracking "
                             f"server's http:// address (default: {SERVER_STORE.parent})")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--open", action="store_true", help="open the first campaign's view in a browser")


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("campaign", help="the campaign's results directory, results/<campaign>")
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_SECONDS,
                        help=f"seconds of finished runs the throughput is measured over "
                             f"(default {DEFAULT_WINDOW_SECONDS:g})")
    parser.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                        help="print again every SECONDS until the workflow has ended")


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", required=True, help="Unix socket to listen on, in a private directory")
    parser.add_argument("--owner", type=int, required=True, help="the process (Snakemake) whose end stops it")
    parser.add_argument("--without-tracking", action="store_true",
                        help="do not preload what only the tracking steps import (a campaign that does not track)")
    parser.add_argument("--linger", type=float, default=0.0, metavar="SECONDS",
                        help="after the campaign, stay on as the seed that forks the next campaigns' workers "
                             "until none has started for SECONDS (with --seed-key; default 0: exit)")
    parser.add_argument("--seed-key", default=None, help="the key of the workers a seed forks (fork_server.seed_key)")


# The subcommands, in the order `ldpbench --help` lists them.
COMMANDS = (
    Command("validate", "validate a campaign file against the schema", _validate_arguments, _validate),
    Command("mechanisms", "list registered mechanisms, or their accounting", _mechanisms_arguments, _mechanisms),
    Command("datasets", "list registered datasets", _no_arguments, _datasets),
    Command("audit", "empirical lower bound on the ε of mechanisms (black-box audit)", _audit_arguments, _audit),
    Command("audit-table", "the campaign's audit table: the audits of what its final cells ran (cached by the cells' "
            "jobs; computed here where missing)", _audit_table_arguments, _audit_table),
    Command("check", "run the mechanism contract and the privacy audit on one mechanism (e.g. a plugin's)",
            _check_arguments, _check),
    Command("prepare", "fetch (checksum-verified) and prepare one dataset", _prepare_arguments, _prepare),
    Command("features", "extract pretrained features of a prepared dataset", _features_arguments, _features),
    Command("run-cell", "train the runs of one cell (its seeds and folds, or its trials) that the run store lacks",
            _run_cell_arguments, _run_cell),
    Command("aggregate", "run files -> runs/curves/summary Parquet tables", _aggregate_arguments, _aggregate),
    Command("select", "score the tuning trials and select each configuration's setting", _select_arguments, _select),
    Command("compare", "paired comparisons, rankings and verdicts of the mechanisms", _compare_arguments, _compare),
    Command("scorecard", "the papers' claims against a campaign's tables", _scorecard_arguments, _scorecard),
    Command("findings", "docs/findings.md from the campaigns' scorecards (docs/scorecards/)",
            _findings_arguments, _findings),
    Command("report", "HTML report with figures from the tables", _report_arguments, _report),
    Command("track", "log the campaign to MLflow (idempotent)", _track_arguments, _track),
    Command("track-report", "attach the report to the campaign's MLflow run that `track` logged",
            _track_report_arguments, _track_report),
    Command("tracking-init", "create the MLflow store and experiment once, before any writer",
            _tracking_init_arguments, _tracking_init),
    Command("tracking-server", "serve a SQLite MLflow store over HTTP (mlflow server)",
            _tracking_server_arguments, _tracking_server),
    Command("ui", "browse the campaigns in MLflow: each one's configurations and curves views (serves a SQLite "
            "store with MLflow's UI)", _ui_arguments, _ui),
    Command("status", "runs done, running and pending, throughput and time left of a campaign, the steps running, from "
            "its results directory", _status_arguments, _status),
    Command("worker", "the warm process a local campaign forks its jobs from (started by the workflow; see "
            "ldpbench/launch/fork_server.py)", _worker_arguments, _worker),
)


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """Built once a process (its commands are fixed): the jobs forked from the warm worker parse their
    command lines with the one the worker built for its own."""
    parser = argparse.ArgumentParser(prog="ldpbench", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help)
        command.add_arguments(sub)
        sub.set_defaults(func=command.run)
    return parser


def _job_description(args) -> str:
    """What a job of the workflow works on, as `ldpbench status` names it beside its step."""
    if args.command == "run-cell":
        return args.label or ""
    if args.command == "features":
        return f"{args.dataset}/{args.encoder}"
    return getattr(args, "dataset", None) or ""


def main(argv: list[str] | None = None) -> int:
    from ldpbench import progress

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    args = build_parser().parse_args(argv)
    job = progress.job_starts(args.command, _job_description(args)) if args.command in WORKFLOW_STEPS else None
    status, ended = 1, progress.FAILED
    try:
        status = _run(args)
        ended = progress.OK if status == 0 else progress.FAILED
    except KeyboardInterrupt:
        # Ctrl-C: the command has cleaned up on the way out (attempts, temporary files); one line, no traceback.
        print(f"ldpbench {args.command}: interrupted", file=sys.stderr)
        status, ended = 128 + signal.SIGINT, progress.STOPPED
    except SystemExit:  # SIGTERM (ldpbench.launch.parent_watch): the workflow stopped it
        ended = progress.STOPPED
        raise
    finally:
        if job is not None:
            job.finish(ended)
    return status


# The commands the workflow's jobs run: each keeps a record for `ldpbench status` (ldpbench.progress).
WORKFLOW_STEPS = ("prepare", "features", "run-cell", "select", "aggregate", "compare", "audit-table", "scorecard",
                  "report", "tracking-init", "track", "track-report")


def _run(args) -> int:
    try:
        status = args.func(args)
    except LdpbenchError as error:
        print(f"ldpbench {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        # A file named on the command line that is missing or unreadable: one line, not a traceback.
        # (pyarrow raises FileNotFoundError(path), with the path as its only argument.)
        path = error.filename if error.filename is not None else \
            error.args[0] if isinstance(error, FileNotFoundError) and len(error.args) == 1 else None
        if path is None:
            raise
        reason = error.strerror or "No such file or directory"
        print(f"ldpbench {args.command}: error: cannot use '{path}': {reason}", file=sys.stderr)
        return 2
    return status or 0
