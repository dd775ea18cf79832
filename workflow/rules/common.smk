# All workflow Python: config validation, campaign -> run plans, paths and input functions.
import gc
import json
import os
import shlex
import sys
from pathlib import Path

from ldpbench import progress, snakemake_compat
from ldpbench.layout import CampaignLayout

# Snakemake's attributes beyond its documented API are reached through ldpbench/snakemake_compat.py
# alone; a Snakemake that lacks one fails here, naming it and its version.
snakemake_compat.check(workflow)


# `ldpbench status` reads the campaign's progress directory: that a Snakemake is building this job graph
# (from its first moments: before the imports, the validation and the grid's expansion), the workflow
# and its cells (from onstart), and the records its jobs keep (found through the environment they
# inherit). A Snakemake that inherited it is one of the workflow's own jobs (a cluster job running its
# rule), not a workflow starting. An invalid campaign gets no record: its validation fails below.
def _progress_dir(raw):
    campaign, results_dir = raw.get("campaign"), raw.get("results_dir", "results")
    if isinstance(campaign, str) and campaign and isinstance(results_dir, str) and results_dir:
        return CampaignLayout(results_dir, campaign).progress_dir
    return None


# With --configfile, the campaign is the user's files (and --config) alone, as `ldpbench validate`
# sees it: keys missing there must not be filled from config/config.yaml (the default campaign).
_campaign_config = (
    snakemake_compat.command_line_config(workflow) if snakemake_compat.config_files_given(workflow) else config
)
_STARTING = _progress_dir(_campaign_config)
if _STARTING is not None and os.environ.get(progress.PROGRESS_ENV) != str(_STARTING.resolve()):
    _STARTING = progress.Starting(_STARTING)
else:
    _STARTING = None

import yaml

from ldpbench.atomic import write_json, write_text
from ldpbench.audit import AUDIT_ENV, AuditSettings, audit_environment, memory_mib
from ldpbench.campaign import (
    DEFAULT_SCHEMA,
    LARGE_GRID_RUNS,
    campaign_cells,
    check_devices,
    count_runs,
    runnable_datasets,
    tuned_cell_runs,
    write_cell_index,
)
from ldpbench.campaign import validate_config, write_manifest
from ldpbench.data import registry as dataset_registry
from ldpbench.errors import LdpbenchError
from ldpbench.results.live import LIVE_ENV, live_environment
from ldpbench.snakemake_compat import WorkflowError, logger
from ldpbench.tuning import select_cell
from ldpbench.launch import client, fork_server
from ldpbench.layout import (
    AGGREGATE_TABLES,
    COMPARE_TABLES,
    FIGURE_PATTERNS,
    FINAL,
    RUNS_DIR,
    TRIAL,
    TUNING_TABLES,
    features_log,
    features_meta,
    prepare_log,
    prepared_meta,
)

# What the imports made (torch, pandas and the rest: hundreds of thousands of objects) lives as long as
# Snakemake. Frozen (gc.freeze: the permanent generation), no collection scans it again, the full one at
# Snakemake's exit included (benchmarks/frozen_imports.py measures that exit).
gc.freeze()

SCHEMA = DEFAULT_SCHEMA  # ldpbench/schemas/config.schema.yaml, shipped in the package

# Validate (and fill defaults) before any job is scheduled: a typo fails here, naming the key.
try:
    _validated = validate_config(_campaign_config, SCHEMA)
except LdpbenchError as error:
    if _STARTING is not None:
        _STARTING.withdraw()
    raise WorkflowError(str(error)) from None
config.clear()
config.update(_validated)

# Shell rules call `LDPBENCH_JOB=1 python -P -m ldpbench` (the marker: a job of this workflow, which
# the warm worker may run; -P: the job's directory is not put first on the path, where a folder named
# ldpbench would be imported instead). Without --use-conda, `python` is the
# interpreter running Snakemake: its directory goes first on PATH (so no activated venv is needed).
# With --use-conda, the rules' environment (workflow/envs/ldpbench.yaml) is activated in front of
# it; its post-deploy script installs ldpbench from LDPBENCH_SOURCE.
_interpreter_dir = str(Path(sys.executable).parent)
if not (Path(_interpreter_dir) / "python").exists():
    raise WorkflowError(
        f"no 'python' next to the interpreter running Snakemake ({sys.executable}): run Snakemake "
        "from a virtual environment or conda environment (see the README)"
    )
# Set here, for the jobs (not read from the user: nothing for an envvars directive to assert).
_path = os.environ.get("PATH", "")
if _path.split(os.pathsep)[0] != _interpreter_dir:
    os.environ.update(PATH=os.pathsep.join(filter(None, [_interpreter_dir, _path])))
os.environ.update(LDPBENCH_SOURCE=snakemake_compat.workflow_dir(workflow))

CAMPAIGN = config["campaign"]
LAYOUT = CampaignLayout(config["results_dir"], CAMPAIGN)
os.environ[progress.PROGRESS_ENV] = str(LAYOUT.progress_dir.resolve())  # for the jobs' records
RAW_DIR = config["data"]["raw_dir"]
PREPARED_DIR = config["data"]["prepared_dir"]
MIRROR = config["data"]["mirror"]
FEATURES_DIR = config["features"]["dir"]
FEATURES = {entry["name"]: entry["features"] for entry in config["datasets"] if entry["features"]}


def _runnable_datasets():
    """Datasets to run; optional ones whose files are not at hand are skipped with a notice."""
    runnable, skipped = runnable_datasets(config)
    for name in skipped:
        logger.warning(
            f"NOTICE: optional dataset '{name}' skipped: its files are neither in "
            f"'{RAW_DIR}/{dataset_registry.get(name).mirror_dir}' nor in the mirror (data.mirror: {MIRROR!r})."
        )
    return runnable, skipped


DATASETS, SKIPPED_DATASETS = _runnable_datasets()


def _missing_device():
    """The error of a training.device this machine lacks ('cuda' without CUDA), naming its key; else None."""
    try:
        check_devices(config)
    except LdpbenchError as error:
        return error
    return None


# Where the jobs run is known only in onstart (Snakemake sets its executor after the parse: a SLURM
# submission parses as a local run), so the parse only warns; campaign_starts refuses a local run.
MISSING_DEVICE = _missing_device()
if MISSING_DEVICE is not None:
    logger.warning(f"NOTICE: {MISSING_DEVICE}. A run whose jobs run on this machine stops before its first job.")
RUN_COUNT = count_runs(config, DATASETS)
if RUN_COUNT > LARGE_GRID_RUNS:
    logger.warning(
        f"NOTICE: campaign '{CAMPAIGN}' has {RUN_COUNT:,} runs (more than "
        f"{LARGE_GRID_RUNS:,}); building their plans takes a while."
    )


# The campaign's cells (ldpbench.campaign.Cell), fixed before any job: the tuning trials', then the final
# runs'. A tuned final cell's id is known before its trials are scored; its job's plan file is written
# once they are (rule plan), so the job graph never changes while the campaign runs.
CELLS = {cell.cell_id: cell for cell in campaign_cells(config, DATASETS)}
TRIAL_CELLS = [cell for cell in CELLS.values() if cell.phase == TRIAL]
FINAL_CELLS = [cell for cell in CELLS.values() if cell.phase == FINAL]
TUNED = bool(TRIAL_CELLS)
# Each phase's cell ids, rewritten when they change: an input of the phase's manifest, so that an edit
# adding or removing cells reruns it (and so plans the new cells) by modification time. Snakemake's own
# "set of input files changed" trigger needs its records of the last run, which are gone after
# .snakemake/ is deleted or the results are moved to another checkout: without them an added ε trained
# nothing and never reached the tables.
for _phase, _cells in ((TRIAL, TRIAL_CELLS), (FINAL, FINAL_CELLS)):
    write_cell_index(LAYOUT.cell_index(_phase), [cell.cell_id for cell in _cells])


wildcard_constraints:
    dataset="[A-Za-z0-9_.-]+",
    mechanism="[A-Za-z0-9_.-]+",
    cell_id="[0-9a-f]{16}",
    encoder="[A-Za-z0-9_.-]+",


def prepared(dataset):
    """What a run reads: the prepared dataset, or its features when the config names an encoder.

    meta.json is written last in both formats, so it stands for the whole directory.
    """
    if dataset in FEATURES:
        return {"meta": str(features_meta(FEATURES_DIR, dataset, FEATURES[dataset]))}
    return {"meta": str(prepared_meta(PREPARED_DIR, dataset))}


def cell_marker(cell):
    return str(LAYOUT.cell_marker(cell.dataset, cell.mechanism, cell.cell_id))


def final_cell_markers():
    return [cell_marker(cell) for cell in FINAL_CELLS]


def trial_cell_markers():
    return [cell_marker(cell) for cell in TRIAL_CELLS]


def parent_dir(path, sibling=None):
    """The directory of `path` (or its sibling directory `sibling`), derived from a declared file."""
    parent = Path(path).parent
    return str(parent / sibling) if sibling else str(parent)


def tuning_tables():
    """What a tuned campaign's aggregation and report read from the selection."""
    return [str(LAYOUT.table(table)) for table in TUNING_TABLES] if TUNED else []


def campaign_tables():
    """Every table the campaign writes, the aggregates first: what its views, the report and `track`,
    read. One list for both, so that neither runs before a table it shows."""
    aggregated = [str(LAYOUT.table(table)) for table in (*AGGREGATE_TABLES, *COMPARE_TABLES)]
    return aggregated + tuning_tables() + audit_table() + scorecard_table()


def selected_flag():
    return f"--selected {shlex.quote(str(LAYOUT.table('selected')))}" if TUNED else ""


def campaign_cell(cell_id):
    try:
        return CELLS[cell_id]
    except KeyError:
        raise WorkflowError(f"cell {cell_id} is not part of campaign '{CAMPAIGN}'") from None


def cell_label(cell_id):
    """The label of a cell's configuration (the campaign's `label`), which names its runs in the log."""
    cell = campaign_cell(cell_id)
    return f"{cell.label} (tuning trials)" if cell.phase == TRIAL else cell.label


def plan_inputs(wildcards):
    """A tuned final cell's plan is written from its trials' scores: it waits for their cell. Its id hashes
    the trials, so the trial cell's marker never changes content (ancient: a rewrite reruns nothing)."""
    cell = campaign_cell(wildcards.cell_id)
    return {"trials": ancient(cell_marker(CELLS[cell.trial_cell]))} if cell.tuned else {}


def write_cell_plan(cell_id, path):
    """A cell's plan file, which its run-cell job reads: its id, phase and runs (for a tuned final cell,
    those of the setting its trials select, with the selection). A file, not a command-line argument:
    a cell of a few hundred runs exceeds Linux's 128 KiB limit on one argument."""
    cell = campaign_cell(cell_id)
    selected = None
    runs = list(cell.runs)
    if cell.tuned:
        point, selected = select_cell(list(CELLS[cell.trial_cell].runs), str(LAYOUT.runs_dir))
        runs = tuned_cell_runs(config, cell, point)
    write_json(
        path,
        {
            "campaign": CAMPAIGN,
            "cell_id": cell.cell_id,
            "phase": cell.phase,
            "dataset": cell.dataset,
            "mechanism": cell.mechanism,
            "label": cell.label,
            "runs": runs,
            "selected": selected,
        },
    )


def fetch_flags():
    """Where official files (and weights) are looked up: raw dir, mirror, download."""
    flags = [f"--raw-dir {shlex.quote(RAW_DIR)}"]
    if MIRROR:
        flags.append(f"--mirror {shlex.quote(MIRROR)}")
    if config["data"]["allow_download"]:
        flags.append("--allow-download")
    return flags


def prepare_flags():
    flags = fetch_flags()
    for key, digest in sorted(config["data"]["checksums"].items()):
        flags.append(f"--sha256 {shlex.quote(f'{key}={digest}')}")
    return " ".join(flags)


def features_flags(wildcards):
    settings = config["features"]
    flags = [*fetch_flags(), f"--device {shlex.quote(settings['device'])}", f"--batch-size {settings['batch_size']}"]
    weights = settings["weights"].get(wildcards.encoder)
    if weights:
        flags.append(f"--weights {shlex.quote(weights)}")
    return " ".join(flags)


def save_manifest(path, plan_files, phase):
    """A phase's manifest (trials.json, manifest.json): the runs of its cells' plan files."""
    runs = [run for plan_file in plan_files for run in json.loads(Path(plan_file).read_text())["runs"]]
    write_manifest(path, CAMPAIGN, phase, runs, SKIPPED_DATASETS)


def final_plans():
    return [str(LAYOUT.plan(cell.cell_id)) for cell in FINAL_CELLS]


def trial_plans():
    return [str(LAYOUT.plan(cell.cell_id)) for cell in TRIAL_CELLS]


def save_campaign_file(path):
    """The resolved configuration, as YAML: what ran, whatever files and --config produced it."""
    sources = ", ".join(map(str, snakemake_compat.config_files(workflow))) or "no config file"
    plain = json.loads(json.dumps(config, default=str))  # what YAML can write (paths as text)
    body = yaml.safe_dump(plain, sort_keys=False, allow_unicode=True)
    write_text(path, f"# The campaign as it ran: {sources}, --config and the defaults.\n{body}")


def dataset_track_args():
    """track's --dataset options: each dataset and the meta.json its runs read."""
    return " ".join(f"--dataset {shlex.quote(f'{name}={meta}')}" for name, meta in dataset_metas().items())


def dataset_metas():
    """Each dataset of the campaign and the meta.json of what its runs read (MLflow logs it as an input)."""
    return {dataset: prepared(dataset)["meta"] for dataset in DATASETS}


AUDIT = config["audit"]
AUDIT_SETTINGS = AuditSettings.from_config(AUDIT)


def audit_flags():
    flags = [f"--{key.replace('_', '-')} {AUDIT[key]}" for key in ("samples", "dims", "alpha", "random_pairs", "seed")]
    if AUDIT["on_defect"] == "warn":
        flags.append("--warn")
    return " ".join(flags)


def cell_memory_mb():
    """What a cell's job declares: a cell's runs take up to 2 GB; a final cell's audit (ldpbench.audit) may
    take more, after them."""
    audit_mb = round(memory_mib(AUDIT["samples"]) * 2**20 / 1e6) if AUDIT["enabled"] else 0
    return max(2000, audit_mb)


def audit_table():
    """The campaign's audit table, which the report shows, when the audit is enabled."""
    return [str(LAYOUT.table("audit"))] if AUDIT["enabled"] else []


def audit_table_flag():
    return f"--audit {shlex.quote(audit_table()[0])}" if AUDIT["enabled"] else ""


# The final cells' jobs audit what they ran (ldpbench.audit.cached_audits) with the settings they find in
# their environment, so that a change of the settings reruns no cell (the audit_table job computes what it
# leaves missing).
if AUDIT["enabled"]:
    os.environ[AUDIT_ENV] = audit_environment(AUDIT_SETTINGS, LAYOUT.audits_dir)
else:
    os.environ.pop(AUDIT_ENV, None)


def scorecard_table():
    """The campaign's scorecard, which the report shows, when it names paper claims."""
    return [str(LAYOUT.table("scorecard"))] if config["scorecard"]["claims"] else []


def scorecard_flag():
    return f"--scorecard {shlex.quote(scorecard_table()[0])}" if scorecard_table() else ""


def tracking_experiment():
    return config["tracking"]["experiment"] or f"ldpbench/{CAMPAIGN}"


def tracking_store_after(tables):
    """What the tracking_store step waits for. A tracking server: nothing (runs stream into its
    experiment while they train, and a server that is away fails the campaign at its start). A
    SQLite store, which only `track` writes: the aggregated tables, so that MLflow's schema (seconds
    of migrations) is built beside the report on a core the serial tail leaves idle, not taken from
    the runs at the start. ancient(): a new aggregation does not redo the store. It flags a copy of each
    path: Snakemake's flags are set on the string they are given, and `tables` are the aggregate rule's
    own output files, which compare, report and track read too (flagged, a new aggregation would not
    rerun them)."""
    if config["tracking"]["uri"].startswith(("http://", "https://")):
        return []
    return [ancient(str(path)) for path in tables]


def live_tracking():
    """Whether runs stream their rounds to a tracking server while they train (tracking.live)."""
    tracking = config["tracking"]
    return tracking["enabled"] and tracking["live"] and tracking["uri"].startswith(("http://", "https://"))


# The jobs learn where to stream from the environment they inherit (local, worker or SLURM), not
# from their command line: switching the server on or off must not rerun finished cells.
if live_tracking():
    os.environ[LIVE_ENV] = live_environment(config["tracking"]["uri"], tracking_experiment(), CAMPAIGN)
else:
    os.environ.pop(LIVE_ENV, None)


def final_targets():
    targets = [LAYOUT.table("summary"), LAYOUT.report()]
    if config["tracking"]["enabled"]:
        targets += [LAYOUT.tracking_marker, LAYOUT.tracking_report_marker]
    return [str(target) for target in targets]


def campaign_starts(log):
    """Snakemake's onstart (no dry run): a local run refuses a training.device this machine lacks, and
    runs without Snakemake's job rate limit (whose timed wake-ups cost CPU and protect nothing locally;
    ldpbench/snakemake_compat.py), with the warm worker and the workflow's record for `ldpbench status`."""
    if MISSING_DEVICE is not None and snakemake_compat.jobs_run_here(workflow):
        if _STARTING is not None:
            _STARTING.withdraw()
        raise WorkflowError(str(MISSING_DEVICE))
    snakemake_compat.switch_off_local_rate_limit(workflow)
    progress.workflow_begins(LAYOUT.progress_dir, list(CELLS.values()), log)
    start_worker()


def campaign_ends(ok, log):
    """Snakemake's onsuccess (`ok`) or onerror."""
    stop_worker()
    progress.workflow_ends(LAYOUT.progress_dir, ok, log)


# What the workflow sets in its environment for its jobs alone (their records, the audit's settings, live
# tracking), which each job's command carries to the worker: the worker, which only imports, starts
# without them, and so does not key its seed by the campaign (fork_server.seed_key).
JOBS_ONLY_VARIABLES = (progress.PROGRESS_ENV, AUDIT_ENV, LIVE_ENV)
# The jobs hand their commands only to a worker of this campaign (start_worker names it), never to
# one named in the environment Snakemake inherited.
os.environ.pop(client.SOCKET_ENV, None)
_WORKER = {}


def start_worker():
    """The campaign's warm process (ldpbench/launch/fork_server.py), for a local run; jobs find it through
    $LDPBENCH_WORKER and start as fresh processes without it."""
    if not config["worker"]["enabled"] or not snakemake_compat.jobs_run_here(workflow):
        return
    started = fork_server.start(
        os.getpid(),
        LAYOUT.log("worker"),
        tracking=config["tracking"]["enabled"],
        linger=config["worker"]["linger_seconds"],
        jobs_only=JOBS_ONLY_VARIABLES,
    )
    if started is None:
        log = LAYOUT.log("worker")
        logger.warning(f"NOTICE: the warm worker did not start (see {log}); each job imports ldpbench itself.")
        return
    _WORKER["process"], _WORKER["socket"] = started
    os.environ[client.SOCKET_ENV] = str(_WORKER["socket"])


def stop_worker():
    if _WORKER:
        os.environ.pop(client.SOCKET_ENV, None)
        fork_server.stop(_WORKER.pop("process"), _WORKER.pop("socket"))
